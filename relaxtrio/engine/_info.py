"""What the embedded engine reports about itself: ``/model_info``, ``/server_info``, ``/metrics``.

Key names follow SGLang 0.5.23's ``/model_info``, ``/server_info`` and ``/metrics``;
``internal_states[0]`` carries the
scheduler's counters, including ``max_batch_size_seen`` (proof that requests were batched).
"""

from __future__ import annotations

from typing import Any

import attrs

from .. import __version__
from ..media.vision import VisionProcessor
from .scheduler import Scheduler

__all__ = ["EngineState", "metrics_text", "model_info_json", "server_info_json"]


@attrs.define(eq=False, kw_only=True)
class EngineState:
    """What the HTTP layer knows about one running engine (mutable: weight updates move it)."""

    scheduler: Scheduler
    model_path: str
    tokenizer_path: str
    dtype: str
    started_at: float
    model_type: str
    architectures: list[str]
    vision: VisionProcessor | None = None  # set for a vision-language model
    # Session ids seen in /generate and not yet closed: the embedded engine has no session
    # cache, but tracks what SGLang's session radix cache would hold until /close_session.
    open_sessions: set[str] = attrs.field(factory=set)


def model_info_json(state: EngineState) -> dict[str, Any]:
    """``GET /model_info`` body (the 0.5.23 key set)."""
    return {
        "model_path": state.model_path,
        "served_model_name": state.model_path,
        "tokenizer_path": state.tokenizer_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": state.scheduler.weight_version,
        "load_format": "auto",
        "reasoning_parser": None,
        "tool_call_parser": None,
        "disaggregation_mode": "null",
        "has_image_understanding": state.vision is not None,
        "has_audio_understanding": False,
        "model_type": state.model_type,
        "architectures": state.architectures,
    }


def server_info_json(state: EngineState) -> dict[str, Any]:
    """``GET /server_info`` body: limits for admission control plus scheduler counters."""
    limits = state.scheduler.limits
    stats = attrs.asdict(state.scheduler.statistics())
    return {
        "model_path": state.model_path,
        "tokenizer_path": state.tokenizer_path,
        "context_length": limits.context_length,
        "max_running_requests": limits.max_running_requests,
        "max_total_num_tokens": limits.max_total_num_tokens,
        "max_req_input_len": limits.max_req_input_len,
        "dtype": state.dtype,
        "device": "cpu",
        "tp_size": 1,
        "dp_size": 1,
        "page_size": 1,
        "status": "ready",
        "startup_time": state.started_at,
        "internal_states": [stats],
        "num_open_sessions": len(state.open_sessions),
        "version": f"relaxtrio-embedded-{__version__}",
        "frontend": "relaxtrio",
    }


def metrics_text(state: EngineState) -> str:
    """``GET /metrics`` in Prometheus text format, with SGLang's gauge names."""
    stats = state.scheduler.statistics()
    limits = state.scheduler.limits
    labels = f'{{model_name="{state.model_path}",engine_type="relaxtrio"}}'
    usage = stats.num_cached_tokens / max(1, limits.max_total_num_tokens)
    lines = [
        ("sglang:max_total_num_tokens", limits.max_total_num_tokens),
        ("sglang:token_usage", usage),
        ("sglang:num_used_tokens", stats.num_cached_tokens),
        ("sglang:num_running_reqs", stats.num_running_reqs),
        ("sglang:num_queue_reqs", stats.num_waiting_reqs),
        ("sglang:context_len", limits.context_length),
        ("sglang:generation_tokens_total", stats.num_generated_tokens),
    ]
    return "".join(f"# TYPE {name} gauge\n{name}{labels} {value}\n" for name, value in lines)
