"""Reading tracker files back: TensorBoard event files and W&B offline run files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_WANDB_BLOCK_BYTES = 32768
_WANDB_HEADER_BYTES = 7  # ":W&B", a 2-byte magic, a 1-byte version
_RECORD_HEADER_BYTES = 7  # crc32, length (2 bytes), type (1 byte); leveldb log format


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the event files under ``log_dir`` → its ``(step, value)`` points."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _wandb_records(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, records, pending = _WANDB_HEADER_BYTES, [], b""
    while pos + _RECORD_HEADER_BYTES <= len(data):
        left = _WANDB_BLOCK_BYTES - pos % _WANDB_BLOCK_BYTES
        if left < _RECORD_HEADER_BYTES:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + _RECORD_HEADER_BYTES])
        pos += _RECORD_HEADER_BYTES
        if kind == 0 and length == 0:
            break
        pending += data[pos:pos + length]
        pos += length
        if kind in (1, 4):  # FULL, or LAST of a split record
            records.append(pending)
            pending = b""
    return records


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The logged history rows of the one offline W&B run under ``run_dir/wandb``."""
    from wandb.proto import wandb_internal_pb2

    [path] = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    rows = []
    for raw in _wandb_records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
