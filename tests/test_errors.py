"""The error hierarchy carries data: fields survive re-reporting, flags get their own names, and the
command line's exit status follows the error type."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from relaxtrio import (
    BackendError,
    BackendTimeoutError,
    ConfigError,
    EngineRejectedError,
    EngineUnavailableError,
    ExportError,
    InvalidRequestError,
    RelaxError,
)
from relaxtrio._validate import require_list, require_object, require_positive_int, require_real
from relaxtrio.cli.main import main


def test_at_keeps_the_problem_so_the_error_can_move_to_another_path() -> None:
    error = InvalidRequestError.at("messages[2].content", "must not be empty", session_id="s")
    assert (error.message, error.param, error.problem) == (
        "messages[2].content must not be empty", "messages[2].content", "must not be empty")
    moved = error.at_param("input[5].content")
    assert str(moved) == "input[5].content must not be empty" and moved.param == "input[5].content"
    assert type(moved) is InvalidRequestError and moved.session_id == "s"
    assert str(error) == "messages[2].content must not be empty"  # the original is unchanged
    deep = InvalidRequestError.at("messages[0].tool_calls[0].function.arguments", "numbers must be finite",
                                  subpath=".a")
    assert str(deep) == "messages[0].tool_calls[0].function.arguments.a numbers must be finite"
    assert str(deep.at_param("input[1].arguments")) == "input[1].arguments.a numbers must be finite"


def test_at_param_keeps_the_message_of_an_error_built_without_at() -> None:
    error = InvalidRequestError("messages[0] must include role", param="messages[0].role")
    moved = error.at_param("input[0].role")
    assert str(moved) == "messages[0] must include role" and moved.param == "input[0].role"


def test_engine_errors_say_whose_fault_it_is_by_type() -> None:
    unavailable = EngineUnavailableError("down", engine_url="http://e", status_code=502)
    rejected = EngineRejectedError("no", engine_url="http://e", status_code=400)
    assert isinstance(unavailable, BackendError) and isinstance(rejected, BackendError)
    assert not isinstance(rejected, EngineUnavailableError)
    assert issubclass(BackendTimeoutError, EngineUnavailableError)
    assert (rejected.engine_url, rejected.status_code) == ("http://e", 400)
    assert rejected.at_param("x").status_code == 400  # fields survive a move
    assert EngineUnavailableError("bad body").status_code is None


def test_config_error_is_not_a_request_error() -> None:
    error = ConfigError.at("micro_batch_size", "must be a positive integer, got 0")
    assert isinstance(error, ValueError) and isinstance(error, RelaxError)
    assert not isinstance(error, InvalidRequestError)
    assert ExportError("x", num_leaves=2).num_leaves == 2 and ExportError("x").num_leaves is None


@pytest.mark.parametrize(
    ("check", "value", "message"),
    [
        (require_object, [1], "f must be an object, got array"),
        (require_object, None, "f must be an object, got null"),
        (require_list, {"a": 1}, "f must be a list, got object"),
        (require_real, True, "f must be a finite number, got boolean"),
        (require_real, float("nan"), "f must be a finite number, got nan"),
        (require_real, 10**400, "f must be a finite number, got 1"),
        (require_positive_int, 0, "f must be a positive integer, got 0"),
        (require_positive_int, 2.0, "f must be a positive integer, got 2.0"),
    ],
)
def test_one_wording_for_every_check(check, value, message: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check(value, "f")
    assert str(caught.value).startswith(message) and caught.value.param == "f"
    with pytest.raises(ConfigError):
        check(value, "f", error=ConfigError)
    with pytest.raises(ValueError, match="^f must be"):
        check(value, "f", error=ValueError)


def test_optional_checks_pass_null_through() -> None:
    assert require_object(None, "f", optional=True) is None
    assert require_positive_int(None, "f", optional=True) is None
    assert require_real(3, "f") == 3.0 and require_positive_int(3, "f") == 3
    assert require_object({"a": 1}, "f") == {"a": 1} and require_list((1,), "f") == (1,)


def test_a_bad_trainer_flag_exits_2_naming_the_flag(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    assert main(["train", "--lr", "0"]) == 2
    assert "--lr must be a finite number > 0, got 0" in caplog.text


def test_a_bad_prompt_row_exits_2(tiny_model_dir: Path, tmp_path: Path,
                                  caplog: pytest.LogCaptureFixture) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"input": "fine"}) + "\n[1, 2]\n")
    caplog.set_level(logging.ERROR)
    code = main(["train", "--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data),
                 "--output-dir", str(tmp_path / "run")])
    assert code == 2
    assert f"{data}:2: each line must be a JSON object" in caplog.text
