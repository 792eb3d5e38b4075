"""The embedded CPU engine process (``python -m relaxtrio.engine``), and nothing else.

Owns: the HTTP server speaking SGLang's native API (``/generate``, ``/abort_request``,
pause/continue, weight updates, ``/health``, model info), the continuous-batching scheduler, KV
batches, sampling, request limits and weight reloading. Drivers talk to it only over HTTP through
:mod:`relaxtrio.sglang`, exactly as they talk to a real SGLang server.

May import: :mod:`relaxtrio.sglang.wire` (the shared sampling-parameter model),
:mod:`relaxtrio.media`, :mod:`relaxtrio.models`, torch, transformers, quart-trio, hypercorn. Never
the nursery/api/rollout/train packages.
"""
