"""Per-request next-token selection and logprobs for the embedded engine (torch, synchronous).

Order of operations on one row of logits, following SGLang 0.5.23's sampler
(docs/client-quirks.md#logprob-convention):

1. penalties on tokens generated so far (repetition, frequency, presence; the prompt is not
   counted), ``logit_bias``, and the ``min_new_tokens`` mask of stop ids;
2. ``logprobs = log_softmax(logits / T)`` over the full vocabulary, ``T = 1`` for greedy requests;
   the reported logprob of the chosen token comes from here, **before** any truncation;
3. greedy (``T < 1e-6``): argmax; otherwise top-k, top-p, min-p truncation of
   ``softmax(logits / T)`` and one draw from the request's own ``torch.Generator``.

The generator is seeded from ``sampling_seed`` when given (SGLang honours it only with
``--enable-deterministic-inference``; the embedded engine always does), else from the OS.
"""

from __future__ import annotations

import secrets
from typing import Final

import attrs
import torch

from ..sglang.wire import SamplingParams

__all__ = ["GREEDY_TEMPERATURE", "ResolvedSampling", "RowSampler"]

GREEDY_TEMPERATURE: Final = 1e-6


@attrs.frozen(kw_only=True)
class ResolvedSampling:
    """Sampling settings with every server default filled in (see :class:`SamplingParams`).

    ``stop_ids`` already combines the model's EOS ids with ``stop_token_ids``, and is empty when
    ``ignore_eos`` is set.
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_new_tokens: int = 0
    stop_ids: frozenset[int] = frozenset()
    stop: tuple[str, ...] = ()
    stop_regex: tuple[str, ...] = ()
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()
    sampling_seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @classmethod
    def from_params(
        cls,
        params: SamplingParams,
        *,
        max_new_tokens: int,
        eos_ids: frozenset[int],
        stop: tuple[str, ...],
        stop_regex: tuple[str, ...],
    ) -> ResolvedSampling:
        """Fill defaults; ``max_new_tokens`` is the already clamped budget."""

        def pick(value: object, default: object) -> object:
            return default if value is None else value

        ignore_eos = bool(params.ignore_eos)
        stop_ids = frozenset() if ignore_eos else eos_ids | frozenset(params.stop_token_ids or ())
        return cls(
            max_new_tokens=max_new_tokens,
            temperature=pick(params.temperature, 1.0),
            top_p=pick(params.top_p, 1.0),
            top_k=pick(params.top_k, -1),
            min_p=pick(params.min_p, 0.0),
            frequency_penalty=pick(params.frequency_penalty, 0.0),
            presence_penalty=pick(params.presence_penalty, 0.0),
            repetition_penalty=pick(params.repetition_penalty, 1.0),
            min_new_tokens=pick(params.min_new_tokens, 0),
            stop_ids=stop_ids,
            stop=stop,
            stop_regex=stop_regex,
            skip_special_tokens=pick(params.skip_special_tokens, True),
            spaces_between_special_tokens=pick(params.spaces_between_special_tokens, True),
            no_stop_trim=pick(params.no_stop_trim, False),
            logit_bias=tuple(sorted((int(k), float(v)) for k, v in (params.logit_bias or {}).items())),
            sampling_seed=params.sampling_seed,
        )


@attrs.define(eq=False)
class Choice:
    """One selected token: id, its logprob and optional top alternatives.

    The logprob follows docs/client-quirks.md#logprob-convention.
    """

    token_id: int
    logprob: float
    top: list[tuple[float, int]] | None = None


class RowSampler:
    """Selects the next token of one request from its row of logits; keeps penalty counts.

    Args:
        cfg: resolved settings of the request.
        top_logprobs_num: how many alternatives to report per position (0: none).
    """

    def __init__(self, cfg: ResolvedSampling, *, top_logprobs_num: int = 0):
        self.cfg = cfg
        self.top_logprobs_num = top_logprobs_num
        seed = cfg.sampling_seed if cfg.sampling_seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed % 2**64)
        self._counts: torch.Tensor | None = None  # (V,) float32, generated-token counts
        self._needs_counts = (
            cfg.repetition_penalty != 1.0
            or cfg.frequency_penalty != 0.0
            or cfg.presence_penalty != 0.0
        )

    def _adjust(self, logits: torch.Tensor, num_generated: int) -> torch.Tensor:
        cfg = self.cfg
        if self._counts is not None and num_generated > 0:
            counts = self._counts  # (V,)
            seen = counts > 0
            if cfg.repetition_penalty != 1.0:
                penalized = torch.where(
                    logits > 0, logits / cfg.repetition_penalty, logits * cfg.repetition_penalty
                )
                logits = torch.where(seen, penalized, logits)
            if cfg.frequency_penalty != 0.0:
                logits = logits - cfg.frequency_penalty * counts
            if cfg.presence_penalty != 0.0:
                logits = logits - cfg.presence_penalty * seen.to(logits.dtype)
        if cfg.logit_bias:
            ids = torch.tensor([k for k, _ in cfg.logit_bias])
            logits = logits.index_add(0, ids, torch.tensor([v for _, v in cfg.logit_bias]))
        if num_generated < cfg.min_new_tokens and cfg.stop_ids:
            ids = torch.tensor(sorted(i for i in cfg.stop_ids if i < logits.shape[-1]))
            logits = logits.index_fill(0, ids, float("-inf"))
        return logits

    def _truncate(self, probs: torch.Tensor) -> torch.Tensor:
        """Zero the tokens outside top-k / top-p / min-p; ``probs`` (V,) sums to 1."""
        cfg = self.cfg
        if cfg.top_k != -1 and cfg.top_k < probs.shape[-1]:
            kth = torch.topk(probs, cfg.top_k).values[-1]
            probs = torch.where(probs >= kth, probs, 0.0)
        if cfg.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)  # (V,), (V,)
            before = torch.cumsum(sorted_probs, 0) - sorted_probs  # mass strictly above each token
            sorted_probs = torch.where(before > cfg.top_p, 0.0, sorted_probs)
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        if cfg.min_p > 0.0:
            probs = torch.where(probs >= cfg.min_p * probs.max(), probs, 0.0)
        return probs

    def choose(self, logits: torch.Tensor, num_generated: int) -> Choice:
        """Pick the next token.

        Args:
            logits: (V,) raw next-token logits of this request (any float dtype).
            num_generated: tokens this request has generated so far (for ``min_new_tokens``).

        Returns:
            The chosen id with ``log_softmax(adjusted_logits / T)[id]`` (``T = 1`` when greedy).
        """
        logits = self._adjust(logits.to(torch.float32), num_generated)  # (V,)
        if self.cfg.greedy:
            logprobs = torch.log_softmax(logits, dim=-1)  # (V,)
            token_id = int(torch.argmax(logits))
        else:
            logprobs = torch.log_softmax(logits / self.cfg.temperature, dim=-1)  # (V,)
            probs = self._truncate(logprobs.exp())
            token_id = int(torch.multinomial(probs, 1, generator=self.generator))
        top = None
        if self.top_logprobs_num > 0:
            values, ids = torch.topk(logprobs, min(self.top_logprobs_num, logprobs.shape[-1]))
            top = list(zip(values.tolist(), ids.tolist(), strict=True))
        if self._needs_counts:
            if self._counts is None:
                self._counts = torch.zeros(logits.shape[-1], dtype=torch.float32)
            self._counts[token_id] += 1
        return Choice(token_id, float(logprobs[token_id]), top)
