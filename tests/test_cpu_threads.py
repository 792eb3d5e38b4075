"""The split of the cores between the driver's CPU trainer and the embedded engines it launches
(relaxtrio/cpu_threads.py), its flags, and the engine's ``--num-threads``."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relaxtrio._errors import RelaxError
from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.cpu_threads import ThreadSplit, available_cpus, split_cpu_threads
from relaxtrio.run.placement import thread_split, trainer_threads, with_engine_threads


def _config(*flags: str):
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    return train_config(parser.parse_args(["train", *flags]))


@pytest.mark.parametrize(
    ("cpus", "engines", "trainer_here", "expected"),
    [
        (2, 1, True, (1, 1)),     # this machine's default job: one thread each
        (16, 1, True, (8, 8)),
        (4, 2, True, (2, 1)),     # two engines share the trainer's other half
        (1, 1, True, (1, 1)),     # never zero threads
        (2, 1, False, (0, 0)),    # rollout only: the engine keeps torch's default
        (16, 2, False, (0, 8)),   # engines share the cores among themselves only
        (8, 0, True, (0, 0)),     # no engine here (URLs, SGLang, Ray): the trainer keeps its default
    ],
)
def test_default_split(cpus: int, engines: int, trainer_here: bool, expected: tuple[int, int]) -> None:
    split = split_cpu_threads(cpus=cpus, num_local_engines=engines, trainer_here=trainer_here)
    assert (split.trainer_threads, split.engine_threads) == expected


def test_flags_override_either_side_and_zero_is_torch_default() -> None:
    both_default = split_cpu_threads(cpus=2, num_local_engines=1, trainer_here=True,
                                     trainer_threads=0, engine_threads=0)
    assert (both_default.trainer_threads, both_default.engine_threads) == (0, 0)
    trainer_default = split_cpu_threads(cpus=2, num_local_engines=1, trainer_here=True, trainer_threads=0)
    assert trainer_default.engine_threads == 0  # the engine keeps its default too: the old setting
    wide = split_cpu_threads(cpus=8, num_local_engines=1, trainer_here=True, trainer_threads=6)
    assert (wide.trainer_threads, wide.engine_threads) == (6, 2)
    assert "trainer 6, each embedded engine 2" in wide.describe()


def test_run_config_carries_the_flags_and_the_driver_splits_the_cores() -> None:
    cfg = _config("--trainer-num-threads", "3", "--engine-num-threads", "0")
    assert (cfg.trainer_num_threads, cfg.engine_num_threads) == (3, 0)
    split = thread_split(_config())
    assert split.cpus == available_cpus()
    assert split.trainer_threads == max(1, available_cpus() // 2)  # CPU trainer + embedded engine
    assert thread_split(_config("--debug-rollout-only")).trainer_threads == 0
    assert thread_split(_config("--engine-url", "http://127.0.0.1:1")).engine_threads == 0


def test_the_driver_applies_the_split_and_restores_its_threads() -> None:
    import torch

    before = torch.get_num_threads()
    split = ThreadSplit(trainer_threads=1, engine_threads=1, cpus=2)
    with trainer_threads(split):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    cfg = with_engine_threads(_config(), split)
    assert cfg.engine_args[-2:] == ("--num-threads", "1")
    unchanged = _config()
    assert with_engine_threads(unchanged, ThreadSplit(trainer_threads=0, engine_threads=0, cpus=2)) is unchanged


@pytest.mark.parametrize("value", ["-1", "4097", "99999999999999999999"])
@pytest.mark.parametrize("flag", ["--trainer-num-threads", "--engine-num-threads"])
def test_thread_counts_out_of_range_are_refused(flag: str, value: str) -> None:
    with pytest.raises((RelaxError, SystemExit), match=f"{flag} must be between 0 and 4096"):
        _config(flag, value)


@pytest.mark.slow
def test_engine_refuses_negative_threads() -> None:
    proc = subprocess.run([sys.executable, "-m", "relaxtrio.engine", "--model", "unused",
                           "--num-threads", "-1"], check=False, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.returncode == 2 and "--num-threads must be between 0 and 4096" in proc.stderr


def test_the_trainer_takes_every_core_while_no_group_is_resident() -> None:
    split = split_cpu_threads(cpus=2, num_local_engines=1, trainer_here=True)
    assert (split.trainer_threads, split.trainer_solo_threads) == (1, 2)
    assert "trainer 1 (2 while no Group uses the CPU)" in split.describe()
    busy = [True]
    threads = split.update_threads(busy=lambda: busy[0])
    assert threads is not None and threads() == 1
    busy[0] = False
    assert threads() == 2
    # a count the user fixed holds for the whole update; no split: nothing to pace
    fixed = split_cpu_threads(cpus=8, num_local_engines=1, trainer_here=True, trainer_threads=3)
    assert fixed.trainer_solo_threads == 3 and fixed.update_threads(busy=lambda: False) is None
    alone = split_cpu_threads(cpus=8, num_local_engines=0, trainer_here=True)
    assert alone.update_threads(busy=lambda: False) is None
    assert ThreadSplit(trainer_threads=1, engine_threads=1, cpus=2).trainer_solo_threads == 1
