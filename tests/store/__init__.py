"""The SQLite store (specui/store/)."""
