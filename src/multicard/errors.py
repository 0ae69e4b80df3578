"""Bad input, told in one line with exit status 2: the error the CLI turns into that line, and the
argument parser the CLI and a node's part of a trial (run.node_step) read their arguments with."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class InputError(Exception):
    """Bad input: a spec, an argument or a file. The message names the file, the key and what was
    expected, and fits on one line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error on one line (exit 2) instead of usage + message, and
    takes no abbreviations (`--node-rank` must not be read as `--node-rank-env`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")
