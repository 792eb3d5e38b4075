"""Launched SGLang and vLLM engines run on the interpreter of their own environment
(``--engine-python``), never relaxtrio's; a missing environment is a ConfigError saying what to do.
The command builders are called directly: nothing is started."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from relaxtrio._errors import ConfigError, RelaxError
from relaxtrio.cli.train_config import train_config
from relaxtrio.cli.train_flags import add_train_parser
from relaxtrio.config import FleetConfig
from relaxtrio.fleet import engine_commands
from relaxtrio.fleet.engine_commands import (
    embedded_command,
    engine_python,
    sglang_command,
    vllm_command,
    vllm_env,
)
from relaxtrio.fleet.starter import flag_value

MODEL = Path("/models/smol")


@pytest.fixture
def stub_python(tmp_path: Path) -> Path:
    """An engine environment's "python" (a script; the builders only name it, nothing runs it)."""
    stub = tmp_path / "engine-env" / "bin" / "python"
    stub.parent.mkdir(parents=True)
    stub.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/argv"\nenv > "$(dirname "$0")/env"\n')
    stub.chmod(0o755)
    return stub


def _train_fleet(*flags: str) -> FleetConfig:
    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers(dest="command"))
    return train_config(parser.parse_args(["train", *flags])).fleet


def test_vllm_engines_run_on_the_given_interpreter_with_the_training_flags(stub_python: Path):
    config = _train_fleet("--rollout-backend", "vllm", "--engine-python", str(stub_python),
                          "--rollout-num-engines", "2")
    assert (config.backend, config.engine_python) == ("vllm", stub_python)
    cmd = vllm_command(config, MODEL, ("--max-running-requests", "8"))
    assert cmd[0] == str(stub_python) != sys.executable
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag_value(cmd, "--model") == str(MODEL)
    assert flag_value(cmd, "--logprobs-mode") == "processed_logprobs"
    assert {"--enable-scale-out", "--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(cmd)
    assert flag_value(cmd, "--max-num-seqs") == "8"
    assert int(flag_value(cmd, "--port") or 0) > 0  # vLLM cannot announce a port 0 it bound


def test_sglang_engines_run_on_the_given_interpreter(stub_python: Path):
    config = FleetConfig(backend="sglang", engine_python=stub_python, num_gpus_per_engine=2,
                         sglang_args=("--mem-fraction-static", "0.5"))
    cmd = sglang_command(config, MODEL)
    assert cmd[0] == str(stub_python) != sys.executable
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert (flag_value(cmd, "--tp-size"), flag_value(cmd, "--mem-fraction-static")) == ("2", "0.5")


def test_the_embedded_engine_keeps_relaxtrios_interpreter(stub_python: Path):
    config = FleetConfig(backend="embedded", engine_python=stub_python)
    assert engine_python(config, "embedded") == sys.executable
    assert embedded_command(MODEL, ())[0] == sys.executable


def test_an_engine_without_an_environment_is_a_config_error(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Path):
    monkeypatch.setattr(engine_commands, "REPO_ROOT", tmp_path)  # no .engines/ there
    with pytest.raises(ConfigError, match=r"scripts/setup_vllm.sh.*--engine-python"):
        vllm_command(FleetConfig(backend="vllm"), MODEL, ())
    with pytest.raises(ConfigError, match="--engine-python"):
        sglang_command(FleetConfig(backend="sglang"), MODEL)
    with pytest.raises(ConfigError, match="not a file"):
        engine_python(FleetConfig(backend="vllm", engine_python=tmp_path / "nope"), "vllm")


def test_the_default_vllm_environment_is_the_one_setup_builds(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path):
    built = tmp_path / ".engines" / "vllm" / "bin" / "python"
    built.parent.mkdir(parents=True)
    built.write_text("")
    monkeypatch.setattr(engine_commands, "REPO_ROOT", tmp_path)
    assert vllm_command(FleetConfig(backend="vllm"), MODEL, ())[0] == str(built)


def test_vllm_engines_get_the_rl_routes_and_their_own_cores(monkeypatch: pytest.MonkeyPatch):
    for name in ("VLLM_SERVER_DEV_MODE", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND",
                 "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(engine_commands.os, "sched_getaffinity", lambda pid: {2, 3, 5, 7})
    first, second = (vllm_env(i, 2, ()) for i in range(2))
    assert first["VLLM_SERVER_DEV_MODE"] == "1" and first["HF_HUB_OFFLINE"] == "1"
    assert (first["OMP_NUM_THREADS"], first["VLLM_CPU_OMP_THREADS_BIND"]) == ("2", "2,3")
    assert second["VLLM_CPU_OMP_THREADS_BIND"] == "5,7"  # the cores this process may use
    assert vllm_env(0, 2, ("--num-threads", "1"))["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_env(0, 1, ())  # the user's setting stands
    elsewhere = vllm_env(0, 2, (), local=False)  # a Ray actor's node: its own cores and cache
    assert elsewhere["VLLM_SERVER_DEV_MODE"] == "1" and "OMP_NUM_THREADS" not in elsewhere


def test_vllm_needs_disk_weight_sync():
    with pytest.raises(RelaxError, match="disk"):
        _train_fleet("--rollout-backend", "vllm", "--weight-sync", "shm")
    assert FleetConfig(backend="vllm", weight_sync="auto").weight_sync == "auto"
