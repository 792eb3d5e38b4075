"""Debug rollout dumps and rollout-only sample files: writing and loading (docs/dumps.md).

A *dump* is one JSON document per rollout step (``--save-debug-rollout-data PATH``, where
``PATH`` contains ``{rollout_id}``). It holds every Group the step saw (accepted and dropped),
each Session's metadata, terminal status and reason, turn and abort counts, timing and complete
SessionForest (:func:`~relaxtrio.forest.forest_to_json`), the samples with their rewards and
advantages, and, after training, the trainer's settings and statistics; enough for
``python -m relaxtrio replay`` to recompute the step without agents or engines.

A *samples file* (``python -m relaxtrio rollout``) is JSONL, one sample record per line, the same
record a dump lists under ``samples`` plus ``rollout_id``.

Pure Python and JSON: no torch here, so a dump can be read anywhere the package imports. A path
ending in ``.gz`` is written and read gzip-compressed.
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, Literal

import attrs

from .._errors import ConfigError
from ..forest import (
    TrainingSample,
    forest_to_json,
    sample_from_json,
    sample_leaf_hash,
    sample_to_json,
)
from ..nursery.group import Group
from ..nursery.session import Session
from .step import StepResult

DUMP_FORMAT: Final = 1
"""Version of the dump layout (docs/dumps.md); :func:`load_dump` refuses other versions."""

ROLLOUT_ID_FIELD: Final = "{rollout_id}"

GroupStatus = Literal["accepted", "dropped", "served"]


def check_dump_template(template: str, *, flag: str = "--save-debug-rollout-data") -> str:
    """Checks a dump path template: it must contain ``{rollout_id}`` and nothing else in braces.

    Returns:
        ``template`` unchanged.

    Raises:
        ConfigError: the template has no ``{rollout_id}`` (every step would overwrite
            the previous one) or another ``{...}`` field.
    """
    if ROLLOUT_ID_FIELD not in template:
        raise ConfigError(
            f"{flag} {template!r} must contain {ROLLOUT_ID_FIELD} (one file per rollout step), "
            f"e.g. runs/dump/rollout_{ROLLOUT_ID_FIELD}.json", param=flag)
    try:
        template.format(rollout_id=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"{flag} {template!r} may use only the {ROLLOUT_ID_FIELD} field ({exc!r})", param=flag
        ) from exc
    return template


def dump_path(template: str, rollout_id: int | str) -> Path:
    """The file of step ``rollout_id`` (an int, or ``eval_<id>`` style names)."""
    return Path(template.format(rollout_id=rollout_id))


def jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as None, paths as strings, tuples as lists (recursively)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def session_record(session: Session) -> dict[str, Any]:
    """Everything a dump records about one Session (its forest included).

    Returns:
        ``session_id``, ``group_id``, ``index``, ``mode``, ``status``, ``reason`` (why it
        failed, or None), ``num_requests`` (model requests received), ``turn_count`` (response
        nodes committed), ``abort`` (aborted generations, abort calls sent, protection),
        ``timing`` (seconds: summed turn wall and generation time, agent active time),
        ``agent`` (exit code), ``weight_versions`` (every version that sampled a token),
        ``input``, ``dataset_metadata``, ``exported`` (leaf hashes of its samples) and
        ``forest``.
    """
    exported = [h for h in (sample_leaf_hash(s) for s in session.samples) if h is not None]
    responses = [n for n in session.forest.nodes() if n.kind == "response"]
    partial = session.partial.statistics()
    versions = dict.fromkeys(span.version for n in responses for span in n.weight_versions)
    return {
        "session_id": session.session_id,
        "group_id": session.group.group_id,
        "index": session.index,
        "mode": session.mode,
        "status": session.status,
        "reason": session.error,
        "num_requests": session.num_requests,
        "turn_count": len(responses),
        "abort": {
            "num_aborted": partial.num_aborted,
            "num_abort_requests": partial.num_abort_requests,
            "max_node_abort_count": max((n.abort_count for n in responses), default=0),
            "protected": partial.protected,
        },
        "timing": {
            "turn_wall_s": math.fsum(n.wall_s for n in responses),
            "generation_s": math.fsum(n.generation_s for n in responses),
            "agent_active_s": session.agent_active_s,
        },
        "agent": {"return_code": session.agent_return_code},
        "weight_versions": list(versions),
        "input": session.input_payload,
        "dataset_metadata": session.dataset_metadata,
        "exported": exported,
        "forest": forest_to_json(session.forest, exported=exported),
    }


def group_record(group: Group, *, status: GroupStatus) -> dict[str, Any]:
    """One Group with its Sessions (see :func:`session_record`)."""
    return {
        "group_id": group.group_id,
        "mode": group.mode,
        "prompt_index": group.prompt_index,
        "status": status,
        "dropped_reason": group.dropped_reason,
        "rollout_id": group.rollout_id,
        "sessions": [session_record(s) for s in group.sessions],
    }


def sample_record(
    sample: TrainingSample,
    *,
    group_id: str,
    index: int,
    scalar_reward: float | None,
    advantage: float | None,
) -> dict[str, Any]:
    """One sample as dumps and samples files store it.

    Args:
        sample: the exported context.
        group_id: its Group.
        index: position in the step's sample list (the trainer's order).
        scalar_reward: the primary reward the advantage came from, or None.
        advantage: the credit the trainer got, or None (not scored).
    """
    return {
        "index": index,
        "group_id": group_id,
        **sample_to_json(sample),
        "scalar_reward": scalar_reward,
        "advantage": advantage,
    }


def step_samples(result: StepResult) -> list[dict[str, Any]]:
    """The sample records of a step, in the order the trainer receives them."""
    records: list[dict[str, Any]] = []
    for group in result.groups:
        for scored in group.scored:
            records.append(sample_record(scored.sample, group_id=group.group.group_id, index=len(records),
                                         scalar_reward=scored.reward, advantage=scored.advantage))
    return records


def step_dump(result: StepResult, **extra: Any) -> dict[str, Any]:
    """The dump document of one rollout step.

    Args:
        result: the step's result (accepted and dropped Groups).
        **extra: more top-level sections, e.g. ``train`` (the trainer's statistics),
            ``trainer_config``, ``generation``, ``model_dir``.
    """
    groups = [group_record(g.group, status="accepted") for g in result.groups]
    groups += [group_record(g, status="dropped") for g in result.dropped]
    return {
        "format": DUMP_FORMAT,
        "rollout_id": result.rollout_id,
        "rollout_s": result.rollout_s,
        "aborted_requests": result.aborted_requests,
        "resident_groups": result.resident_groups,
        "groups": groups,
        "samples": step_samples(result),
        **extra,
    }


def _open(path: Path, mode: Literal["rt", "wt", "at"]) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return path.open(mode, encoding="utf-8")


def write_dump(path: Path, payload: Mapping[str, Any]) -> Path:
    """Writes one dump document atomically (temporary file, then rename); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + (".gz" if path.suffix == ".gz" else ""))
    with _open(tmp, "wt") as f:
        json.dump(jsonable(payload), f, ensure_ascii=False, allow_nan=False)
    tmp.replace(path)
    return path


def append_samples(path: Path, rollout_id: int, records: Iterable[Mapping[str, Any]]) -> int:
    """Appends sample records as JSONL lines with ``rollout_id``; returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with _open(path, "at") as f:
        for record in records:
            f.write(json.dumps(jsonable({"rollout_id": rollout_id, **record}), ensure_ascii=False,
                               allow_nan=False) + "\n")
            count += 1
    return count


@attrs.frozen(kw_only=True)
class DumpedSample:
    """One sample of a dump.

    Attributes:
        sample: the TrainingSample (media of multimodal samples are not in dumps).
        index: its position in the step's sample list.
        group_id: its Group.
        scalar_reward: the primary reward, or None.
        advantage: the recorded credit, or None.
        num_multimodal_inputs: media the original sample carried (0 for text).
    """

    sample: TrainingSample
    index: int
    group_id: str
    scalar_reward: float | None
    advantage: float | None
    num_multimodal_inputs: int = 0


@attrs.frozen(kw_only=True)
class RolloutDump:
    """A loaded dump (see :func:`load_dump`).

    Attributes:
        path: where it was read from.
        rollout_id: the step (an int, or a string such as ``serve``).
        groups: the Group records, accepted first, as written.
        samples: the samples in trainer order.
        data: the whole document (``train``, ``trainer_config``, ``generation``, ... when
            present).
    """

    path: Path
    rollout_id: int | str
    groups: tuple[dict[str, Any], ...] = attrs.field(repr=False)
    samples: tuple[DumpedSample, ...] = attrs.field(repr=False)
    data: dict[str, Any] = attrs.field(repr=False)

    def sessions(self) -> list[dict[str, Any]]:
        """Every Session record, Group by Group."""
        return [s for g in self.groups for s in g["sessions"]]

    def session(self, session_id: str) -> dict[str, Any]:
        """The record of one Session.

        Raises:
            KeyError: no Session with this id in the dump.
        """
        for record in self.sessions():
            if record["session_id"] == session_id:
                return record
        raise KeyError(session_id)

    def section(self, name: str) -> dict[str, Any] | None:
        """A top-level section such as ``train`` or ``trainer_config``, or None if absent."""
        value = self.data.get(name)
        return value if isinstance(value, dict) else None


def load_dump(path: Path) -> RolloutDump:
    """Reads a dump written by :func:`write_dump` (plain or ``.gz``).

    Raises:
        ConfigError: not a JSON object, another dump format version, or a sample
            record that is not a valid TrainingSample (``param`` names the field).
        OSError: the file cannot be read.
    """
    path = Path(path)
    try:
        with _open(path, "rt") as f:
            data = json.load(f)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not a relaxtrio dump (invalid JSON: {exc.msg})") from exc
    if not isinstance(data, dict) or data.get("format") != DUMP_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{path} is not a relaxtrio dump of format {DUMP_FORMAT} (found {found!r})",
                                  param="format")
    return RolloutDump(path=path, rollout_id=data.get("rollout_id"), groups=tuple(data.get("groups", ())),
                       samples=tuple(_dumped_samples(data.get("samples", ()))), data=data)


def _dumped_samples(records: Sequence[Mapping[str, Any]]) -> Iterator[DumpedSample]:
    for i, record in enumerate(records):
        try:
            sample = sample_from_json(record)
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(f"samples[{i}] is not a valid sample: {exc!r}",
                                      param=f"samples[{i}]") from exc
        yield DumpedSample(
            sample=sample, index=int(record.get("index", i)), group_id=str(record.get("group_id")),
            scalar_reward=record.get("scalar_reward"), advantage=record.get("advantage"),
            num_multimodal_inputs=int(record.get("num_multimodal_inputs", 0)),
        )
