"""The shared-memory weight mailbox: round trip, tied tensors once, orphans of dead writers."""

from __future__ import annotations

import pytest

import subprocess
import sys
from pathlib import Path

import torch

from relaxtrio.engine._weights import load_weights_from_disk
from relaxtrio.models import load_model
from relaxtrio.shm_weights import ShmWeightWriter, is_shm_manifest, read_shm_weights


def test_a_written_version_loads_into_an_engine_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    trainer, engine = load_model(tiny_model_dir), load_model(tiny_model_dir)
    with torch.no_grad():
        for param in trainer.parameters():
            param.add_(0.01)
    writer = ShmWeightWriter(tmp_path)
    manifest = writer.write(trainer, "step-1")
    assert is_shm_manifest(manifest)
    tensors = read_shm_weights(manifest)
    # Tied embeddings are stored once, as save_pretrained does.
    assert len(tensors) < len(trainer.state_dict())
    load_weights_from_disk(engine, manifest)
    for (name, a), b in zip(trainer.state_dict().items(), engine.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    writer.close()
    assert not writer.directory.exists()


@pytest.mark.slow
def test_mailboxes_of_dead_writers_are_removed(tiny_model_dir: Path, tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    orphan = tmp_path / f"relaxtrio-weights-{dead.stdout.strip()}-abc"
    orphan.mkdir()
    writer = ShmWeightWriter(tmp_path)
    assert not orphan.exists() and writer.directory.exists()
    writer.close()
