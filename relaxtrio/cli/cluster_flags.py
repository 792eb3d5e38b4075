"""Command-line flags for running past one process: trainer ranks, Ray placement.

The "cluster" group of ``train --help`` (:mod:`relaxtrio.cli.train_flags`) and the
:class:`~relaxtrio.config.DistributedConfig` it makes. Nothing here imports Ray:
``--ray-address`` (or ``RAY_ADDRESS``, read when the flags are parsed, never at import time) only
selects the Ray placement, which the driver imports when asked.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from .._errors import ConfigError

__all__ = ["add_cluster_flags", "with_cluster_flags"]


def add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """Adds the "cluster" flag group (sharded trainer, Ray placement, agent API reach) to the
    ``train`` parser."""
    g = p.add_argument_group("cluster", "past one process: sharded trainer ranks, Ray placement, "
                                        "and the agent API's address for agents on other nodes")
    g.add_argument("--actor-num-nodes", type=int, default=1, metavar="N",
                   help="nodes the trainer ranks spread over (more than 1 needs --ray-address)")
    g.add_argument("--actor-num-gpus-per-node", type=int, default=1, metavar="N",
                   help="trainer ranks per node (FSDP2; on a CPU-only machine: rank processes)")
    g.add_argument("--ray-address", default=None, metavar="auto|ADDRESS",
                   help="place trainer ranks (and launched engines) on this Ray cluster "
                        "(default: $RAY_ADDRESS; unset: no Ray, ranks as local processes)")
    g.add_argument("--agent-executor", choices=["local", "ray"], default="local",
                   help="where agents run: subprocesses here, or on Ray nodes through a pool of "
                        "long-lived actors, each with --agent-num-cpus (needs --ray-address)")
    g.add_argument("--agent-num-cpus", type=float, default=1.0, metavar="N",
                   help="CPUs each agent actor reserves on its Ray node")
    g.add_argument("--rollout-num-cpus-per-engine", type=float, default=1.0, metavar="N",
                   help="with --ray-address: CPUs each launched engine's Ray actor reserves (and "
                        "the engine's torch threads); its GPUs are --rollout-num-gpus-per-engine")
    g.add_argument("--agentic-api-host", default="127.0.0.1", metavar="HOST",
                   help="interface the agent API binds; agents on other nodes need a non-loopback one "
                        "(the Session id is each agent's credential)")
    g.add_argument("--agentic-api-port", type=int, default=0, metavar="PORT",
                   help="agent API port (0: any free port)")
    g.add_argument("--agentic-api-advertise-url", default=None, metavar="URL",
                   help="RELAX_BASE_URL handed to agents, e.g. http://HEAD_IP/agentic_api/ (a URL "
                        "without a port gets the bound one); unset: the bound URL")
    g.add_argument("--trainer-collective-timeout", type=float, default=300.0, metavar="S",
                   help="seconds a trainer collective waits for a peer rank before the step fails")


def with_cluster_flags(config: Any, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Any:
    """``config`` (a :class:`~relaxtrio.config.TrainRunConfig`) with the scale-out flags applied.

    Args:
        config: the run configuration so far.
        args: the parsed flags.
        environ: the environment ``RAY_ADDRESS`` is read from (default ``os.environ``).

    Raises:
        ConfigError: a count below 1, several nodes without Ray, or a non-positive timeout
            (``param`` names the flag).
    """
    import attrs

    from ..config import DistributedConfig

    env = os.environ if environ is None else environ
    ray_address = args.ray_address or env.get("RAY_ADDRESS") or None
    flags = {"actor_num_nodes": "--actor-num-nodes", "actor_num_gpus_per_node": "--actor-num-gpus-per-node",
             "collective_timeout_s": "--trainer-collective-timeout", "agent_executor": "--agent-executor",
             "agent_num_cpus": "--agent-num-cpus", "engine_num_cpus": "--rollout-num-cpus-per-engine",
             "api_host": "--agentic-api-host", "api_port": "--agentic-api-port",
             "api_advertise_url": "--agentic-api-advertise-url"}
    try:
        dist = DistributedConfig(
            actor_num_nodes=args.actor_num_nodes,
            actor_num_gpus_per_node=args.actor_num_gpus_per_node,
            ray_address=ray_address,
            collective_timeout_s=args.trainer_collective_timeout,
            device="cuda" if config.train.device.startswith("cuda") else "cpu",
            agent_executor=args.agent_executor,
            agent_num_cpus=args.agent_num_cpus,
            engine_num_cpus=args.rollout_num_cpus_per_engine,
            api_host=args.agentic_api_host,
            api_port=args.agentic_api_port,
            api_advertise_url=args.agentic_api_advertise_url,
        )
    except ConfigError as exc:
        raise exc.at_param(flags.get(exc.param or "", "--actor-num-nodes")) from exc
    return attrs.evolve(config, distributed=dist)
