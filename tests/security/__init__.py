"""Security properties and bad input on every surface; path confinement (specui/paths.py)."""
