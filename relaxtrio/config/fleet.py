"""Where generation runs and how the engines are kept healthy and in sync: :class:`FleetConfig`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs

from .._errors import ConfigError
from .._validate import optional_positive_int, positive_int, positive_number

__all__ = [
    "BACKENDS",
    "Backend",
    "FleetConfig",
    "WeightSync",
]


WeightSync = Literal["auto", "disk", "shm"]
Backend = Literal["embedded", "sglang", "vllm"]
BACKENDS: tuple[Backend, ...] = ("embedded", "sglang", "vllm")


def _absolute_or_none(value: Path | str | None) -> Path | None:
    return None if value is None else Path(value).expanduser().resolve()


def _interpreter_or_none(value: Path | str | None) -> Path | None:
    # Not resolved: a venv's python is a symlink to the base interpreter, and running the
    # target would lose the venv.
    return None if value is None else Path(value).expanduser().absolute()


@attrs.frozen(kw_only=True)
class FleetConfig:
    """Where generation runs and how the workers are kept healthy and in sync.

    With no URL, ``num_engines`` engines are launched (SGLang where it and a GPU are present,
    the embedded engine otherwise), with a gateway in front when there are several.

    Attributes:
        router_url: base URL of an SGLang Model Gateway (``--sglang-router-url``): generation
            goes through it, control calls to every worker it lists.
        engine_urls: worker base URLs used without a gateway (``--engine-url``); relaxtrio
            spreads Sessions over them itself.
        num_engines: engines to launch when no URL is given (``--rollout-num-engines``).
        num_gpus: GPUs given to launched SGLang engines in total, or None for
            ``num_engines * num_gpus_per_engine``.
        num_gpus_per_engine: GPUs (tensor-parallel size) of one launched SGLang engine.
        sglang_args: extra ``sglang.launch_server`` flags (the ``--sglang-*`` flags without the
            ``sglang-`` part), passed to every launched SGLang engine.
        min_healthy_engines: the run stops when fewer healthy workers remain.
        weights_dir: absolute directory of the weight versions pushed to the engines (on storage
            every engine can read), or None for ``<run dir>/weights``.
        weight_sync: ``disk`` writes each version under ``weights_dir``; ``shm`` hands it over in
            shared memory (embedded engines on this machine only); ``auto`` picks ``shm`` when
            every worker is an embedded engine on this machine.
        session_lifecycle: when a Session ends, release its engine-side session state with
            ``/close_session`` on the worker that served it.
        health_interval_s: seconds between health probes of every worker.
        health_timeout_s: seconds a ``/health`` probe may take.
        health_failures: consecutive failed probes that remove a worker still accepting
            connections (a refused connection removes it at once).
        gateway_wait_s: seconds the gateway may stay unreachable before the run stops.
        engine_restarts: restarts of a launched embedded engine that died allowed within any
            ``engine_restart_window_s``; after more deaths in that window (a crash loop) the
            engine is not restarted and leaves the fleet (the run stops only below
            ``min_healthy_engines``).
        engine_restart_window_s: seconds of that window.
        startup_timeout_s: seconds a launched engine or gateway may take to answer ``/health``.
        backend: the engines' kind (``--rollout-backend``): ``embedded`` (relaxtrio's CPU
            engine), ``sglang`` or ``vllm``; None: launched engines are SGLang where it and a GPU
            are present, else embedded, and connected ones are told apart by their answers.
        engine_python: the interpreter of the launched engines' own environment
            (``--engine-python``; SGLang and vLLM pin their own torch), or None for the default:
            ``<repo>/.engines/<backend>/bin/python`` when present. The embedded engine always
            runs on relaxtrio's own interpreter.
    """

    router_url: str | None = None
    engine_urls: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    num_engines: int = attrs.field(default=1, validator=positive_int)
    num_gpus: int | None = attrs.field(default=None, validator=optional_positive_int)
    num_gpus_per_engine: int = attrs.field(default=1, validator=positive_int)
    sglang_args: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    min_healthy_engines: int = attrs.field(default=1, validator=positive_int)
    weights_dir: Path | None = attrs.field(default=None, converter=_absolute_or_none)
    weight_sync: WeightSync = "auto"
    session_lifecycle: bool = False
    health_interval_s: float = attrs.field(default=5.0, validator=positive_number)
    health_timeout_s: float = attrs.field(default=30.0, validator=positive_number)
    health_failures: int = attrs.field(default=2, validator=positive_int)
    gateway_wait_s: float = attrs.field(default=120.0, validator=positive_number)
    engine_restarts: int = attrs.field(
        default=3, validator=[attrs.validators.instance_of(int), attrs.validators.ge(0)])
    engine_restart_window_s: float = attrs.field(default=3600.0, validator=positive_number)
    startup_timeout_s: float = attrs.field(default=600.0, validator=positive_number)
    backend: Backend | None = None
    engine_python: Path | None = attrs.field(default=None, converter=_interpreter_or_none)

    def __attrs_post_init__(self) -> None:
        if self.router_url is not None and self.engine_urls:
            raise ConfigError.at("router_url", "give a gateway (router_url) or worker URLs "
                                 "(engine_urls), not both")
        if self.weight_sync not in ("auto", "disk", "shm"):
            raise ConfigError.at("weight_sync", f"must be auto, disk or shm, got {self.weight_sync!r}")
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError.at("backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.backend == "vllm" and self.weight_sync == "shm":
            # vLLM loads weights only from a checkpoint directory (collective_rpc reload_weights).
            raise ConfigError.at("weight_sync", "a vLLM engine reads new weights from disk only: "
                                 "use --weight-sync disk (or auto)")

    @property
    def launches(self) -> bool:
        """Whether relaxtrio starts the engines itself (no URL given)."""
        return self.router_url is None and not self.engine_urls
