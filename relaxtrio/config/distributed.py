"""Where the trainer ranks, agents and launched engines run: :class:`DistributedConfig`."""

from __future__ import annotations

import urllib.parse
from typing import Final

import attrs

from .._errors import ConfigError
from .._validate import positive_int, positive_number

__all__ = [
    "WILDCARD_HOSTS",
    "DistributedConfig",
]


@attrs.frozen(kw_only=True)
class DistributedConfig:
    """Where the trainer runs: one process, W local rank processes, or Ray actors.

    ``world_size = actor_num_nodes * actor_num_gpus_per_node`` ranks of FSDP2
    (:mod:`relaxtrio.train.distributed`); W == 1 trains in the driver process as before. On a
    CPU-only machine ``actor_num_gpus_per_node`` counts rank processes per node.

    Attributes:
        actor_num_nodes: nodes the trainer ranks spread over (``--actor-num-nodes``); more than
            one needs Ray.
        actor_num_gpus_per_node: ranks per node (``--actor-num-gpus-per-node``).
        ray_address: ``--ray-address`` / ``RAY_ADDRESS``: ``"auto"`` or a cluster address; None
            runs without Ray (ranks as local processes).
        collective_timeout_s: seconds a collective waits for a peer before failing
            (``--trainer-collective-timeout``); also how long the driver waits for a rank's
            answer after another rank has failed.
        start_timeout_s: seconds the ranks may take to start and load the model.
        device: ``"cpu"`` (gloo) or ``"cuda"`` (nccl, one GPU per rank).
        agent_executor: ``"local"`` (agents are subprocesses of the driver) or ``"ray"`` (each
            Session's agent on a Ray node, run by a pool of long-lived actors,
            :mod:`relaxtrio.cluster.agents`; needs Ray).
        agent_num_cpus: CPUs each agent actor reserves on its Ray node (``--agent-num-cpus``).
        engine_num_cpus: CPUs each launched engine's Ray actor reserves
            (``--rollout-num-cpus-per-engine``; with Ray, launched engines run as actors,
            :mod:`relaxtrio.cluster.engines`); its torch threads.
        api_host: interface the agent API binds (``--agentic-api-host``); loopback unless set; a
            wildcard (:data:`WILDCARD_HOSTS`) needs ``api_advertise_url``.
        api_port: its TCP port (0: any free one).
        api_advertise_url: the base URL handed to agents as ``RELAX_BASE_URL``
            (``--agentic-api-advertise-url``), e.g. ``http://10.0.0.5:8000/agentic_api/``; a URL
            without a port gets the bound port; None: the bound URL.
    """

    actor_num_nodes: int = attrs.field(default=1, validator=positive_int)
    actor_num_gpus_per_node: int = attrs.field(default=1, validator=positive_int)
    ray_address: str | None = None
    collective_timeout_s: float = attrs.field(default=300.0, validator=positive_number)
    start_timeout_s: float = attrs.field(default=600.0, validator=positive_number)
    device: str = "cpu"
    agent_executor: str = "local"
    agent_num_cpus: float = attrs.field(default=1.0, validator=positive_number)
    engine_num_cpus: float = attrs.field(default=1.0, validator=positive_number)
    api_host: str = "127.0.0.1"
    api_port: int = 0
    api_advertise_url: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.agent_executor not in ("local", "ray"):
            raise ConfigError.at("agent_executor", f"must be local or ray, got {self.agent_executor!r}")
        if self.agent_executor == "ray" and self.ray_address is None:
            raise ConfigError.at("agent_executor", "ray needs a Ray cluster (--ray-address auto|ADDRESS)")
        if self.actor_num_nodes > 1 and self.ray_address is None:
            raise ConfigError.at("actor_num_nodes", "> 1 needs Ray (--ray-address auto|ADDRESS)")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError.at("device", f"must be cpu or cuda, got {self.device!r}")
        if not 0 <= self.api_port <= 65535:
            raise ConfigError.at("api_port", f"must be a TCP port, 0-65535 (0 picks a free one), got {self.api_port}")
        if self.api_advertise_url is not None:
            parts = urllib.parse.urlsplit(self.api_advertise_url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError.at("api_advertise_url", "must be an http(s) URL with a host, e.g. "
                                     f"http://10.0.0.5:8000/agentic_api/, got {self.api_advertise_url!r}")
        if self.api_host in WILDCARD_HOSTS and self.api_advertise_url is None:
            raise ConfigError.at("api_host", f"{self.api_host!r} listens on every interface but is no address an "
                                 "agent can connect to: also set --agentic-api-advertise-url (e.g. "
                                 "http://<this node's IP>:<port>/agentic_api/)")

    @property
    def world_size(self) -> int:
        """W, the number of trainer ranks."""
        return self.actor_num_nodes * self.actor_num_gpus_per_node


WILDCARD_HOSTS: Final = frozenset({"0.0.0.0", "::", "[::]", ""})
"""``--agentic-api-host`` values that bind every interface: agents need an advertised URL."""
