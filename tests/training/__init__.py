"""The training loop, its config and the train command (specui/training/)."""
