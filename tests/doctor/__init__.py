"""The speculator doctor (specui/doctor/)."""
