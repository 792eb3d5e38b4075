"""What a vLLM server says about itself, in the keys relaxtrio reads from SGLang servers.

vLLM 0.32 has no ``/model_info``; ``GET /v1/models`` answers ``{"object": "list", "data": [{"id":
"<served name>", "root": "<model dir>", "max_model_len": 2048, ...}]}`` and ``GET /weight_info``
``{"weight_version": "default"}``. ``GET /server_info?config_format=json`` answers ``{"vllm_config":
{"model_config": {"max_model_len", "logprobs_mode", "model", ...}, "cache_config":
{"enable_prefix_caching", ...}, "scheduler_config": {"max_num_seqs", ...}, ...}, "vllm_env": {...},
"system_env": {...}}`` (the served model's ``model_type`` and ``architectures`` are not in it), and
``GET /version`` ``{"version": "0.32.0"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._errors import EngineUnavailableError

__all__ = ["context_token_limit", "logprobs_mode_problem", "model_info_from", "server_info_from"]


def context_token_limit(server_info: Mapping[str, Any]) -> int | None:
    """The most tokens one lineage can hold on a vLLM engine, prompt plus generation.

    vLLM refuses a prompt of ``max_model_len`` tokens or more and clamps a generation budget
    that does not fit to ``max_model_len - prompt``, generating all of it; so the limit is
    ``max_model_len`` itself (SGLang's is 2 below its context length).

    Args:
        server_info: :meth:`VllmEngineClient.server_info`.

    Returns:
        Tokens (>= 1), or None when it does not say.
    """
    limit = server_info.get("context_length")
    return limit if isinstance(limit, int) and limit >= 1 else None


def logprobs_mode_problem(server_info: Mapping[str, Any]) -> str | None:
    """Why a vLLM server's logprobs would not be rollout logprobs the trainer can use, or None.

    Args:
        server_info: :meth:`VllmEngineClient.server_info`.

    Returns:
        A sentence naming the server's ``--logprobs-mode`` and the one to use, or None when it
        is ``processed_logprobs``.
    """
    mode = server_info.get("logprobs_mode")
    if mode == "processed_logprobs":
        return None
    return (f"the vLLM server reports logprobs_mode {mode!r}; training needs logprobs at the "
            "sampling temperature: start it with --logprobs-mode processed_logprobs")


def model_info_from(models: Mapping[str, Any], weight_info: Mapping[str, Any], *,
                    engine_url: str) -> dict[str, Any]:
    """The model-info record of a vLLM server.

    Args:
        models: the ``/v1/models`` answer.
        weight_info: the ``/weight_info`` answer.
        engine_url: the server, for errors.

    Returns:
        ``{"model_path": str, "served_model_name": str, "max_model_len": int | None,
        "weight_version": str | None}``. There is no ``model_type`` / ``architectures``, so
        :func:`relaxtrio.models.served_model_mismatch` compares nothing.

    Raises:
        EngineUnavailableError: ``/v1/models`` lists no model.
    """
    data = models.get("data")
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise EngineUnavailableError(f"engine {engine_url}/v1/models lists no model",
                                     engine_url=engine_url)
    model = data[0]
    return {
        "model_path": model.get("root") or model.get("id"),
        "served_model_name": model.get("id"),
        "max_model_len": model.get("max_model_len"),
        "weight_version": weight_info.get("weight_version"),
    }


def server_info_from(raw: Mapping[str, Any], version: Mapping[str, Any], *,
                     engine_url: str) -> dict[str, Any]:
    """The server-info record of a vLLM server.

    Args:
        raw: the ``/server_info?config_format=json`` answer.
        version: the ``/version`` answer.
        engine_url: the server, for errors.

    Returns:
        ``{"engine": "vllm", "version": str, "context_length": int (max_model_len),
        "logprobs_mode": str, "enable_prefix_caching": bool, "max_num_seqs": int,
        "model_path": str, "vllm_config": dict}``; read :func:`context_token_limit` and
        :func:`logprobs_mode_problem` from it.

    Raises:
        EngineUnavailableError: the answer has no ``vllm_config.model_config`` (not vLLM).
    """
    config = raw.get("vllm_config")
    if not isinstance(config, dict) or not isinstance(config.get("model_config"), dict):
        raise EngineUnavailableError(f"engine {engine_url}/server_info has no "
                                     "vllm_config.model_config (is it a vLLM server?)",
                                     engine_url=engine_url)
    model = config["model_config"]
    cache = config.get("cache_config") or {}
    scheduler = config.get("scheduler_config") or {}
    return {
        "engine": "vllm",
        "version": version.get("version"),
        "context_length": model.get("max_model_len"),
        "logprobs_mode": model.get("logprobs_mode"),
        "enable_prefix_caching": cache.get("enable_prefix_caching"),
        "max_num_seqs": scheduler.get("max_num_seqs"),
        "model_path": model.get("model"),
        "vllm_config": config,
    }
