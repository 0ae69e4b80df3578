"""`multicard --help` and every subcommand's: a version, examples, and help for every argument."""

from __future__ import annotations

import argparse

import pytest

from multicard import __version__, cli


def subparsers(parser: argparse.ArgumentParser,
               path: str = "multicard") -> list[tuple[str, argparse.ArgumentParser]]:
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += subparsers(sub, f"{path} {name}")
    return found


def test_every_argument_of_every_command_has_help() -> None:
    missing = [f"{path}: {'/'.join(a.option_strings) or a.dest}"
               for path, parser in subparsers(cli.build_parser()) for a in parser._actions
               if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction) and not a.help]
    assert missing == []


def test_the_top_level_help_has_examples_and_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert "examples:" in parser.format_help() and "multicard list" in parser.format_help()
    try:
        parser.parse_args(["--version"])
    except SystemExit as done:
        assert done.code == 0
    assert capsys.readouterr().out.strip() == f"multicard {__version__}"
