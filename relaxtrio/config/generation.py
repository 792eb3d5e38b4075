"""Rollout sampling and parser settings: :class:`GenerationConfig`."""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = [
    "GenerationConfig",
]


@attrs.frozen(kw_only=True)
class GenerationConfig:
    """Rollout sampling settings (request temperature/top_p never override these).

    Attributes:
        temperature: sampling temperature (logprobs use the same temperature, SGLang convention).
        top_p: nucleus sampling mass in (0, 1].
        top_k: top-k cut-off, -1 for none.
        max_response_tokens: the turn limit in tokens of a request that sets none
            (``--rollout-max-response-len``); a request's own ``max_completion_tokens`` /
            ``max_output_tokens`` / ``max_tokens`` is its turn limit, higher or lower. The
            context limit bounds both.
        max_context_tokens: training-token limit of a lineage (``--rollout-max-context-len``),
            or None for the model's limit as reported by the engine.
        stop: extra stop strings for every turn.
        stop_token_ids: extra stop token ids for every turn (EOS ids are always included).
        seed: base sampling seed, or None (every request draws its own seed from the OS).
        seed_per_sample: with ``seed`` set, Session ``i`` of a Group samples with ``seed + i``
            instead of every Session using ``seed`` (``--sglang-enable-deterministic-inference``:
            ``rollout_seed + sample position``), so a Group's samples differ and a rerun repeats.
        tool_call_parser: tool-call parser name (used only when the request has tools).
        reasoning_parser: reasoning parser name, or None.
        template_kwargs: server-side chat-template kwargs merged under each request's kwargs.
        partial_rollout_max_aborted_count: after this many aborts of one request its Session
            becomes protected at the next resume (pauses no longer interrupt it); None = never.
        ignore_eos: never stop at EOS / stop ids (SGLang's ``ignore_eos``): turns run to their
            token limit. For benchmarks and tests that need generations of a known length.
        text_only_images: what a text-only policy does with an image in a request
            (``--agentic-text-only-images``): ``refuse`` (a 400 naming the part) or ``marker``
            (each image is shown as a fixed text, :data:`relaxtrio.media.images.IMAGE_MARKER`,
            on every turn; counted per step). A vision model takes images either way.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_response_tokens: int = 256
    max_context_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    seed_per_sample: bool = False
    tool_call_parser: str | None = "hermes"
    reasoning_parser: str | None = None
    template_kwargs: dict = attrs.field(factory=dict)
    partial_rollout_max_aborted_count: int | None = None
    ignore_eos: bool = False
    text_only_images: Literal["refuse", "marker"] = attrs.field(
        default="refuse", validator=attrs.validators.in_(("refuse", "marker")))

    def sampling_seed(self, sample_index: int) -> int | None:
        """The seed of a Session's turns when the request brings none (see ``seed_per_sample``)."""
        if self.seed is None or not self.seed_per_sample:
            return self.seed
        return self.seed + sample_index
