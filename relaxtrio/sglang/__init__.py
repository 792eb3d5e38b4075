"""The client side of SGLang's native HTTP API.

Owns: :class:`~relaxtrio.sglang.client.EngineClient` (``/generate`` with ``input_ids``, abort,
pause/continue, weight updates, health, model info), the sampling-parameter wire model shared with
the embedded engine (:mod:`relaxtrio.sglang.wire`), generate-reply parsing, and launching engine
processes (:mod:`relaxtrio.fleet.launch`). The same client talks to real SGLang servers and to
relaxtrio's embedded CPU engine, which speaks the same API.

May import: :mod:`relaxtrio._errors`, :mod:`relaxtrio.forest` (weight spans), trio, httpx. Never
torch, quart, or the nursery/api/rollout/train packages.
"""
