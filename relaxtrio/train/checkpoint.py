"""Writing weights for the engine and full checkpoints, atomically.

Both writers go through ``PreTrainedModel.save_pretrained`` into a temporary directory next to
the target and then rename, so a reader (an engine reloading weights) sees either the previous
complete files or the new complete files, never a partial write. ``save_pretrained`` also handles
tied embeddings: safetensors refuses tensors that share storage, and transformers writes the
shared tensor once (for SmolLM2, ``model.embed_tokens.weight`` and no ``lm_head.weight``).

A loader that bypasses ``from_pretrained`` must therefore tolerate the missing tied key:
``model.load_state_dict(load_file(path), strict=False)`` keeps ``lm_head`` tied to the embedding
(check that ``missing_keys`` holds only tied names), as does ``safetensors.torch.load_model``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

import torch

__all__ = ["OPTIMIZER_FILE", "TOKENIZER_FILES", "save_checkpoint_dir", "save_weights_dir"]

TOKENIZER_FILES: Final = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "chat_template.jinja",
        "chat_template.json",
        "preprocessor_config.json",
        "processor_config.json",
    }
)
"""File names copied from ``tokenizer_dir`` into a checkpoint (plus any other ``*.jinja``); the
image processor's configs come along so a vision-language checkpoint can be served again."""

OPTIMIZER_FILE: Final = "optimizer.pt"

# Weights are renamed last, so a reader that sees the new weights also sees the new config.
_WEIGHT_SUFFIXES: Final = (".safetensors", ".safetensors.index.json")


def save_weights_dir(model: torch.nn.Module, out_dir: Path) -> Path:
    """Write ``model.safetensors``, ``config.json`` (and ``generation_config.json``) to ``out_dir``.

    Each file is replaced atomically (written to a temporary directory inside ``out_dir``, then
    ``os.replace``), weights last. Other files already in ``out_dir`` (a tokenizer) are kept.

    Args:
        model: a transformers ``PreTrainedModel``.
        out_dir: created if missing.

    Returns:
        ``out_dir``, ready for ``AutoModelForCausalLM.from_pretrained`` or an engine's
        update-weights-from-disk call.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tmp-weights-") as tmp:
        _save_pretrained(model, Path(tmp))
        names = sorted(os.listdir(tmp), key=lambda n: (n.endswith(_WEIGHT_SUFFIXES), n))
        for name in names:
            os.replace(Path(tmp) / name, out_dir / name)
    return out_dir


def save_checkpoint_dir(
    model: torch.nn.Module,
    out_dir: Path,
    *,
    tokenizer_dir: Path | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a complete Hugging Face model directory, replacing ``out_dir`` as a whole.

    The directory is assembled next to ``out_dir`` and renamed into place; an existing
    ``out_dir`` is moved aside first and deleted afterwards (two renames: a crash in between
    leaves the old checkpoint under ``.<name>.old-*``).

    Args:
        model: a transformers ``PreTrainedModel``.
        out_dir: the checkpoint directory to (re)create.
        tokenizer_dir: directory to copy tokenizer files from (:data:`TOKENIZER_FILES` and any
            ``*.jinja``), or None for weights + config only.
        optimizer_state: if given, ``torch.save``-d to ``out_dir / "optimizer.pt"``.

    Returns:
        ``out_dir``; ``AutoModelForCausalLM.from_pretrained(out_dir)`` (and
        ``AutoTokenizer.from_pretrained`` when a tokenizer was copied) load it.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` does not exist or holds no tokenizer file.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        _save_pretrained(model, tmp)
        if tokenizer_dir is not None:
            _copy_tokenizer(Path(tokenizer_dir), tmp)
        if optimizer_state is not None:
            torch.save(optimizer_state, tmp / OPTIMIZER_FILE)
        _ordinary_permissions(tmp)
        old = None
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
            os.replace(out_dir, old / "ckpt")
        os.replace(tmp, out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _ordinary_permissions(directory: Path) -> None:
    """Gives a directory made with ``mkdtemp`` (mode 0700) the modes a plain mkdir would have."""
    mask = os.umask(0)
    os.umask(mask)
    directory.chmod(0o777 & ~mask)
    for path in directory.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _save_pretrained(model: Any, directory: Path) -> None:
    # One shard: engines load exactly ``model.safetensors``.
    model.save_pretrained(directory, max_shard_size="1000GB")


def _copy_tokenizer(tokenizer_dir: Path, dest: Path) -> None:
    if not tokenizer_dir.is_dir():
        raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} is not a directory")
    copied = 0
    for path in sorted(tokenizer_dir.iterdir()):
        if path.is_file() and (path.name in TOKENIZER_FILES or path.suffix == ".jinja"):
            shutil.copy2(path, dest / path.name)
            copied += 1
    if not copied:
        raise FileNotFoundError(f"tokenizer_dir {tokenizer_dir} holds no tokenizer files")
