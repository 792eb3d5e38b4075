"""``python -m relaxtrio compare``: two synthetic runs' metrics.jsonl overlaid, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from relaxtrio.cli.main import main
from relaxtrio.tools.compare import compare_table, load_run, load_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    grpo = _run(tmp_path / "grpo", [
        {"step": 0, "reward_mean": 0.25, "step_s": 10.0},
        {"step": 1, "reward_mean": 0.5, "step_s": 12.0, "eval/quiz/reward_mean": 0.4},
        {"step": 2, "reward_mean": 0.75, "step_s": 14.0, "eval/quiz/reward_mean": 0.6},
    ])
    rloo = _run(tmp_path / "rloo", [
        {"step": 0, "reward_mean": 0.5, "step_s": 20.0},
        {"step": 1, "reward_mean": None, "step_s": 22.0},  # NaN written as null: a gap
    ])
    return grpo, rloo


def test_compare_prints_a_table_and_writes_the_png(two_runs, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plots" / "cmp.png"
    assert main(["compare", str(two_runs[0]), str(two_runs[1]), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("  ")[0] == "run" and "eval quiz last" in lines[0]
    assert lines[1].split() == ["grpo", "3", "0.250", "0.750", "0.750", "12.00", "0.600"]
    assert lines[2].split() == ["rloo", "2", "0.500", "0.500", "0.500", "21.00", "-"]
    assert lines[3] == f"plot: {out}"


def test_curves_keep_every_step_and_gaps(two_runs) -> None:
    grpo = load_run(two_runs[0])
    assert grpo.steps == (0, 1, 2) and grpo.reward == (0.25, 0.5, 0.75)
    assert math.isnan(grpo.evals["quiz"][0]) and grpo.evals["quiz"][1:] == (0.4, 0.6)
    rloo = load_run(two_runs[1] / "metrics.jsonl")  # the file itself works too
    assert rloo.label == "rloo" and math.isnan(rloo.reward[1]) and rloo.evals == {}


def test_same_named_runs_are_told_apart_by_path(tmp_path: Path) -> None:
    a = _run(tmp_path / "a" / "run", [{"step": 0, "reward_mean": 1.0}])
    b = _run(tmp_path / "b" / "run", [{"step": 0, "reward_mean": 0.0}])
    runs = load_runs([a, b])
    assert [r.label for r in runs] == [str(a), str(b)]
    assert compare_table(runs)[1].startswith(str(a))


@pytest.mark.parametrize(("setup", "message"), [
    (lambda t: [t / "missing", t / "missing2"], "does not exist"),
    (lambda t: [_run(t / "x", [{"step": 0}]), t / "x" / "nested"], "does not exist"),
    (lambda t: [t, _run(t / "y", [{"step": 0}])], "has no metrics.jsonl"),
    (lambda t: [_run(t / "e", []), _run(t / "f", [{"step": 0}])], "has no metrics rows"),
    (lambda t: [_run(t / "g", [{"no_step": 1}]), _run(t / "h", [{"step": 0}])], "no integer 'step'"),
    (lambda t: [_run(t / "one", [{"step": 0}])], "at least two runs"),
])
def test_bad_input_exits_2_naming_the_problem(setup, message, tmp_path: Path, caplog) -> None:
    runs = setup(tmp_path)
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "c.png")]) == 2
    assert message in caplog.text
    assert not (tmp_path / "c.png").exists()


def test_a_line_that_is_not_json_is_named_by_line(tmp_path: Path, caplog) -> None:
    bad = _run(tmp_path / "bad", [{"step": 0}])
    with (bad / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write("{truncated\n")
    good = _run(tmp_path / "good", [{"step": 0}])
    assert main(["compare", str(bad), str(good), "--out", str(tmp_path / "c.png")]) == 2
    assert f"{bad / 'metrics.jsonl'}:2: not JSON" in caplog.text


def test_a_live_runs_unfinished_last_line_is_left_out_with_a_note(tmp_path: Path, capsys, caplog) -> None:
    live = _run(tmp_path / "live", [{"step": 0, "reward_mean": 0.5}])
    with (live / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"reward_mean": 0.7, "st')  # the run is appending step 1
    done = _run(tmp_path / "done", [{"step": 0, "reward_mean": 0.25}])
    assert main(["compare", str(live), str(done), "--out", str(tmp_path / "c.png")]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["live", "1"]
    assert f"{live / 'metrics.jsonl'}:2: left out a last line without its newline" in caplog.text
    assert load_run(live).steps == (0,)


def test_a_bad_line_before_the_last_is_still_an_error(tmp_path: Path, caplog) -> None:
    bad = _run(tmp_path / "bad", [{"step": 0}])
    with (bad / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write('{"st\n{"step": 2}')  # a corrupt row, then a complete last row without its newline
    good = _run(tmp_path / "good", [{"step": 0}])
    assert main(["compare", str(bad), str(good), "--out", str(tmp_path / "c.png")]) == 2
    assert f"{bad / 'metrics.jsonl'}:2: not JSON" in caplog.text
    (bad / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}')  # complete, newline not written yet
    assert load_run(bad).steps == (0, 1)


@pytest.mark.parametrize("out", ["{tmp}", "{tmp}/noext", "{tmp}/c.weird"])
def test_an_out_path_that_is_not_a_png_file_exits_2(two_runs, tmp_path: Path, out: str, caplog) -> None:
    assert main(["compare", str(two_runs[0]), str(two_runs[1]), "--out", out.format(tmp=tmp_path)]) == 2
    assert "a path ending in .png" in caplog.text
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.weird"))


def test_bytes_that_are_not_utf8_are_a_live_last_line_or_an_error(tmp_path: Path, caplog) -> None:
    live = _run(tmp_path / "live", [{"step": 0}])
    with (live / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 1, "note": "caf\xc3')  # cut inside a two-byte character
    assert load_run(live).steps == (0,)
    assert "left out a last line without its newline" in caplog.text
    bad = tmp_path / "bad" / "metrics.jsonl"
    bad.parent.mkdir()
    bad.write_bytes(b'\xff\xfe{"step": 0}\n{"step": 1}\n')
    good = _run(tmp_path / "good", [{"step": 0}])
    assert main(["compare", str(bad.parent), str(good), "--out", str(tmp_path / "c.png")]) == 2
    assert f"{bad}:1: not JSON (not UTF-8)" in caplog.text
