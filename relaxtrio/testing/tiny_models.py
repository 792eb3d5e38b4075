"""Tiny random model directories for tests and benchmarks (about 1 s each, no download).

- :func:`build_tiny_model` builds a ~0.2 M parameter random Llama with a byte-level BPE tokenizer
  trained offline on a fixed set of Python standard-library sources.
- :func:`build_tiny_vlm` builds a ~0.3 M parameter random Qwen2-VL (vision tower included) with the
  same tokenizer plus the Qwen2-VL vision tokens, the PIL image processor, and the template
  ``chatml_tools_vision.jinja`` (image parts render as ``<|vision_start|><|image_pad|><|vision_end|>``).

Both write the same directory layout as :func:`relaxtrio.models.ensure_smollm2`, so every loader in
:mod:`relaxtrio.models` reads them. May import: :mod:`relaxtrio.models`; torch, tokenizers and
transformers inside the builders.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ..models import _TEMPLATE_PATH, chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

__all__ = ["build_tiny_model", "build_tiny_vlm"]

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
        ``out_dir``; load it with :func:`~relaxtrio.models.load_model` / :func:`~relaxtrio.models.load_tokenizer` and
        :meth:`relaxtrio.media.vision.VisionProcessor.from_pretrained`.
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
