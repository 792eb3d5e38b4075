"""The client side of vLLM's token-in/token-out RL API (one engine per client).

Owns: :class:`~relaxtrio.vllm.client.VllmEngineClient` (``/inference/v1/generate`` with token ids,
abort with partial output, pause keep/abort/wait and resume, weights from a directory plus a
version label, health, model and server info) and the translation between relaxtrio's SGLang-shaped
request/result types and vLLM's JSON (:mod:`relaxtrio.vllm.wire`). The method names and result
types are those of :class:`relaxtrio.sglang.client.EngineClient`, so a fleet holds either alike.

May import: :mod:`relaxtrio._errors`, :mod:`relaxtrio.forest` (weight spans), the shared engine
plumbing of :mod:`relaxtrio.sglang` (result type, HTTP retries, connection pool), trio, httpx.
Never torch, transformers, quart, vLLM itself (it lives in its own venv), or the
nursery/api/rollout/train packages.
"""
