"""``python -m relaxtrio compare RUN_DIR...``: two or more runs' curves on one plot, and a table.

Reads each run's ``metrics.jsonl`` (docs/observability.md#step-metrics) and overlays, per step:
the mean train reward (``reward_mean``), each eval dataset's mean reward
(``eval/<name>/reward_mean``, on the steps that ran the eval) and the step's wall time
(``step_s``). The plot is one PNG with three panels sharing the step axis; the table gives, per
run, the steps, the first, last and best mean reward, the last eval rewards and the mean step time.
A run directory may be given as the directory or as its ``metrics.jsonl``. A run still running
may be appending a row: a last line without its newline that is not JSON yet is left out, with a
warning on stderr (a bad line anywhere else is an error).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._errors import ConfigError

__all__ = ["RunCurves", "compare_table", "load_run", "load_runs", "plot_runs", "run_compare"]

log = logging.getLogger(__name__)


def _number(value: Any) -> float:
    """A finite number, or NaN (missing, null, non-numeric)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value) if math.isfinite(value) else math.nan


@attrs.frozen(kw_only=True)
class RunCurves:
    """One run's curves, step by step (``len`` of every list == ``len(steps)``).

    Attributes:
        label: the name the plot and table use (the run directory's name, made unique).
        path: the ``metrics.jsonl`` read.
        steps: the rollout step of each row, in file order.
        reward: ``reward_mean`` per row (NaN when missing).
        step_s: ``step_s`` per row, in seconds (NaN when missing).
        evals: per eval dataset name, ``eval/<name>/reward_mean`` per row (NaN on rows without it).
    """

    label: str
    path: Path
    steps: tuple[int, ...]
    reward: tuple[float, ...]
    step_s: tuple[float, ...]
    evals: Mapping[str, tuple[float, ...]]

    @classmethod
    def of(cls, label: str, path: Path, rows: Sequence[Mapping[str, Any]]) -> RunCurves:
        """The curves of ``rows`` (metrics rows with ``step``)."""
        names = sorted({k.split("/")[1] for row in rows for k in row
                        if k.startswith("eval/") and k.endswith("/reward_mean") and k.count("/") == 2})
        return cls(
            label=label, path=path,
            steps=tuple(int(row["step"]) for row in rows),
            reward=tuple(_number(row.get("reward_mean")) for row in rows),
            step_s=tuple(_number(row.get("step_s")) for row in rows),
            evals={name: tuple(_number(row.get(f"eval/{name}/reward_mean")) for row in rows)
                   for name in names},
        )


def _metrics_path(run: Path) -> Path:
    """The ``metrics.jsonl`` of a run directory (or the file itself).

    Raises:
        ConfigError: the path does not exist, or the directory holds no ``metrics.jsonl``.
    """
    if not run.exists():
        raise ConfigError(f"run {str(run)!r} does not exist", param="RUN_DIR")
    path = run / "metrics.jsonl" if run.is_dir() else run
    if not path.is_file():
        raise ConfigError(f"run {str(run)!r} has no metrics.jsonl (is it a run directory?)",
                          param="RUN_DIR")
    return path


def _read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a last line without its newline that is not JSON (a row
    a live run is appending) is left out with a warning.

    Raises:
        ConfigError: a line is not a JSON object with an integer ``step``, or there is no row.
    """
    rows = []
    lines = path.read_bytes().split(b"\n")  # the last one is b"" after a final newline
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:  # per line: a live run's last line may end inside a UTF-8 character
            row = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            if number == len(lines):
                log.warning("%s:%d: left out a last line without its newline that is not JSON yet (%s; "
                            "a row the run is still writing?)", path, number, why)
                continue
            raise ConfigError(f"{path}:{number}: not JSON ({why})", param="RUN_DIR") from exc
        if not isinstance(row, dict) or isinstance(row.get("step"), bool) \
                or not isinstance(row.get("step"), int):
            raise ConfigError(f"{path}:{number}: not a metrics row (no integer 'step')", param="RUN_DIR")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path} has no metrics rows (the run finished no step)", param="RUN_DIR")
    return rows


def load_run(run: Path, label: str | None = None) -> RunCurves:
    """One run's curves from its directory (or its ``metrics.jsonl``).

    Args:
        run: the run directory or the metrics file.
        label: the run's name in the plot and table (default: the directory's name).

    Raises:
        ConfigError: the path does not exist, holds no ``metrics.jsonl``, or the file is empty
            or holds a line that is not a metrics row.
    """
    path = _metrics_path(Path(run))
    name = label or (path.parent.name if path.name == "metrics.jsonl" else path.stem)
    return RunCurves.of(name, path, _read_rows(path))


def load_runs(runs: Sequence[Path]) -> list[RunCurves]:
    """Each run's curves, labelled by directory name (the path when names repeat).

    Raises:
        ConfigError: fewer than two runs, or as :func:`load_run`.
    """
    if len(runs) < 2:
        raise ConfigError("compare needs at least two runs", param="RUN_DIR")
    curves = [load_run(run) for run in runs]
    names = [c.label for c in curves]
    if len(set(names)) < len(names):
        curves = [attrs.evolve(c, label=str(run)) for c, run in zip(curves, runs, strict=True)]
    return curves


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def _last(values: Sequence[float]) -> float:
    return next((v for v in reversed(values) if not math.isnan(v)), math.nan)


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def compare_table(runs: Sequence[RunCurves]) -> list[str]:
    """The table's lines: a header, then one line per run (``-`` for a value a run lacks)."""
    eval_names = sorted({name for run in runs for name in run.evals})
    header = ["run", "steps", "reward first", "reward last", "reward best", "step_s mean",
              *(f"eval {name} last" for name in eval_names)]
    lines = [header]
    for run in runs:
        rewards, times = _finite(run.reward), _finite(run.step_s)
        lines.append([
            run.label, str(len(run.steps)),
            _fmt(rewards[0] if rewards else math.nan), _fmt(_last(run.reward)),
            _fmt(max(rewards) if rewards else math.nan),
            _fmt(sum(times) / len(times) if times else math.nan, 2),
            *(_fmt(_last(run.evals.get(name, ()))) for name in eval_names),
        ])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
            for line in lines]


def plot_runs(runs: Sequence[RunCurves], out_path: Path) -> Path:
    """Writes the overlay PNG: reward, eval reward and step time per step, one colour per run.

    Args:
        runs: the runs' curves.
        out_path: the PNG to write (its parent directory is created).

    Returns:
        ``out_path``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reward_ax, eval_ax, time_ax) = plt.subplots(3, 1, figsize=(7, 9), dpi=100, sharex=True)
    for i, run in enumerate(runs):
        colour = f"C{i % 10}"
        reward_ax.plot(run.steps, run.reward, marker="o", color=colour, label=run.label)
        for k, (name, values) in enumerate(sorted(run.evals.items())):
            points = [(s, v) for s, v in zip(run.steps, values, strict=True) if not math.isnan(v)]
            if points:
                eval_ax.plot(*zip(*points, strict=True), marker="os^vD"[k % 5], color=colour,
                             label=f"{run.label}: {name}")
        time_ax.plot(run.steps, run.step_s, marker="o", color=colour, label=run.label)
    reward_ax.set_ylabel("train reward (mean)")
    eval_ax.set_ylabel("eval reward (mean)")
    time_ax.set_ylabel("step time (s)")
    time_ax.set_xlabel("rollout step")
    reward_ax.set_title("relaxtrio: " + " vs ".join(run.label for run in runs))
    for ax in (reward_ax, eval_ax, time_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    if not eval_ax.lines:
        eval_ax.text(0.5, 0.5, "no eval in these runs", ha="center", va="center",
                     transform=eval_ax.transAxes)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path


def run_compare(runs: Sequence[Path], out_path: Path) -> list[str]:
    """Loads the runs, writes the plot and returns the lines to print (table, then the PNG path).

    Raises:
        ConfigError: as :func:`load_runs`, or ``out_path`` is not a ``.png`` file path.
    """
    if out_path.suffix.lower() != ".png" or out_path.is_dir():
        raise ConfigError(f"--out {out_path}: the plot is written as a PNG file (a path ending in .png)")
    curves = load_runs(runs)
    plot_runs(curves, out_path)
    return [*compare_table(curves), f"plot: {out_path}"]
