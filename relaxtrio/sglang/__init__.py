"""The client side of SGLang's native HTTP API, for one engine.

Owns: :class:`~relaxtrio.sglang.client.EngineClient`, the client of exactly one SGLang server or
relaxtrio embedded CPU engine (``/generate`` with ``input_ids``, abort, pause/continue, weight
updates, weight version, health, model and server info): SGLang's implementation of
:class:`relaxtrio.fleet.engine_api.EngineAPI`; the connection pools its clients share
(:func:`~relaxtrio.sglang.client.open_connections`, the generation pool in :mod:`._pool`, retries
in :mod:`._http`); the sampling-parameter wire model shared with the embedded engine
(:mod:`relaxtrio.sglang.wire`); generate-reply parsing (:mod:`._replies`). Nothing about fleets:
routing, fan-out, failover and launching engines are :mod:`relaxtrio.fleet`'s.

May import: :mod:`relaxtrio._errors`, :mod:`relaxtrio.forest` (weight spans),
:mod:`relaxtrio.tracing` (engine-call spans and their traceparent header), trio, httpx. Never
torch, quart, the fleet, or the nursery/api/rollout/train packages.
"""
