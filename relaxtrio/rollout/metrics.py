"""Per-step metrics: one JSON line per step, and a reward-per-step plot at the end."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._atomic import write_text_atomic


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


@attrs.define(kw_only=True)
class MetricsLog:
    """Appends one JSON object per step to ``path`` (created with its parent directory)."""

    path: Path = attrs.field(converter=Path)
    rows: list[dict[str, Any]] = attrs.field(factory=list)

    @classmethod
    def fresh(cls, path: Path) -> MetricsLog:
        """A log that starts empty: a previous run's file at ``path`` is replaced, not appended to."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")
        return cls(path=path)

    @classmethod
    def resumed(cls, path: Path, rows: Sequence[Mapping[str, Any]]) -> MetricsLog:
        """A log that continues a checkpointed run: ``path`` is rewritten to hold exactly ``rows``.

        Rows the interrupted run appended after its checkpoint (steps that run again now) are
        removed, so every step appears once. The rewrite is atomic (temp file, fsync, rename).
        """
        path = Path(path)
        kept = [dict(row) for row in rows]
        write_text_atomic(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in kept))
        return cls(path=path, rows=kept)

    def append(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Writes ``{"step": step, **metrics}`` as one line (NaN/inf written as null)."""
        row = {"step": step, **{k: _finite_or_none(v) for k, v in metrics.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
        self.rows.append(row)
        return row


def plot_rewards(rows: list[Mapping[str, Any]], out_path: Path) -> Path:
    """Writes a PNG of mean reward (± std) per step.

    Args:
        rows: metric rows with ``step``, ``reward_mean`` and ``reward_std``.
        out_path: the PNG file to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    mean = [r.get("reward_mean") if r.get("reward_mean") is not None else math.nan for r in rows]
    std = [r.get("reward_std") if r.get("reward_std") is not None else 0.0 for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    ax.errorbar(steps, mean, yerr=std, marker="o", capsize=4)
    ax.set_xlabel("rollout step")
    ax.set_ylabel("reward (mean ± std over samples)")
    ax.set_title("relaxtrio: reward per step")
    ax.set_xticks(steps)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
