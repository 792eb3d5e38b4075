"""The driver's side of a sharded trainer: W rank processes behind one Trainer-like object.

:class:`RankGroup` has the methods the driver and the run checkpointer call on a
:class:`~relaxtrio.train.Trainer` (``train_step``, ``save_weights``, ``save_checkpoint``,
``save_run_checkpoint``, ``compute_logprobs``, ``resume_state``), all blocking, so the trio driver
calls them through ``trio.to_thread.run_sync`` exactly as it calls the one-process trainer. Each
call is sent to every rank (each gets the whole step, see :mod:`relaxtrio.train.distributed`)
and returns rank 0's answer.

:class:`LocalRankGroup` starts the ranks as local processes (``multiprocessing`` spawn, one
``torch.distributed`` process group over TCP on 127.0.0.1); the Ray placement
(:mod:`relaxtrio.cluster.trainer`) runs the same :func:`serve_rank` loop inside Ray actors.

Failure behaviour: a rank that dies (its process ends), answers with an error, or stops answering
ends the call with :class:`~relaxtrio.TrainerRankError` naming the rank and its node. A dead
process is seen at once (its sentinel); a live rank stuck in a collective fails within
``collective_timeout_s`` (the process group's timeout); after the first failure the others get
:data:`GRACE_S` to report, so the error names the rank that died rather than a peer that saw
it die. The group is closed after any failure (every rank process is ended); the run stops.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import socket
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, Self

import attrs

from .._errors import TrainerRankError
from ..config import DistributedConfig, TrainConfig

__all__ = [
    "LocalRankGroup",
    "RankGroup",
    "RankOutcome",
    "RankStart",
    "blame",
    "build_rank_trainer",
    "free_port",
    "serve_rank",
]

log = logging.getLogger(__name__)

GRACE_S: Final = 5.0
"""Seconds the other ranks get to report after the first failure, so the dead one is named."""

_TRACEBACK_TAIL_CHARS: Final = 4000


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the rendezvous binds it right after)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@attrs.frozen(kw_only=True)
class RankOutcome:
    """What one rank did with one call: answered, failed with ``error``, died, or stayed silent."""

    rank: int
    node: str
    state: str  # "ok" | "error" | "dead" | "silent"
    value: Any = None
    error: str = ""


def blame(method: str, outcomes: Sequence[RankOutcome]) -> TrainerRankError | None:
    """The error for a call that did not succeed everywhere, naming the rank most likely at fault.

    A dead rank comes first (the others usually only saw it go), then the first that reported
    an error, then one that stayed silent (a rank stuck waiting on a failed peer is silent too).

    Returns:
        None when every rank answered.
    """
    for state in ("dead", "error", "silent"):
        for o in outcomes:
            if o.state != state:
                continue
            what = {"dead": "died", "silent": "stopped answering", "error": "failed"}[state]
            others = "; ".join(f"rank {x.rank}: {x.state}" for x in outcomes if x.rank != o.rank)
            detail = f": {o.error}" if o.error else ""
            return TrainerRankError(
                f"trainer rank {o.rank} on node {o.node} {what} during {method}{detail}"
                + (f" ({others})" if others else ""),
                rank=o.rank, node=o.node,
            )
    return None


class RankGroup:
    """W trainer ranks behind the :class:`~relaxtrio.train.Trainer` methods the driver uses.

    Subclasses implement :meth:`_call_all` (send one call to every rank, collect outcomes) and
    :meth:`close`. Not thread-safe: one call at a time, like the trainer.

    Attributes:
        world_size: W.
        config: the trainer settings every rank runs with.
    """

    world_size: int
    config: TrainConfig

    def _call_all(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankOutcome]:
        raise NotImplementedError

    def close(self) -> None:
        """Ends every rank (idempotent)."""
        raise NotImplementedError

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        outcomes = self._call_all(method, args, kwargs)
        error = blame(method, outcomes)
        if error is not None:
            self.close()
            raise error
        return outcomes[0].value

    def train_step(self, scored: Sequence[Any]) -> Any:
        """One sharded step on the scored contexts (see :meth:`Trainer.train_step`); rank 0's
        whole-batch stats. Every rank receives every context (pickled; a
        ``relaxtrio.rollout.scored.ScoredSample`` loads with attrs and the forest only).

        Raises:
            TrainerRankError: a rank died, failed or stopped answering (the group is closed).
        """
        return self._call("train_step", list(scored))

    def compute_logprobs(self, samples: Sequence[Any]) -> list[list[float]]:
        """See :meth:`Trainer.compute_logprobs`.

        Raises:
            TrainerRankError: as :meth:`train_step`.
        """
        return self._call("compute_logprobs", list(samples))

    def save_weights(self, out_dir: Path) -> Path:
        """Rank 0 writes the gathered weights (see :meth:`Trainer.save_weights`).

        Raises:
            TrainerRankError: as :meth:`train_step`.
        """
        return self._call("save_weights", Path(out_dir))

    def save_checkpoint(
        self, out_dir: Path, tokenizer_dir: Path | None = None, *, include_optimizer: bool = False
    ) -> Path:
        """See :meth:`ShardedTrainer.save_checkpoint`.

        Raises:
            TrainerRankError: as :meth:`train_step`.
        """
        return self._call("save_checkpoint", Path(out_dir), tokenizer_dir, include_optimizer=include_optimizer)

    def save_run_checkpoint(self, save_dir: Path, steps_done: int, **kwargs: Any) -> Path:
        """See :meth:`ShardedTrainer.save_run_checkpoint`.

        Raises:
            TrainerRankError: as :meth:`train_step`.
        """
        return self._call("save_run_checkpoint", Path(save_dir), steps_done, **kwargs)

    def resume_state(self) -> dict[str, Any]:
        """Rank 0's :meth:`Trainer.resume_state` (equal on every rank).

        Raises:
            TrainerRankError: as :meth:`train_step`.
        """
        return self._call("resume_state")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@attrs.frozen(kw_only=True)
class RankStart:
    """What a rank needs to build its sharded trainer (picklable; sent to each rank).

    Attributes:
        model_dir: the HF directory to load (a run checkpoint when resuming).
        config: the trainer settings (``device`` is replaced by the rank's own).
        resume_state: ``state.json["trainer"]`` of the checkpoint in ``model_dir``, or None.
        num_threads: torch CPU threads of the rank process.
        reference_dir: where the KL reference policy comes from when the config needs one (a
            resumed run passes the initial model, as one process does); None: ``model_dir``.
    """

    model_dir: Path
    config: TrainConfig
    resume_state: dict[str, Any] | None = None
    num_threads: int = 1
    reference_dir: Path | None = None


def serve_rank(conn: Any, rank_spec: Any, start: RankStart) -> None:
    """A rank's whole life: join the group, build the sharded trainer, answer calls until closed.

    Messages in: ``(method, args, kwargs)`` or ``None`` (close). Messages out: ``("ready", None)``
    once, then per call ``("ok", value)`` (``value`` only on rank 0) or ``("error", text)``,
    after which the rank exits (its process group may be broken).

    Args:
        conn: a duplex connection (``multiprocessing`` pipe end, or the Ray actor's queue pair).
        rank_spec: this rank's :class:`~relaxtrio.train.distributed.RankSpec`.
        start: the model and settings.
    """
    import torch
    import torch.distributed as dist

    from .distributed import ShardedTrainer, init_rank

    try:
        torch.set_num_threads(start.num_threads)  # this process is the rank's own
        init_rank(rank_spec)
        trainer = build_rank_trainer(rank_spec, start, ShardedTrainer)
    except Exception:  # noqa: BLE001 - any failure is reported to the driver, which raises it
        conn.send(("error", _tail(traceback.format_exc())))
        return
    conn.send(("ready", None))
    try:
        while (msg := _recv(conn)) is not None:
            method, args, kwargs = msg
            try:
                value = getattr(trainer, method)(*args, **kwargs)
            except Exception:  # noqa: BLE001 - reported to the driver, which raises it
                conn.send(("error", _tail(traceback.format_exc())))
                return
            conn.send(("ok", value if rank_spec.rank == 0 else None))
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def build_rank_trainer(rank_spec: Any, start: RankStart, cls: Any) -> Any:
    """Loads ``start.model_dir`` on the rank's device and builds ``cls`` around it.

    ``cls`` (:class:`~relaxtrio.train.distributed.ShardedTrainer`) adds LoRA if configured,
    shards the model, then loads and shards the KL reference from ``start.reference_dir``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    def load(model_dir: Path) -> Any:  # on the CPU; the trainer moves it to the rank's device
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)

    config = attrs.evolve(start.config, device=rank_spec.torch_device)
    reference_dir = start.reference_dir if start.reference_dir is not None else start.model_dir
    trainer = cls(load(start.model_dir), config, rank=rank_spec.rank, world_size=rank_spec.world_size,
                  load_reference=lambda: load(reference_dir))
    if start.resume_state is not None:
        trainer.load_resume_state(start.model_dir, start.resume_state)
    return trainer


def _recv(conn: Any) -> Any:
    try:
        return conn.recv()
    except EOFError:  # the driver is gone
        return None


def _tail(text: str) -> str:
    return text[-_TRACEBACK_TAIL_CHARS:]


class LocalRankGroup(RankGroup):
    """W rank processes on this machine (``multiprocessing`` spawn), gloo or nccl over 127.0.0.1.

    Use :meth:`start`; close it (or use it as a context manager) to end the processes.

    Attributes:
        processes: the rank processes, index = rank.
    """

    def __init__(self, processes: list[Any], conns: list[Any], dist_config: DistributedConfig) -> None:
        self.processes = processes
        self._conns = conns
        self._config = dist_config
        self.world_size = len(processes)
        self._closed = False
        self._node = socket.gethostname()

    @classmethod
    def start(cls, start: RankStart, dist_config: DistributedConfig) -> LocalRankGroup:
        """Starts ``dist_config.world_size`` local ranks and waits until all have loaded the model.

        Raises:
            TrainerRankError: a rank failed to start (or took over ``start_timeout_s``).
        """
        from .distributed import RankSpec

        ctx = multiprocessing.get_context("spawn")
        world = dist_config.world_size
        port = free_port()
        threads = start.num_threads if start.num_threads > 1 else max(1, (os.cpu_count() or 1) // world)
        start = attrs.evolve(start, num_threads=threads)
        processes, conns = [], []
        for rank in range(world):
            rank_spec = RankSpec(rank=rank, world_size=world, local_rank=rank, master_addr="127.0.0.1",
                            master_port=port, collective_timeout_s=dist_config.collective_timeout_s,
                            device=dist_config.device, node=socket.gethostname())
            here, there = ctx.Pipe()
            proc = ctx.Process(target=serve_rank, args=(there, rank_spec, start), name=f"relaxtrio-rank-{rank}",
                               daemon=True)
            proc.start()
            there.close()
            processes.append(proc)
            conns.append(here)
        group = cls(processes, conns, dist_config)
        group.config = start.config
        outcomes = group._collect("start", dist_config.start_timeout_s)
        error = blame("start", outcomes)
        if error is not None:
            group.close()
            raise error
        log.info("trainer: %d local FSDP2 ranks ready", world)
        return group

    def _call_all(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankOutcome]:
        if self._closed:
            raise TrainerRankError(f"the trainer ranks are closed; cannot run {method}", rank=0, node=self._node)
        for conn in self._conns:
            with contextlib.suppress(BrokenPipeError, OSError):  # gone: _collect reports it dead
                conn.send((method, args, kwargs))
        return self._collect(method, None)

    def _collect(self, method: str, timeout_s: float | None) -> list[RankOutcome]:
        """Waits for every rank's answer; ``timeout_s`` None waits as long as all are alive."""
        world = self.world_size
        outcomes: dict[int, RankOutcome] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        in_grace = False
        while len(outcomes) < world:
            if not in_grace and any(o.state != "ok" for o in outcomes.values()):
                in_grace = True  # one rank failed: the rest get GRACE_S to report
                grace_end = time.monotonic() + GRACE_S
                deadline = grace_end if deadline is None else min(deadline, grace_end)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            pending = [r for r in range(world) if r not in outcomes]
            waitables = [self._conns[r] for r in pending] + [self.processes[r].sentinel for r in pending]
            ready = multiprocessing.connection.wait(waitables, timeout=remaining)
            if not ready:
                for r in pending:
                    outcomes[r] = RankOutcome(rank=r, node=self._node, state="silent")
                break
            for r in pending:
                if self._conns[r] in ready or self._conns[r].poll():
                    outcomes[r] = self._read(r)
                elif self.processes[r].sentinel in ready:
                    code = self.processes[r].exitcode
                    outcomes[r] = RankOutcome(rank=r, node=self._node, state="dead",
                                              error=f"process exited with code {code}")
        return [outcomes[r] for r in range(world)]

    def _read(self, rank: int) -> RankOutcome:
        try:
            kind, value = self._conns[rank].recv()
        except (EOFError, OSError):
            self.processes[rank].join(1.0)
            code = self.processes[rank].exitcode
            return RankOutcome(rank=rank, node=self._node, state="dead", error=f"process exited with code {code}")
        if kind == "error":
            return RankOutcome(rank=rank, node=self._node, state="error", error=str(value).strip())
        return RankOutcome(rank=rank, node=self._node, state="ok", value=value)

    def close(self) -> None:
        """Asks each rank to exit, then ends any still running after a few seconds."""
        if self._closed:
            return
        self._closed = True
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.send(None)
        deadline = time.monotonic() + GRACE_S
        for proc in self.processes:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.processes:
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        for conn in self._conns:
            conn.close()
