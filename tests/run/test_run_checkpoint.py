"""Run checkpoints: layout, the latest pointer, crash safety, pruning, RNG and trainer state."""

from __future__ import annotations

import errno
import json
import logging
import random
import shutil
from pathlib import Path

import numpy
import pytest
import torch
from tests.train.train_helpers import make_samples

from relaxtrio import ConfigError
from relaxtrio.config import AgentConfig, TrainRunConfig
from relaxtrio.rollout.dataset import Prompt, PromptStream
from relaxtrio.rollout.resume import capture_rollout
from relaxtrio.run.checkpoint import (
    FULL_DISK_BYTES,
    ResumePoint,
    RunCheckpointer,
    _model_identity,
    _sha256,
    _write_failure,
    find_resume_point,
)
from relaxtrio.testing.scored import scored_samples
from relaxtrio.train import TrainConfig, Trainer
from relaxtrio.train.checkpoint import (
    LATEST_FILE,
    OPTIMIZER_FILE,
    RUN_STATE_FILE,
    capture_rng_state,
    find_run_checkpoint,
    read_run_state,
    restore_rng_state,
    save_run_checkpoint,
)


def _save(trainer: Trainer, save_dir: Path, steps: int, **kwargs: object) -> Path:
    return save_run_checkpoint(
        save_dir, steps, trainer.model,
        optimizer_state={"optimizer": trainer.optimizer.state_dict(),
                         "num_optimizer_steps": trainer.num_optimizer_steps},
        state={"trainer": trainer.resume_state(), "note": f"after {steps}"}, **kwargs)


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_layout_pointer_and_pruning(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3))
    save_dir = tmp_path / "ckpt"
    for steps in (1, 2, 3):
        path = _save(trainer, save_dir, steps)
        assert path == save_dir / f"iter_{steps:07d}"
        assert (save_dir / LATEST_FILE).read_text() == f"iter_{steps:07d}\n"
    # The newest two are kept; no temporary or trash directory is left behind.
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000002", "iter_0000003", LATEST_FILE]
    assert {p.name for p in path.iterdir()} >= {"model.safetensors", "config.json", OPTIMIZER_FILE,
                                                 RUN_STATE_FILE}
    assert find_run_checkpoint(save_dir) == path
    assert find_run_checkpoint(path) == path  # a checkpoint directory itself
    assert find_run_checkpoint(tmp_path / "nothing-here") is None
    state = read_run_state(path)
    assert state["steps_done"] == 3 and state["note"] == "after 3" and state["format"] == 1
    assert set(state["rng"]) >= {"python", "torch", "numpy"}
    # Saving the same step again (a resumed run) replaces it as a whole.
    again = _save(trainer, save_dir, 3, keep=1)
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000003", LATEST_FILE]
    assert read_run_state(again)["steps_done"] == 3


def test_a_failed_write_leaves_the_previous_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3))
    save_dir = tmp_path / "ckpt"
    first = _save(trainer, save_dir, 1)
    before = sorted(p.name for p in first.iterdir())
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="holds no tokenizer files"):
        _save(trainer, save_dir, 2, tokenizer_dir=empty)  # fails after the weights were written
    with pytest.raises(TypeError):
        save_run_checkpoint(save_dir, 2, trainer.model, optimizer_state={}, state={"x": object()})
    assert sorted(p.name for p in save_dir.iterdir()) == ["iter_0000001", LATEST_FILE]
    assert sorted(p.name for p in first.iterdir()) == before
    assert find_run_checkpoint(save_dir) == first


def test_crash_leftovers_are_ignored_and_a_dangling_pointer_falls_back(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3))
    save_dir = tmp_path / "ckpt"
    _save(trainer, save_dir, 1)
    second = _save(trainer, save_dir, 2)
    # A write killed before its rename: a temporary directory with partial files (even a state
    # file), and a later iter directory without a state file.
    partial = save_dir / ".iter_0000003.tmp-crashed"
    partial.mkdir()
    (partial / RUN_STATE_FILE).write_text("{")
    (save_dir / "iter_0000004").mkdir()
    assert find_run_checkpoint(save_dir) == second
    # Killed between the rename and the pointer update, or the pointer lost.
    (save_dir / LATEST_FILE).write_text("iter_0000009\n")
    assert find_run_checkpoint(save_dir) == second
    (save_dir / LATEST_FILE).unlink()
    assert find_run_checkpoint(save_dir) == second
    # A pointer write killed before its rename leaves a temporary file.
    stale_pointer = save_dir / f".{LATEST_FILE}.tmp-crashed"
    stale_pointer.write_text("iter_0000002\n")
    # The next successful write removes the temporaries.
    _save(trainer, save_dir, 3)
    assert not partial.exists() and not stale_pointer.exists()


def _resume_trainer(tmp_path: Path, load: Path, model_dir: Path) -> Trainer:
    run = TrainRunConfig(prompt_data=tmp_path / "p.jsonl", agent=AgentConfig(command="true", cwd=tmp_path),
                         train=TrainConfig(lr=1e-3), load_dir=load, output_dir=tmp_path / "out")
    checkpointer = RunCheckpointer.open(run)
    assert checkpointer.resume is not None
    trainer = checkpointer.load_trainer(model_dir)
    assert isinstance(trainer, Trainer)
    return trainer


@pytest.mark.parametrize("damage", ["remove optimizer", "truncate optimizer", "truncate weights",
                                    "remove config", "truncate state"])
def test_a_damaged_checkpoint_is_refused_naming_it_and_the_earlier_one(
    tiny_model_dir: Path, tmp_path: Path, damage: str
) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3))
    save_dir = tmp_path / "ckpt"
    earlier = _save(trainer, save_dir, 1)
    latest = _save(trainer, save_dir, 2)
    verb, what = damage.split()
    target = latest / {"optimizer": OPTIMIZER_FILE, "weights": "model.safetensors",
                       "config": "config.json", "state": RUN_STATE_FILE}[what]
    if verb == "remove":
        target.unlink()
    else:
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with pytest.raises(ConfigError) as info:
        _resume_trainer(tmp_path, save_dir, tiny_model_dir)
    message = str(info.value)
    assert info.value.param == "load"
    assert message.startswith(f"--load: the checkpoint {latest} cannot be read (")
    assert f"an earlier complete checkpoint is {earlier}: pass --load {earlier}" in message
    assert _resume_trainer(tmp_path, earlier, tiny_model_dir).num_optimizer_steps == 0  # it loads


def test_a_checkpoint_write_that_fails_says_why_and_what_is_intact(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    full = OSError(errno.ENOSPC, "No space left on device")
    assert _write_failure(save_dir, 1, full).endswith("; no earlier checkpoint is in that directory")
    _save(Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3)), save_dir, 2)
    message = _write_failure(save_dir, 2, full)
    assert message.startswith(f"the checkpoint after step 2 could not be written to {save_dir}: "
                              "OSError: [Errno 28] No space left on device (")
    assert "MB free there: the disk is full)" in message
    assert message.endswith(f"; the previous checkpoint iter_0000002 is intact: free space and "
                            f"resume from it with --load {save_dir}")
    other = _write_failure(save_dir, 2, PermissionError(errno.EACCES, "Permission denied"))
    assert "the disk is full" not in other or shutil.disk_usage(save_dir).free < FULL_DISK_BYTES


def test_a_resume_from_another_model_is_refused_or_warned(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = Trainer.from_pretrained(tiny_model_dir, TrainConfig(lr=1e-3))
    save_dir = tmp_path / "ckpt"
    state = {"trainer": trainer.resume_state(), "run": {"model": _model_identity(tiny_model_dir)}}
    save_run_checkpoint(save_dir, 1, trainer.model, optimizer_state={
        "optimizer": trainer.optimizer.state_dict(), "num_optimizer_steps": 0}, state=state)
    copy = tmp_path / "copy-of-the-model"
    shutil.copytree(tiny_model_dir, copy)
    with caplog.at_level(logging.WARNING):
        _resume_trainer(tmp_path, save_dir, copy)  # the same architecture elsewhere: a warning
    assert f"resume: --hf-checkpoint {copy.resolve()} is not the directory" in caplog.text
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(ConfigError, match="its config.json differs") as info:
        _resume_trainer(tmp_path, save_dir, copy)
    assert info.value.param == "--hf-checkpoint"


def test_rng_state_round_trip() -> None:
    state = json.loads(json.dumps(capture_rng_state()))  # what state.json stores
    expected = (random.random(), torch.rand(3), numpy.random.rand(2))
    random.seed(99)
    torch.manual_seed(99)
    numpy.random.seed(99)
    restore_rng_state(state)
    got = (random.random(), torch.rand(3), numpy.random.rand(2))
    assert got[0] == expected[0]
    assert torch.equal(got[1], expected[1])
    assert numpy.array_equal(got[2], expected[2])


def test_trainer_resumed_from_a_checkpoint_trains_the_same_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two steps in one trainer equal one step, a checkpoint, a new trainer and one more step.

    Two minibatches per step, so the shuffling RNG and AdamW's moments both matter.
    """
    config = TrainConfig(lr=1e-2, num_minibatches=2, micro_batch_size=2, seed=5)
    steps = [(make_samples(6, seed=s), [1.0, -1.0, 0.5, -0.5, 2.0, -2.0]) for s in (1, 2)]
    straight = Trainer.from_pretrained(tiny_model_dir, config)
    for samples, advantages in steps:
        straight.train_step(scored_samples(samples, advantages))

    first = Trainer.from_pretrained(tiny_model_dir, config)
    first.train_step(scored_samples(*steps[0]))
    checkpoint = _save(first, tmp_path / "ckpt", 1)
    resumed = Trainer.from_pretrained(checkpoint, config)
    resumed.load_resume_state(checkpoint, read_run_state(checkpoint)["trainer"])
    assert resumed.num_optimizer_steps == 2
    resumed.train_step(scored_samples(*steps[1]))
    assert resumed.num_optimizer_steps == straight.num_optimizer_steps == 4
    want, got = _weights(straight), _weights(resumed)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_a_load_dir_without_a_checkpoint_warns_saying_what_it_found(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing, empty, a_file = tmp_path / "typo", tmp_path / "empty", tmp_path / "a-file"
    empty.mkdir()
    a_file.write_text("x")
    expected = {missing: "the directory does not exist", empty: "the directory holds no run checkpoint",
                a_file: "not a directory"}
    for load_dir, reason in expected.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="relaxtrio.run.run_dirs"):
            assert find_resume_point(load_dir) is None  # a fresh start, as `--save D --load D` needs
        assert [r.getMessage() for r in caplog.records] == [
            f"--load {load_dir}: {reason}; starting from the beginning"]
    caplog.clear()
    assert find_resume_point(missing, log_missing=False) is None
    assert caplog.records == []


@pytest.mark.slow
def test_a_run_directory_is_held_by_one_run_at_a_time(tmp_path: Path) -> None:
    """A second holder of a run or --save directory is refused naming the first's pid; the hold
    ends with the context (and with the process), and a path that cannot be a directory is a
    clear error."""
    import os
    import subprocess
    import sys

    from relaxtrio._errors import ConfigError
    from relaxtrio.run.run_dirs import RUN_LOCK_FILE, hold_run_dirs

    out, save = tmp_path / "run", tmp_path / "ckpt"
    with hold_run_dirs(out, save):
        assert (save / RUN_LOCK_FILE).read_text().strip() == str(os.getpid())
        # flock is per open file: another process is refused, as a second driver would be.
        probe = ("import sys; from relaxtrio.run.run_dirs import hold_run_dirs\n"
                 "try:\n    hold_run_dirs(sys.argv[1], None).__enter__()\n"
                 "except Exception as exc:\n    print(exc.param, exc); sys.exit(3)\n")
        for directory, param in ((out, "output_dir"), (save, "output_dir")):
            done = subprocess.run([sys.executable, "-c", probe, str(directory)], capture_output=True,
                                  text=True, check=False)
            assert done.returncode == 3, done.stderr
            assert done.stdout.startswith(param) and f"is in use by another run (pid {os.getpid()})" in done.stdout
    with hold_run_dirs(out, save):  # released on exit
        pass
    with hold_run_dirs(out, out):  # one directory for both: held once
        assert (out / RUN_LOCK_FILE).read_text().strip() == str(os.getpid())
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(ConfigError, match="cannot create it") as info, \
            hold_run_dirs(out, tmp_path / "a-file" / "ckpt"):
        pass
    assert info.value.param == "save"


def test_a_resume_on_other_prompt_rows_says_which_file_and_what_follows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The cursor is an index into the rows: rows that differ (in place, or another file of the
    same count) are warned about, naming the file the checkpoint's run read."""
    rows = [{"messages": [{"role": "user", "content": f"task {i}"}]} for i in range(3)]
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stream = PromptStream(prompts=[Prompt(index=i, messages=tuple(r["messages"]), metadata={})
                                   for i, r in enumerate(rows)], shuffle=False, seed=1)
    rollout = capture_rollout(stream, (), next_rollout_id=1).to_json()
    read = {"prompt_data": str(data.resolve()), "prompt_data_sha256": _sha256(data)}  # by the run

    def resume_on(path: Path) -> str:
        run = TrainRunConfig(prompt_data=path, agent=AgentConfig(command="true", cwd=tmp_path),
                             output_dir=tmp_path / "out")
        state = {"steps_done": 1, "rollout": rollout, "run": read}
        checkpointer = RunCheckpointer(config=run, resume=ResumePoint(checkpoint_dir=tmp_path,
                                                                      state=state))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            checkpointer.restore_prompts(PromptStream(prompts=stream.prompts, shuffle=False, seed=1))
        return caplog.text

    copy = tmp_path / "copy.jsonl"
    shutil.copyfile(data, copy)
    assert "--prompt-data" not in resume_on(data) and "--prompt-data" not in resume_on(copy)
    copy.write_text(copy.read_text().replace("task 1", "task one"))
    assert (f"resume: --prompt-data {copy.resolve()} is not the file the checkpoint's run read "
            f"({data.resolve()}) and its rows differ: the saved cursor indexes this file's rows"
            in resume_on(copy))
    data.write_text(data.read_text().replace("task 2", "task two"))
    assert f"--prompt-data {data.resolve()} changed since the checkpoint was written:" in resume_on(data)
