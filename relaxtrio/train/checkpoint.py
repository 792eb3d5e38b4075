"""Writing weights for the engine, full checkpoints and resumable run checkpoints, atomically.

Both HF writers go through ``PreTrainedModel.save_pretrained`` into a temporary directory next to
the target and then rename, so a reader (an engine reloading weights) sees either the previous
complete files or the new complete files, never a partial write. ``save_pretrained`` also handles
tied embeddings: safetensors refuses tensors that share storage, and transformers writes the
shared tensor once (for SmolLM2, ``model.embed_tokens.weight`` and no ``lm_head.weight``).

A loader that bypasses ``from_pretrained`` must therefore tolerate the missing tied key:
``model.load_state_dict(load_file(path), strict=False)`` keeps ``lm_head`` tied to the embedding
(check that ``missing_keys`` holds only tied names), as does ``safetensors.torch.load_model``.

Run checkpoints (``--save DIR`` / ``--load DIR``) have this layout::

    DIR/
      latest                  # one line, e.g. "iter_0000002": the newest complete checkpoint
      iter_0000001/           # after 1 completed rollout step (the previous one, kept)
      iter_0000002/           # after 2 completed rollout steps
        config.json, generation_config.json, model.safetensors   # the policy (HF layout)
        tokenizer.json, tokenizer_config.json, chat_template.jinja, ...  # when available
        optimizer.pt          # {"optimizer": AdamW state_dict, "num_optimizer_steps": int}
                              # (or optimizer.dcp/ when W FSDP2 ranks wrote it)
        state.json            # everything else, JSON (see below)

``state.json`` holds ``format`` (:data:`RUN_STATE_FORMAT`), ``steps_done`` (= the next rollout
id), ``rng`` (:func:`capture_rng_state`: Python's, torch's CPU and CUDA generators and NumPy's
global generator when NumPy is loaded), ``trainer`` (optimizer step count, the minibatch
shuffling RNG, the learning rate; the LR is constant, so there is no scheduler state) and
whatever the caller adds (the driver: dataset cursor and epoch, weight version, metrics rows).

Each ``iter_*`` directory is written under a temporary name (``.iter_0000002.tmp-*``), every file
and directory is fsync-ed, and it is renamed into place; only then is ``latest`` replaced
(temporary file, fsync, rename, fsync of ``DIR``). A crash at any point leaves the previous
checkpoint and its pointer usable; :func:`find_run_checkpoint` ignores temporary directories and
falls back to the newest complete ``iter_*`` when ``latest`` is missing or dangling. The newest
``keep`` checkpoints are kept; older ones, and temporaries of crashed writes, are removed after a
successful write (renamed to ``.trash-*`` first, so a half-deleted one never looks complete).
"""
from __future__ import annotations

import base64
import json
import logging
import os
import random
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import torch

from .._atomic import fsync_dir, fsync_tree, write_text_atomic

__all__ = [
    "KEEP_CHECKPOINTS",
    "LATEST_FILE",
    "OPTIMIZER_DCP_DIR",
    "OPTIMIZER_FILE",
    "RUN_STATE_FILE",
    "RUN_STATE_FORMAT",
    "TOKENIZER_FILES",
    "capture_rng_state",
    "find_run_checkpoint",
    "load_model_dir",
    "read_run_state",
    "restore_rng_state",
    "save_checkpoint_dir",
    "save_run_checkpoint",
    "save_weights_dir",
]

log = logging.getLogger(__name__)

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
OPTIMIZER_DCP_DIR: Final = "optimizer.dcp"
"""A sharded trainer's optimizer state instead of ``optimizer.pt``: a ``torch.distributed.checkpoint``
directory (:mod:`relaxtrio.train.optim_state` loads either into any world size)."""
RUN_STATE_FILE: Final = "state.json"
LATEST_FILE: Final = "latest"
RUN_STATE_FORMAT: Final = 1
KEEP_CHECKPOINTS: Final = 2
"""Run checkpoints kept by default: the newest and the one before it."""

_ITER_RE: Final = re.compile(r"^iter_(\d{7,})$")

# Weights are renamed last, so a reader that sees the new weights also sees the new config.
_WEIGHT_SUFFIXES: Final = (".safetensors", ".safetensors.index.json")


def load_model_dir(model_dir: Path) -> torch.nn.Module:
    """A causal LM (or a VLM, when ``config.json`` has a ``vision_config``) in float32, from a
    local Hugging Face directory."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config_file = Path(model_dir) / "config.json"
    is_vlm = config_file.is_file() and "vision_config" in json.loads(config_file.read_text("utf-8"))
    auto = AutoModelForImageTextToText if is_vlm else AutoModelForCausalLM
    return auto.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)


def save_weights_dir(
    model: torch.nn.Module, out_dir: Path, *, state_dict: dict[str, torch.Tensor] | None = None
) -> Path:
    """Write ``model.safetensors``, ``config.json`` (and ``generation_config.json``) to ``out_dir``.

    Each file is replaced atomically (written to a temporary directory inside ``out_dir``, then
    ``os.replace``), weights last. Other files already in ``out_dir`` (a tokenizer) are kept.

    Args:
        model: a transformers ``PreTrainedModel``.
        out_dir: created if missing.
        state_dict: the tensors to write instead of ``model``'s own (a sharded trainer: the
            full weights gathered on rank 0, see :mod:`relaxtrio.train.distributed`; LoRA: the
            merged weights, see :func:`relaxtrio.train.lora.merged_state_dict`).

    Returns:
        ``out_dir``, ready for ``AutoModelForCausalLM.from_pretrained`` or an engine's
        update-weights-from-disk call.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".tmp-weights-") as tmp:
        _save_pretrained(model, Path(tmp), state_dict)
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
    state_dict: dict[str, torch.Tensor] | None = None,
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
        state_dict: the tensors to write instead of ``model``'s own (sharded: the gathered
            weights; LoRA: merged weights).

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
        _save_pretrained(model, tmp, state_dict)
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


def _save_pretrained(model: Any, directory: Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
    # One shard: engines load exactly ``model.safetensors``.
    model.save_pretrained(directory, max_shard_size="1000GB", state_dict=state_dict)


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


# ---------------------------------------------------------------------- run checkpoints


def iteration_name(steps_done: int) -> str:
    """The directory name of the run checkpoint taken after ``steps_done`` rollout steps."""
    return f"iter_{steps_done:07d}"


def save_run_checkpoint(
    save_dir: Path,
    steps_done: int,
    model: torch.nn.Module,
    *,
    optimizer_state: Mapping[str, Any] | None,
    state: Mapping[str, Any],
    tokenizer_dir: Path | None = None,
    keep: int = KEEP_CHECKPOINTS,
    state_dict: dict[str, torch.Tensor] | None = None,
    optimizer_dir: tuple[str, Path] | None = None,
) -> Path:
    """Writes ``save_dir/iter_<steps_done>`` atomically and points ``save_dir/latest`` at it.

    Args:
        save_dir: the ``--save`` directory (created if missing).
        steps_done: rollout steps completed; the resumed run starts at this rollout id.
        model: a transformers ``PreTrainedModel`` (weights and config are written).
        optimizer_state: ``torch.save``-d to ``optimizer.pt``, e.g. ``{"optimizer":
            optimizer.state_dict(), "num_optimizer_steps": n}``; None with ``optimizer_dir``.
        state: JSON-serializable run state; written to ``state.json`` together with
            ``format``, ``steps_done`` and ``rng`` (:func:`capture_rng_state`, taken now).
        tokenizer_dir: copy tokenizer files from here (as :func:`save_checkpoint_dir`), or None.
        keep: how many newest checkpoints to keep (>= 1).
        state_dict: the tensors to write instead of ``model``'s own (sharded: the gathered weights).
        optimizer_dir: ``(name, directory)``: a directory already written (a sharded trainer's
            ``torch.distributed.checkpoint`` shards) that is moved into the checkpoint as
            ``name``; it is removed if the write fails.

    Returns:
        The new checkpoint directory.

    Raises:
        FileNotFoundError: ``tokenizer_dir`` is missing or holds no tokenizer file (nothing
            changes in ``save_dir`` then).
        TypeError: ``state`` is not JSON-serializable (nothing changes in ``save_dir``).
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    name = iteration_name(steps_done)
    full_state = {**state, "format": RUN_STATE_FORMAT, "steps_done": steps_done,
                  "rng": capture_rng_state()}
    state_text = json.dumps(full_state, sort_keys=True, allow_nan=False)
    tmp = Path(tempfile.mkdtemp(dir=save_dir, prefix=f".{name}.tmp-"))
    try:
        _save_pretrained(model, tmp, state_dict)
        if tokenizer_dir is not None:
            _copy_tokenizer(Path(tokenizer_dir), tmp)
        if optimizer_state is not None:
            torch.save(dict(optimizer_state), tmp / OPTIMIZER_FILE)
        if optimizer_dir is not None:
            os.replace(optimizer_dir[1], tmp / optimizer_dir[0])
        (tmp / RUN_STATE_FILE).write_text(state_text, encoding="utf-8")
        _ordinary_permissions(tmp)
        fsync_tree(tmp)
        final = save_dir / name
        if final.exists():  # the same step saved again (a resumed run): move the old one aside
            os.replace(final, _trash_path(save_dir, name))
        os.replace(tmp, final)
        fsync_dir(save_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if optimizer_dir is not None and optimizer_dir[1].exists():
            shutil.rmtree(optimizer_dir[1], ignore_errors=True)
    write_text_atomic(save_dir / LATEST_FILE, name + "\n")
    _prune(save_dir, keep=keep, current=name)
    return final


def _trash_path(save_dir: Path, name: str) -> Path:
    return Path(tempfile.mkdtemp(dir=save_dir, prefix=f".trash-{name}-")) / name


def _prune(save_dir: Path, *, keep: int, current: str) -> None:
    """Removes all but the newest ``keep`` checkpoints (never ``current``) and dead temporaries."""
    complete = _complete_iterations(save_dir)
    old = [d for d in complete[:-keep] if d.name != current] if len(complete) > keep else []
    for directory in old:
        os.replace(directory, _trash_path(save_dir, directory.name))
    for path in save_dir.iterdir():
        if path.name.startswith((".trash-", ".iter_")) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.name.startswith(f".{LATEST_FILE}.tmp-") and path.is_file():
            path.unlink(missing_ok=True)  # a pointer write that a kill interrupted


def _complete_iterations(save_dir: Path) -> list[Path]:
    """``iter_*`` directories holding a state file, oldest first."""
    found = []
    for path in save_dir.iterdir():
        match = _ITER_RE.match(path.name)
        if match and (path / RUN_STATE_FILE).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def find_run_checkpoint(load_dir: Path) -> Path | None:
    """The checkpoint ``--load load_dir`` resumes from, or None when there is none.

    ``load_dir`` may be a checkpoint itself (it holds ``state.json``) or a ``--save`` directory:
    then ``latest`` names the checkpoint; when it is missing or points at nothing complete
    (a crash between the rename and the pointer update), the newest complete ``iter_*`` is used
    and a warning is logged. Temporary directories of interrupted writes are never used.
    """
    load_dir = Path(load_dir)
    if (load_dir / RUN_STATE_FILE).is_file():
        return load_dir
    if not load_dir.is_dir():
        return None
    pointer = load_dir / LATEST_FILE
    if pointer.is_file():
        name = pointer.read_text(encoding="utf-8").strip()
        if _ITER_RE.match(name) and (load_dir / name / RUN_STATE_FILE).is_file():
            return load_dir / name
    complete = _complete_iterations(load_dir)
    if not complete:
        return None
    if (load_dir.resolve(), complete[-1].name) not in _WARNED_DANGLING:  # once per process
        _WARNED_DANGLING.add((load_dir.resolve(), complete[-1].name))
        log.warning("%s: %s is missing or dangling; using the newest complete checkpoint %s",
                    load_dir, LATEST_FILE, complete[-1].name)
    return complete[-1]


_WARNED_DANGLING: set[tuple[Path, str]] = set()


def read_run_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The ``state.json`` of a run checkpoint.

    Raises:
        ValueError: the file is not a run state of a format this version reads.
    """
    state = json.loads((Path(checkpoint_dir) / RUN_STATE_FILE).read_text(encoding="utf-8"))
    if not isinstance(state, dict) or state.get("format") != RUN_STATE_FORMAT:
        raise ValueError(f"{checkpoint_dir}: not a run checkpoint of format {RUN_STATE_FORMAT}")
    return state


def _tensor_b64(t: torch.Tensor) -> str:
    return base64.b64encode(bytes(t.tolist())).decode("ascii")


def _b64_tensor(text: str) -> torch.Tensor:
    return torch.tensor(list(base64.b64decode(text)), dtype=torch.uint8)


def capture_rng_state() -> dict[str, Any]:
    """The process's global random generators as JSON: Python, torch CPU/CUDA, NumPy if loaded.

    relaxtrio itself draws from none of them during a run (the trainer has its own seeded RNG,
    sampling seeds are per request), but user hooks (custom reward or advantage functions) may.
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss],
                             "torch": _tensor_b64(torch.get_rng_state())}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_tensor_b64(t) for t in torch.cuda.get_rng_state_all()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restores what :func:`capture_rng_state` captured (generators it did not capture are left)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(_b64_tensor(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_b64_tensor(t) for t in state["cuda"]])
    if "numpy" in state:
        import numpy

        name, keys, pos, has_gauss, cached = state["numpy"]
        numpy.random.set_state((name, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached))
