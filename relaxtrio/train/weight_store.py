"""Where the trainer puts each new weight version for the engines to load (synchronous, torch).

Two stores, one interface (:meth:`write` returns the ``model_path`` every engine loads,
:meth:`retire` drops what no engine needs any more, :meth:`close` removes everything):

- :class:`DiskWeightStore`: version ``v`` is written to ``<root>/<v>/`` (``model.safetensors`` +
  ``config.json``). ``root`` is absolute, so an engine with another working directory, or on
  another host sharing the storage, reads the same files. After every engine loaded ``v``, the
  older version directories are deleted; the current one stays, for an engine that restarts.
- :class:`ShmWeightStore`: the shared-memory mailbox of :mod:`relaxtrio.shm_weights`, for
  embedded engines on this machine: one memory copy on each side, nothing through the disk.

May import: torch and :mod:`relaxtrio.shm_weights`.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

import torch

from ..shm_weights import ShmWeightWriter
from .checkpoint import save_weights_dir

__all__ = ["DiskWeightStore", "ShmWeightStore", "WeightStore", "open_weight_store"]

log = logging.getLogger(__name__)


class DiskWeightStore:
    """Versions as directories under an absolute ``root``.

    Args:
        root: the weights directory (made absolute; created if missing).
    """

    kind: Literal["disk"] = "disk"

    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._written: list[Path] = []

    def write(self, model: torch.nn.Module, version: str, *,
              state_dict: Mapping[str, torch.Tensor] | None = None) -> str:
        """Write ``model``'s weights (or ``state_dict`` in its layout) as version ``version``;
        returns its absolute directory."""
        path = save_weights_dir(model, self.root / version,
                                state_dict=None if state_dict is None else dict(state_dict))
        if path not in self._written:
            self._written.append(path)
        return str(path)

    def write_saved(self, save: Callable[[Path], Path], version: str) -> str:
        """Have ``save`` write version ``version`` into its directory; returns that directory.

        For a trainer that writes its own weights (rank 0 of a sharded trainer gathers the
        full state dict, :meth:`relaxtrio.train.ranks.RankGroup.save_weights`).
        """
        path = Path(save(self.root / version)).resolve()
        if path not in self._written:
            self._written.append(path)
        return str(path)

    def retire(self, current: str) -> None:
        """Delete every version this store wrote except ``current`` (a path from :meth:`write`)."""
        keep = Path(current)
        for path in [p for p in self._written if p != keep]:
            shutil.rmtree(path, ignore_errors=True)
            self._written.remove(path)
            log.debug("removed old weight version %s", path)

    def close(self) -> None:
        """Delete every version this store wrote (the run is over)."""
        for path in self._written:
            shutil.rmtree(path, ignore_errors=True)
        self._written.clear()
        try:
            self.root.rmdir()
        except OSError:
            pass  # not empty (someone else's files) or already gone


class ShmWeightStore:
    """One shared-memory mailbox, overwritten in place each version."""

    kind: Literal["shm"] = "shm"

    def __init__(self, root: Path | None = None) -> None:
        self._writer = ShmWeightWriter(root)

    @property
    def directory(self) -> Path:
        """The mailbox directory (under ``/dev/shm``)."""
        return self._writer.directory

    def write(self, model: torch.nn.Module, version: str, *,
              state_dict: Mapping[str, torch.Tensor] | None = None) -> str:
        """Copy ``model``'s weights (or ``state_dict``) into the mailbox; returns the manifest path."""
        return str(self._writer.write(model, version, state_dict=state_dict))

    def retire(self, current: str) -> None:
        """Nothing to retire: the mailbox holds one version."""

    def close(self) -> None:
        """Remove the mailbox."""
        self._writer.close()


WeightStore = DiskWeightStore | ShmWeightStore


def open_weight_store(kind: Literal["disk", "shm"], root: Path) -> WeightStore:
    """A store of the given kind (``root`` is the disk store's directory)."""
    return ShmWeightStore() if kind == "shm" else DiskWeightStore(root)
