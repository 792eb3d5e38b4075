"""Command-line flags of rollout, serve and replay, and the train flags for dumps (no model loaded)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def test_rollout_and_debug_rollout_only_run_without_training(tmp_path: Path) -> None:
    assert train_config(_parse(["rollout"])).rollout_only
    assert train_config(_parse(["rollout", "--agentic-export-policy", "final"])).agent.export_policy == "final"
    config = train_config(_parse(["train", "--debug-rollout-only", "--output-dir", str(tmp_path)]))
    assert config.rollout_only and config.rollout_samples_path == tmp_path / "rollout_samples.jsonl"
    plain = train_config(_parse(["train", "--save-debug-rollout-data", "d/r_{rollout_id}.json"]))
    assert not plain.rollout_only and plain.debug_rollout_data == "d/r_{rollout_id}.json"


def test_a_dump_path_without_rollout_id_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["train", "--save-debug-rollout-data", "dump.json"]) == 2
    assert "must contain {rollout_id}" in caplog.text


def test_serve_flags(tmp_path: Path) -> None:
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    config = serve_config(_parse(["serve", "--sessions", "3", "--input", str(task),
                                  "--output-dir", str(tmp_path), "--rollout-temperature", "0.5"]))
    assert config.num_sessions == 3 and config.input_path == task
    assert config.generation.temperature == 0.5
    assert config.dump_file == tmp_path / "serve_dump.json"
    assert serve_config(_parse(["serve", "--agentic-export-policy", "final"])).export_policy == "final"
    dumped = serve_config(_parse(["serve", "--save-debug-rollout-data", str(tmp_path / "x_{rollout_id}.json")]))
    assert dumped.dump_file == tmp_path / "x_serve.json"


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--sessions", "0"], "--sessions must be >= 1"),
    (["rollout", "--save", "/nonexistent/ckpt"], "a rollout-only run trains nothing to checkpoint"),
    (["serve", "--input", "/nonexistent/task.json"], "is not a readable file"),
    (["serve", "--save-debug-rollout-data", "dump.json"], "must contain {rollout_id}"),
    (["replay", "/nonexistent/dump.json", "--checkpoint", "/nonexistent"], "is not a readable file"),
])
def test_bad_tool_flags_exit_2(argv: list[str], message: str, caplog: pytest.LogCaptureFixture) -> None:
    assert main(argv) == 2
    assert message in caplog.text


def test_replay_refuses_a_file_that_is_not_a_dump(tmp_path: Path, tiny_model_dir: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    bogus = tmp_path / "bogus.json"
    bogus.write_text("[]")
    assert main(["replay", str(bogus), "--checkpoint", str(tiny_model_dir)]) == 2
    assert "is not a relaxtrio dump" in caplog.text


@pytest.mark.parametrize("command", ["doctor", "serve"])
def test_help_says_what_input_holds(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--input`` is written as-is as RELAX_INPUT_JSON: the help names that shape, and that a
    dataset row is not it (training turns the row's --input-key field into ``messages``)."""
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert 'written as-is as the agent\'s RELAX_INPUT_JSON' in text
    assert '{"messages": [...], "metadata": {...}}, not the dataset row itself' in text
    if command == "doctor":
        assert "--agent-cwd AGENT_CWD directory the agent command runs in" in text


@pytest.mark.parametrize("command", ["doctor", "serve"])
def test_an_input_without_messages_is_refused_as_a_dataset_row(
    command: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    row = tmp_path / "row.json"
    row.write_text(json.dumps({"input": "What is 2 + 2?", "metadata": {"answer": "4"}}))
    extra = ["--agent-cwd", str(tmp_path), "--agent-command", "true"] if command == "doctor" else []
    assert main([command, "--input", str(row), *extra]) == 2
    assert 'has no "messages" list' in caplog.text and "not a dataset row (keys here: input, metadata)" in caplog.text
