"""Errors that the CLI turns into a one-line message and exit status 2 (bad input)."""


class InputError(Exception):
    """Bad input: a spec, an argument or a file. The message names the file, the key and what was
    expected, and fits on one line."""
