"""``train --help`` groups its flags, and the regrouping kept every flag as it was.

``data/train_flags.json`` is every ``train`` and ``rollout`` flag (option strings, dest, default,
help, type, choices, nargs, metavar, action), first written from the parser before the flags were
put into groups. A flag added, renamed, dropped, or given another default, help or choices fails
here until the same commit rewrites the file (``python -m tests.cli.test_cli_train_flag_groups``),
so every change to the command line's surface is a deliberate one that shows in the diff.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from relaxtrio.cli import train_flags
from relaxtrio.cli.train_flags import TRAIN_FLAG_GROUPS, add_train_parser

REPO = Path(train_flags.__file__).resolve().parents[2]
BEFORE = json.loads((Path(__file__).parent / "data" / "train_flags.json").read_text(encoding="utf-8"))


def _portable(value: Any) -> Any:
    """A default as the data file writes it: repository paths relative, this interpreter named."""
    if isinstance(value, Path):
        try:
            return "<repo>/" + value.relative_to(REPO).as_posix()
        except ValueError:
            return str(value)
    if isinstance(value, str):
        return value.replace(shlex.quote(sys.executable), "<python>")
    if isinstance(value, list | tuple):
        return [_portable(v) for v in value]
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    return value


def _describe(action: argparse.Action) -> dict[str, Any]:
    return {"option_strings": action.option_strings, "dest": action.dest,
            "default": _portable(action.default), "help": action.help, "nargs": action.nargs,
            "const": _portable(action.const),
            "choices": list(action.choices) if action.choices is not None else None,
            "metavar": action.metavar, "required": action.required, "action": type(action).__name__,
            "type": getattr(action.type, "__qualname__", None) if action.type else None}


def _parser(name: str) -> argparse.ArgumentParser:
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    return add_train_parser(sub, name=name)


def _flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, Any]]:
    return {a.dest: _describe(a) for a in parser._actions if not isinstance(a, argparse._HelpAction)}


@pytest.mark.parametrize("name", ["train", "rollout"])
def test_every_flag_keeps_its_name_default_and_help(name: str) -> None:
    before = {f["dest"]: f for f in BEFORE[name]}
    now = _flags(_parser(name))
    assert sorted(now) == sorted(before), "flags added or removed"
    changed = {dest: (before[dest], now[dest]) for dest in before if before[dest] != now[dest]}
    assert not changed


def test_rollout_is_train_without_training() -> None:
    parser = _parser("rollout")
    assert {k: _portable(v) for k, v in parser._defaults.items()} == BEFORE["rollout_defaults"]
    assert parser.parse_args([]).debug_rollout_only is True
    assert _parser("train").parse_args([]).debug_rollout_only is False


@pytest.mark.parametrize("name", ["train", "rollout"])
def test_flags_sit_in_the_named_groups_in_order(name: str) -> None:
    parser = _parser(name)
    titled = [g for g in parser._action_groups if g.title in TRAIN_FLAG_GROUPS]
    assert [g.title for g in titled] == list(TRAIN_FLAG_GROUPS)
    assert all(g._group_actions for g in titled), "an empty group"
    grouped = {a.dest for g in titled for a in g._group_actions}
    assert grouped == set(_flags(parser)), "a flag outside the named groups"


def test_help_shows_the_groups_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser("train").parse_args(["--help"])
    text = capsys.readouterr().out
    positions = [text.index(f"\n{title}:\n") for title in TRAIN_FLAG_GROUPS]
    assert positions == sorted(positions)
    assert "--agentic-custom-advantage-path" in text[positions[4]:positions[5]]  # algorithm
    assert "--save-interval" in text[positions[6]:positions[7]]  # checkpoints


def _write_snapshot() -> None:
    """Rewrites ``data/train_flags.json`` from the current parsers."""
    data: dict[str, Any] = {name: sorted(_flags(_parser(name)).values(), key=lambda f: f["dest"])
                            for name in ("train", "rollout")}
    data["rollout_defaults"] = {k: _portable(v) for k, v in _parser("rollout")._defaults.items()}
    path = Path(__file__).parent / "data" / "train_flags.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    _write_snapshot()
