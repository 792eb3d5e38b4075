"""Weights from the trainer to embedded engines on the same machine, through shared memory.

A *mailbox* is a directory (under ``/dev/shm`` when it exists) holding two files:

- ``weights.bin``: every tensor's bytes back to back, each at a 64-byte aligned offset;
- ``manifest.json``: ``{"format", "version", "file", "tensors": [{"name", "dtype", "shape",
  "offset", "nbytes"}]}``, replaced atomically after the bytes are written.

The trainer maps ``weights.bin`` once and copies each parameter into its slice (one memory copy
per step, no serialization, no new file). An embedded engine is handed the manifest's path as
``model_path`` of ``/update_weights_from_disk``; it maps the same file and copies the slices into
its own parameters (one more memory copy; nothing is read from disk and no full copy of the model
is allocated). Tensors that share storage (tied embeddings) are stored once, under the first
name, as ``save_pretrained`` does.

The mailbox holds one version at a time: the caller must not write while an engine loads (the
driver writes, then updates every engine, then trains again). Its directory is named after the
writing process (``relaxtrio-weights-<pid>-<random>``); :meth:`ShmWeightWriter.close` removes it,
and a new writer removes the mailboxes of writers that died without closing (a SIGKILLed
driver), so shared memory does not fill up across runs.

May import: torch (no other relaxtrio package).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch

__all__ = ["MANIFEST_NAME", "ShmWeightWriter", "is_shm_manifest", "read_shm_weights"]

MANIFEST_NAME: Final = "manifest.json"
FORMAT: Final = "relaxtrio-shm-weights/1"
_DATA_NAME: Final = "weights.bin"
_ALIGN_BYTES: Final = 64
_SHM_ROOT: Final = Path("/dev/shm")
_PREFIX: Final = "relaxtrio-weights-"


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in the shared-memory manifest")
    return dtype


def is_shm_manifest(path: Path) -> bool:
    """Whether ``path`` is a mailbox manifest (what the engine receives as ``model_path``)."""
    return path.name == MANIFEST_NAME and path.is_file() and (path.parent / _DATA_NAME).is_file()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_orphans(base: Path) -> None:
    """Remove mailboxes in ``base`` whose writing process no longer exists."""
    for path in base.glob(f"{_PREFIX}*-*"):
        pid = path.name[len(_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _unique_tensors(state_dict: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    out = []
    for name, tensor in state_dict.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        out.append((name, tensor))
    return out


class ShmWeightWriter:
    """The trainer's side of a mailbox; remove it with :meth:`close`.

    Args:
        root: directory to create the mailbox in (default: ``/dev/shm`` when present, else the
            system temp directory).

    Attributes:
        directory: the mailbox directory.
        manifest_path: what to pass to the engines as ``model_path``.
    """

    def __init__(self, root: Path | None = None) -> None:
        base = root or (_SHM_ROOT if _SHM_ROOT.is_dir() else Path(tempfile.gettempdir()))
        _remove_orphans(base)
        self.directory = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)).resolve()
        self.manifest_path = self.directory / MANIFEST_NAME
        self._buffer: torch.Tensor | None = None
        self._layout: list[dict[str, Any]] = []

    def _plan(self, tensors: list[tuple[str, torch.Tensor]]) -> tuple[list[dict[str, Any]], int]:
        layout, offset = [], 0
        for name, tensor in tensors:
            nbytes = tensor.numel() * tensor.element_size()
            layout.append({"name": name, "dtype": str(tensor.dtype).removeprefix("torch."),
                           "shape": list(tensor.shape), "offset": offset, "nbytes": nbytes})
            offset += -(-nbytes // _ALIGN_BYTES) * _ALIGN_BYTES
        return layout, offset

    def write(self, model: torch.nn.Module, version: str, *,
              state_dict: Mapping[str, torch.Tensor] | None = None) -> Path:
        """Copy ``model``'s weights into the mailbox and publish ``version``.

        Args:
            model: the trained model (CPU tensors; other devices are copied to CPU).
            version: the version label recorded in the manifest.
            state_dict: the tensors to publish instead of ``model``'s own (a LoRA trainer's
                merged weights, in the base model's layout).

        Returns:
            The manifest path (an engine's ``model_path``).
        """
        tensors = _unique_tensors(model.state_dict() if state_dict is None else state_dict)
        layout, total = self._plan(tensors)
        if self._buffer is None or layout != self._layout:
            data = self.directory / _DATA_NAME
            with data.open("wb") as f:
                f.truncate(max(total, 1))
            self._buffer = torch.from_file(str(data), shared=True, size=max(total, 1),
                                           dtype=torch.uint8)
            self._layout = layout
        with torch.no_grad():
            for entry, (_, tensor) in zip(layout, tensors, strict=True):
                view = self._buffer[entry["offset"]:entry["offset"] + entry["nbytes"]]
                view.view(tensor.dtype).view(tensor.shape).copy_(tensor.detach())
        manifest = {"format": FORMAT, "version": version, "file": _DATA_NAME, "tensors": layout}
        tmp = self.manifest_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(manifest), encoding="utf-8")
        os.replace(tmp, self.manifest_path)
        return self.manifest_path

    def close(self) -> None:
        """Remove the mailbox (engines that mapped it keep their own copy of the weights)."""
        self._buffer = None
        shutil.rmtree(self.directory, ignore_errors=True)


def read_shm_weights(manifest_path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a mailbox as views of the mapped file (no copy is made here).

    Args:
        manifest_path: the mailbox's ``manifest.json``.

    Returns:
        name → tensor; each shares memory with the mailbox, so copy it before the next write.

    Raises:
        ValueError: not a mailbox manifest of this format, or a tensor outside the file.
    """
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path} is not a {FORMAT} manifest")
    data = manifest_path.parent / manifest["file"]
    size = data.stat().st_size
    buffer = torch.from_file(str(data), shared=False, size=size, dtype=torch.uint8)
    tensors = {}
    for entry in manifest["tensors"]:
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        if offset < 0 or offset + nbytes > size:
            raise ValueError(f"tensor {entry['name']} lies outside {data}")
        dtype = _dtype(entry["dtype"])
        tensors[entry["name"]] = buffer[offset:offset + nbytes].view(dtype).view(entry["shape"])
    return tensors
