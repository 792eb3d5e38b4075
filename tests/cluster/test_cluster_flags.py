"""The scale-out flags and the advertised agent URL (no Ray needed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from relaxtrio.cli.cluster_flags import add_cluster_flags, with_cluster_flags
from relaxtrio._errors import ConfigError
from relaxtrio.config import AgentConfig, DistributedConfig, TrainRunConfig
from relaxtrio.run.placement import advertised_url


def _config(tmp_path: Path) -> TrainRunConfig:
    return TrainRunConfig(prompt_data=tmp_path / "p.jsonl", agent=AgentConfig(command="true", cwd=tmp_path))


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_cluster_flags(p)
    return p.parse_args(list(argv))


def test_defaults_are_one_process_on_loopback(tmp_path: Path) -> None:
    cfg = with_cluster_flags(_config(tmp_path), _parse(), environ={})
    assert cfg.distributed == DistributedConfig()
    assert cfg.distributed.world_size == 1 and cfg.distributed.api_host == "127.0.0.1"
    assert cfg.distributed.ray_address is None and cfg.distributed.agent_executor == "local"


def test_flags_and_ray_address_from_the_environment(tmp_path: Path) -> None:
    args = _parse("--actor-num-nodes", "2", "--actor-num-gpus-per-node", "4", "--agent-executor", "ray",
                  "--agent-num-cpus", "2", "--agentic-api-host", "0.0.0.0",
                  "--agentic-api-advertise-url", "http://10.1.2.3/agentic_api/")
    d = with_cluster_flags(_config(tmp_path), args, environ={"RAY_ADDRESS": "10.1.2.3:6379"}).distributed
    assert (d.world_size, d.ray_address, d.agent_executor, d.agent_num_cpus) == (8, "10.1.2.3:6379", "ray", 2.0)
    assert (d.api_host, d.api_advertise_url) == ("0.0.0.0", "http://10.1.2.3/agentic_api/")


@pytest.mark.parametrize(("argv", "flag"), [
    (("--actor-num-nodes", "2"), "--actor-num-nodes"),
    (("--agent-executor", "ray"), "--agent-executor"),
    (("--actor-num-gpus-per-node", "0"), "--actor-num-gpus-per-node"),
    (("--trainer-collective-timeout", "0"), "--trainer-collective-timeout"),
    (("--agentic-api-port", "70000"), "--agentic-api-port"),
    (("--agentic-api-port", "-1"), "--agentic-api-port"),
    (("--agentic-api-advertise-url", "not-a-url"), "--agentic-api-advertise-url"),
    (("--agentic-api-advertise-url", "ftp://10.0.0.5/x"), "--agentic-api-advertise-url"),
    (("--agentic-api-host", "0.0.0.0"), "--agentic-api-host"),  # no address an agent can use
    (("--agentic-api-host", "::"), "--agentic-api-host"),
])
def test_refusals_name_the_flag(tmp_path: Path, argv: tuple[str, ...], flag: str) -> None:
    with pytest.raises(ConfigError) as info:
        with_cluster_flags(_config(tmp_path), _parse(*argv), environ={})
    assert info.value.param == flag


def test_advertised_url_keeps_the_bound_port_and_path() -> None:
    bound = "http://127.0.0.1:43123/agentic_api/"
    assert advertised_url(bound, None) == bound
    assert advertised_url(bound, "http://10.0.0.5") == "http://10.0.0.5:43123/agentic_api/"
    assert advertised_url(bound, "https://proxy.example:8443/x/") == "https://proxy.example:8443/x/"


def test_an_unreachable_ray_address_fails_at_once() -> None:
    """ray.init retries an address where nothing listens for minutes, in a thread SIGTERM cannot
    interrupt; the probe refuses it first."""
    pytest.importorskip("ray")
    import socket

    from relaxtrio.cluster.runtime import _probe  # what connect runs before ray.init

    with socket.socket() as sock:  # a port that is surely closed: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        with pytest.raises(ConfigError, match="no Ray cluster answers") as info:
            _probe(f"127.0.0.1:{port}")
    assert info.value.param == "--ray-address"
