"""Which experiment trackers a run writes to (:class:`TrackerConfig`) and where its spans go
(:class:`TracingConfig`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import attrs

__all__ = [
    "TrackerConfig",
    "TracingConfig",
    "WandbMode",
]


WandbMode = Literal["online", "offline", "disabled"]


@attrs.frozen(kw_only=True)
class TrackerConfig:
    """Which trackers a run writes to.

    Attributes:
        tensorboard_dir: event-file directory (``--use-tensorboard``; default
            ``<run dir>/tensorboard``), or None for no TensorBoard.
        wandb_dir: directory W&B writes its run under (``<run dir>``), or None for no W&B.
        wandb_project: W&B project name.
        wandb_mode: ``online``, ``offline`` (no network needed) or ``disabled``; None lets W&B
            decide (``WANDB_MODE``, else online).
        wandb_run_name: the W&B run name, or None for W&B's own.
    """

    tensorboard_dir: Path | None = None
    wandb_dir: Path | None = None
    wandb_project: str = "relaxtrio"
    wandb_mode: WandbMode | None = None
    wandb_run_name: str | None = None

    @property
    def enabled(self) -> bool:
        """Whether any tracker is configured."""
        return self.tensorboard_dir is not None or self.wandb_dir is not None


@attrs.frozen(kw_only=True)
class TracingConfig:
    """Where a run's OpenTelemetry spans go (:mod:`relaxtrio.tracing`, docs/observability.md).

    Attributes:
        endpoint: an OTLP/HTTP traces endpoint (``--otel-endpoint``, e.g.
            ``http://127.0.0.1:4318/v1/traces``), or None.
        file: a file the spans are appended to as JSON lines (``--otel-file``), or None.
    """

    endpoint: str | None = None
    file: Path | None = None

    @property
    def enabled(self) -> bool:
        """Whether spans are recorded at all (without it, the SDK is never imported)."""
        return self.endpoint is not None or self.file is not None
