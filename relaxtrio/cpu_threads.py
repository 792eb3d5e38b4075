"""How the CPU's cores are split between the trainer and the embedded engines of one machine.

On a CPU-only machine the driver's one-process trainer and the embedded engine processes it
launches all run torch, and torch starts one OpenMP compute thread per core in every process.
When they run at the same time (``--fully-async`` trains while the engines generate; in every
schedule the agents and the agent API also need CPU during the rollout) that is twice as many
busy threads as cores, and OpenMP's spin-waiting makes the oversubscribed threads slow each
other down far more than their share of the cores explains (on 2 loaded cores one no-grad
forward took 21-25 s with 2 threads and 3.2 s with 1). So by default the cores are split:

* the trainer gets ``max(1, cores // 2)`` threads (``torch.set_num_threads`` in the driver);
* each of the ``N`` embedded engines launched here gets ``max(1, (cores - trainer) // N)``
  (``python -m relaxtrio.engine --num-threads``);
* while no train Group uses the CPU (nothing generates, no agent computes: the synchronous
  update, a fully async update once the next step's Groups have all finished, or a prelaunch
  update once every prelaunched agent has sent its first request and waits for its lease) the
  trainer takes every core (``trainer_solo_threads``): its micro-batches ask before each one
  (:meth:`relaxtrio.train.Trainer.train_step` ``threads``), so an update that began beside
  generation or agent start-ups speeds up as soon as they end.

The split is the same for every schedule (synchronous, prelaunch, fully async), so no schedule
is compared against a handicapped baseline. ``--trainer-num-threads`` and
``--engine-num-threads`` override either side (an explicit trainer count holds for the whole
update); ``0`` keeps torch's default for that side (one
thread per core: what runs had before the split, where several engines still shared the cores
among themselves only). Nothing is split when the trainer is not a CPU trainer in the driver
(rollout only, sharded ranks, a GPU device) or when no embedded engine is launched here (URLs,
SGLang, engines on Ray): then both sides keep their defaults. ``cores`` is the CPUs this
process may run on (its affinity), not every CPU of the machine.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Final

import attrs

__all__ = ["AUTO", "MAX_THREADS", "ThreadSplit", "available_cpus", "split_cpu_threads"]

AUTO: Final = None
"""A side whose thread count is picked by the split (the flags' default)."""

MAX_THREADS: Final = 4096
"""The largest thread count a flag accepts: more than any machine's cores (torch's own
``set_num_threads`` overflows on values past a C ``int``, with a traceback)."""


@attrs.frozen(kw_only=True)
class ThreadSplit:
    """Torch compute threads of each side; 0 means torch's default (one per core).

    Attributes:
        trainer_threads: threads of the trainer in the driver process.
        engine_threads: threads of each embedded engine launched on this machine.
        cpus: the cores the split was made for.
        trainer_solo_threads: threads of the trainer while no train Group uses the CPU (the
            engines idle, no agent starting); equals ``trainer_threads`` when the user fixed that count.
    """

    trainer_threads: int
    engine_threads: int
    cpus: int
    trainer_solo_threads: int = attrs.field()

    @trainer_solo_threads.default
    def _solo_default(self) -> int:
        return self.trainer_threads

    def update_threads(self, *, busy: Callable[[], bool]) -> Callable[[], int] | None:
        """The trainer's thread count to ask before each micro-batch, or None (fixed).

        Args:
            busy: whether anything shares the cores now (a train Group generates or an agent
                starts: ``RolloutPipeline.groups_use_cpu``).

        Returns:
            ``trainer_threads`` while ``busy()``, else ``trainer_solo_threads``; None when
            both are the same (nothing to change during an update).
        """
        if self.trainer_solo_threads == self.trainer_threads or not self.trainer_threads:
            return None
        shared, solo = self.trainer_threads, self.trainer_solo_threads
        return lambda: shared if busy() else solo

    def describe(self) -> str:
        """One log line's worth: who gets how many threads."""
        def side(n: int) -> str:
            return "torch default" if n == 0 else str(n)

        solo = (f" ({self.trainer_solo_threads} while no Group uses the CPU)"
                if self.trainer_solo_threads != self.trainer_threads else "")
        return (f"CPU threads on {self.cpus} core(s): trainer {side(self.trainer_threads)}{solo}, "
                f"each embedded engine {side(self.engine_threads)} (--trainer-num-threads, "
                f"--engine-num-threads)")


def available_cpus() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity API (macOS)
        return max(1, os.cpu_count() or 1)


def split_cpu_threads(*, cpus: int, num_local_engines: int, trainer_here: bool,
                      trainer_threads: int | None = AUTO,
                      engine_threads: int | None = AUTO) -> ThreadSplit:
    """Splits ``cpus`` cores between the driver's trainer and the local embedded engines.

    Args:
        cpus: cores available (>= 1).
        num_local_engines: embedded engines launched on this machine (0: none).
        trainer_here: a CPU trainer runs in the driver process.
        trainer_threads: the user's trainer thread count, 0 for torch's default, or
            :data:`AUTO`.
        engine_threads: the same for each engine.

    Returns:
        The threads of each side (0: leave torch's default).
    """
    shared = trainer_here and num_local_engines > 0
    solo = None
    if trainer_threads is AUTO:
        trainer_threads = max(1, cpus // 2) if shared else 0
        solo = cpus if shared else 0
    if engine_threads is AUTO:
        if shared and trainer_threads > 0:
            engine_threads = max(1, (cpus - min(trainer_threads, cpus - 1)) // num_local_engines)
        elif num_local_engines > 1:  # engines share the cores among themselves only
            engine_threads = max(1, cpus // num_local_engines)
        else:
            engine_threads = 0
    return ThreadSplit(trainer_threads=trainer_threads, engine_threads=engine_threads, cpus=cpus,
                       trainer_solo_threads=trainer_threads if solo is None else solo)
