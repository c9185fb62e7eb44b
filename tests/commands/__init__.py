"""The command line (specui/commands/)."""
