"""Experiment trackers beside ``metrics.jsonl``: TensorBoard (``--use-tensorboard``) and Weights &
Biases (``--use-wandb``).

Every numeric value of a step's metrics row is sent under a family name
(:func:`family_scalars`): ``rollout/`` (rewards, lengths, Group accounting), ``train/`` (loss,
clip fraction, KL, gradient norm, entropy, logprob difference, tokens), ``perf/`` (seconds and
tokens/s), and the families the row already carries (``stop_reason/``, ``num_turn/``,
``eval/``, and per engine ``engine/<figure>/<host:port>`` and ``gateway/<figure>/<host:port>``). The x axis is the rollout step. The JSONL keeps its flat keys (what resume, the reward
plot and existing readers use).

Both trackers are optional installs (the ``trackers`` extra pins them) and are imported only when
asked for. W&B runs ``online`` unless ``--wandb-mode offline`` (or ``WANDB_MODE=offline``) is
given; offline it writes the run under ``<run dir>/wandb/`` and needs no network or account
(``wandb sync`` uploads it later).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs

from .._errors import ConfigError
from ..config import TrackerConfig

log = logging.getLogger(__name__)

_TRAIN_KEYS = frozenset({"loss", "clip_fraction", "ppo_kl", "grad_norm", "entropy",
                         "rollout_logprob_abs_diff", "train_tokens"})


def family_of(key: str) -> str:
    """The tracker name of a flat metrics key (keys with a ``/`` already name their family)."""
    if "/" in key:
        return key
    if key in _TRAIN_KEYS:
        return f"train/{key}"
    if key.endswith("_s"):  # durations and rates (``*_per_s``)
        return f"perf/{key}"
    return f"rollout/{key}"


def family_scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row under their family names (``step`` and lists left out)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if math.isfinite(value):
            out[family_of(key)] = float(value)
    return out


class Tracker(Protocol):
    """One tracker: receives each step's scalars, closed at the end of the run."""

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        """Records ``scalars`` at rollout step ``step``."""
        ...

    def close(self) -> None:
        """Flushes and closes the tracker."""
        ...


class _TensorBoard:
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _Wandb:
    def __init__(self, cfg: TrackerConfig, run_config: Mapping[str, Any]) -> None:
        import wandb

        assert cfg.wandb_dir is not None
        cfg.wandb_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(project=cfg.wandb_project, dir=str(cfg.wandb_dir), mode=cfg.wandb_mode,
                               name=cfg.wandb_run_name, config=dict(run_config))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self._run.log(dict(scalars), step=step)

    def close(self) -> None:
        self._run.finish()


def _missing(package: str, flag: str) -> ConfigError:
    return ConfigError(f"{flag} needs the {package!r} package: pip install 'relaxtrio[trackers]'",
                       param=flag)


def check_trackers_installed(cfg: TrackerConfig) -> None:
    """Fails early when a configured tracker's package is not installed.

    Raises:
        ConfigError: ``tensorboard`` or ``wandb`` is missing (the message names the flag).
    """
    import importlib.util

    if cfg.tensorboard_dir is not None and importlib.util.find_spec("tensorboard") is None:
        raise _missing("tensorboard", "--use-tensorboard")
    if cfg.wandb_dir is not None and importlib.util.find_spec("wandb") is None:
        raise _missing("wandb", "--use-wandb")


@attrs.define(eq=False)
class Trackers:
    """The run's trackers; :meth:`log` sends a metrics row to each. Build with :meth:`open`."""

    trackers: list[Tracker] = attrs.field(factory=list)

    @classmethod
    def open(cls, cfg: TrackerConfig, run_config: Mapping[str, Any] | None = None) -> Trackers:
        """Starts the configured trackers (blocking: W&B starts a helper process).

        Args:
            cfg: which trackers.
            run_config: the run's settings, recorded by W&B as the run config.

        Raises:
            ConfigError: a configured tracker's package is not installed.
        """
        check_trackers_installed(cfg)
        opened = cls()
        if cfg.tensorboard_dir is not None:
            opened.trackers.append(_TensorBoard(cfg.tensorboard_dir))
            log.info("TensorBoard events: %s", cfg.tensorboard_dir)
        if cfg.wandb_dir is not None:
            opened.trackers.append(_Wandb(cfg, run_config or {}))
            log.info("W&B run under %s (mode %s)", cfg.wandb_dir / "wandb", cfg.wandb_mode or "default")
        return opened

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        """Sends the numbers of a metrics row, under family names, to every tracker."""
        if not self.trackers:
            return
        scalars = family_scalars(row)
        for tracker in self.trackers:
            tracker.log(step, scalars)

    def close(self) -> None:
        """Closes every tracker (each once)."""
        while self.trackers:
            self.trackers.pop().close()
