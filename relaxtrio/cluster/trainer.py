"""Trainer ranks as Ray actors in one placement group (one bundle per rank).

:class:`RayRankGroup` is the :class:`~relaxtrio.train.ranks.RankGroup` of a Ray run: W actors,
each reserving its bundle (1 GPU + ``cpus_per_rank`` CPUs on GPU nodes, ``cpus_per_rank`` CPUs
on CPU-only clusters), packed onto as few nodes as possible (``PACK``: ranks of one node share
its memory bandwidth and, on GPU, NVLink). Rank 0's node address is the rendezvous; every actor
then runs the same sharded trainer as a local rank process
(:class:`~relaxtrio.train.distributed.ShardedTrainer`).

Failure behaviour follows :mod:`relaxtrio.train.ranks`: an actor that dies (its process or node
is lost: ``RayActorError``) or raises fails the call with
:class:`~relaxtrio.TrainerRankError` naming the rank and its node (Ray node id and IP); peers
stuck in a collective fail within ``collective_timeout_s``. :meth:`RayRankGroup.close` kills
every actor and removes the placement group, so a finished or failed run leaves no trainer
actor behind. All calls block; the driver makes them from worker threads.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

import attrs
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from .._errors import TrainerRankError
from ..config import DistributedConfig
from ..train.ranks import (
    GRACE_S,
    RankGroup,
    RankOutcome,
    RankStart,
    blame,
    build_rank_trainer,
    free_port,
)
from .runtime import connect

__all__ = ["RayRankGroup"]

log = logging.getLogger(__name__)


@ray.remote
class _RankActor:
    """One trainer rank inside a Ray actor process."""

    def where(self) -> tuple[str, str]:
        """``(node id, node IP)`` of this actor."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def free_port(self) -> int:
        """A free TCP port on this node (rank 0's rendezvous)."""
        return free_port("0.0.0.0")

    def setup(self, rank_spec: Any, start: RankStart) -> None:
        """Joins the process group and builds the sharded trainer (a collective)."""
        import torch

        from ..train.distributed import ShardedTrainer, init_rank

        torch.set_num_threads(start.num_threads)
        init_rank(rank_spec)
        self._rank = rank_spec.rank
        self._trainer = build_rank_trainer(rank_spec, start, ShardedTrainer)

    def call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Runs one trainer method; rank 0 returns its value, the others None."""
        value = getattr(self._trainer, method)(*args, **kwargs)
        return value if self._rank == 0 else None

    def shutdown(self) -> None:
        """Leaves the process group."""
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class RayRankGroup(RankGroup):
    """W trainer ranks as Ray actors; create with :meth:`start`, end with :meth:`close`.

    Attributes:
        nodes: ``"<node id> (<ip>)"`` of each rank, index = rank.
    """

    def __init__(self, actors: list[Any], group: Any, nodes: list[str]) -> None:
        self._actors = actors
        self._group = group
        self.nodes = nodes
        self.world_size = len(actors)
        self._closed = False

    @classmethod
    def start(cls, start: RankStart, dist_config: DistributedConfig, *, cpus_per_rank: float = 1.0) -> RayRankGroup:
        """Connects to Ray, reserves the placement group and starts the ranks.

        Raises:
            ConfigError: no Ray cluster at ``dist_config.ray_address``.
            TrainerRankError: the bundles could not be reserved within ``start_timeout_s``, or a
                rank failed to start.
        """
        assert dist_config.ray_address is not None
        connect(dist_config.ray_address)
        world = dist_config.world_size
        gpu = dist_config.device == "cuda"
        bundle = {"CPU": cpus_per_rank, **({"GPU": 1} if gpu else {})}
        group = placement_group([dict(bundle) for _ in range(world)], strategy="PACK")
        ready, _ = ray.wait([group.ready()], timeout=dist_config.start_timeout_s)
        if not ready:
            remove_placement_group(group)
            raise TrainerRankError(
                f"Ray could not place {world} trainer ranks of {bundle} within "
                f"{dist_config.start_timeout_s:g} s (cluster resources: {ray.available_resources()})",
                rank=0, node="ray")
        actors = [
            _RankActor.options(
                num_cpus=cpus_per_rank, num_gpus=1 if gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=rank),
            ).remote()
            for rank in range(world)
        ]
        self = cls(actors, group, [f"rank-{r}" for r in range(world)])
        self.config = start.config
        try:
            where = ray.get([a.where.remote() for a in actors], timeout=dist_config.start_timeout_s)
            self.nodes = [f"{node_id[:12]} ({ip})" for node_id, ip in where]
            port = ray.get(actors[0].free_port.remote(), timeout=dist_config.start_timeout_s)
            specs = [_spec(rank, world, where, port, dist_config) for rank in range(world)]
            start = attrs.evolve(start, num_threads=max(1, int(cpus_per_rank)))
            refs = [a.setup.remote(rank_spec, start) for a, rank_spec in zip(actors, specs, strict=True)]
            error = blame("start", self._outcomes(refs, dist_config.start_timeout_s))
        except ray.exceptions.GetTimeoutError:
            error = TrainerRankError("trainer ranks did not start in time", rank=0, node=self.nodes[0])
        if error is not None:
            self.close()
            raise error
        log.info("trainer: %d FSDP2 ranks as Ray actors on %s", world, ", ".join(sorted(set(self.nodes))))
        return self

    def _call_all(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[RankOutcome]:
        if self._closed:
            raise TrainerRankError(f"the trainer ranks are closed; cannot run {method}", rank=0, node=self.nodes[0])
        refs = [a.call.remote(method, args, kwargs) for a in self._actors]
        return self._outcomes(refs, None)

    def _outcomes(self, refs: list[Any], timeout_s: float | None) -> list[RankOutcome]:
        """Each rank's result; after the first failure the others get ``GRACE_S`` to report."""
        pending = {ref: rank for rank, ref in enumerate(refs)}
        outcomes: dict[int, RankOutcome] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        in_grace = False
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=remaining)
            if not ready:
                break
            for ref in ready:
                rank = pending.pop(ref)
                outcomes[rank] = self._outcome(rank, ref)
            if not in_grace and any(o.state != "ok" for o in outcomes.values()):
                in_grace = True
                grace_end = time.monotonic() + GRACE_S
                deadline = grace_end if deadline is None else min(deadline, grace_end)
        for rank in pending.values():
            outcomes[rank] = RankOutcome(rank=rank, node=self.nodes[rank], state="silent")
        return [outcomes[r] for r in range(len(refs))]

    def _outcome(self, rank: int, ref: Any) -> RankOutcome:
        node = self.nodes[rank]
        try:
            value = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return RankOutcome(rank=rank, node=node, state="dead", error=_first_line(exc))
        except ray.exceptions.RayTaskError as exc:
            return RankOutcome(rank=rank, node=node, state="error", error=str(exc)[-4000:])
        return RankOutcome(rank=rank, node=node, state="ok", value=value)

    def close(self) -> None:
        """Kills every rank actor and removes the placement group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            ray.get([a.shutdown.remote() for a in self._actors], timeout=GRACE_S)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        with contextlib.suppress(Exception):
            remove_placement_group(self._group)


def _spec(rank: int, world: int, where: list[tuple[str, str]], port: int, cfg: DistributedConfig) -> Any:
    from ..train.distributed import RankSpec

    node_id, ip = where[rank]
    local_rank = sum(1 for other in where[:rank] if other[0] == node_id)
    return RankSpec(
        rank=rank, world_size=world, local_rank=0 if cfg.device == "cuda" else local_rank,
        master_addr=where[0][1], master_port=port, collective_timeout_s=cfg.collective_timeout_s,
        device=cfg.device, node=f"{node_id[:12]} ({ip})",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
