"""The algorithm packages (specui/algorithms/): drafters, the speculators format, n-gram."""
