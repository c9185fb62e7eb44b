"""Errors a user can cause.  Torch-free, so the store, workers and CLI import it cheaply."""


class SpecUIError(Exception):
    """An error a user can cause (bad input, mismatched files); shown as one line."""
