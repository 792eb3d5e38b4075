"""``--operator-port`` on train, rollout and serve (no model loaded)."""

from __future__ import annotations

import argparse

import pytest

from relaxtrio.cli.tool_flags import add_serve_parser, serve_config
from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.cli.main import main


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    add_train_parser(sub)
    add_train_parser(sub, name="rollout")
    add_serve_parser(sub)
    return parser.parse_args(argv)


def test_operator_port_is_off_unless_asked_for() -> None:
    assert train_config(_parse(["train"])).operator_port is None
    assert serve_config(_parse(["serve"])).operator_port is None
    assert train_config(_parse(["train", "--operator-port", "0"])).operator_port == 0
    assert train_config(_parse(["rollout", "--operator-port", "8123"])).operator_port == 8123
    assert serve_config(_parse(["serve", "--operator-port", "8124"])).operator_port == 8124


@pytest.mark.parametrize("command", ["train", "rollout", "serve"])
def test_an_operator_port_out_of_range_exits_2(command: str, caplog: pytest.LogCaptureFixture) -> None:
    assert main([command, "--operator-port", "70000"]) == 2
    assert "--operator-port must be in [0, 65535]" in caplog.text
