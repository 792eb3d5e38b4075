"""Structured concurrency for Sessions and Groups.

Owns: the Session (agent process in its own process group, IO directory, active-time budget,
SessionForest), the Group nursery, the session registry the API authenticates against, generation
gates and the first-request barrier, each Session's partial-rollout state (in-flight requests,
aborts, pause, protection: :mod:`relaxtrio.nursery.partial`), and the turn protocol the API calls
(:mod:`relaxtrio.nursery.turns`: what a turn handler receives and returns).

Imports inside point one way: ``group`` → ``session`` → ``agent``, ``partial``, ``turns``.

May import: :mod:`relaxtrio.forest`, :mod:`relaxtrio.tracing` (Session and request spans),
:mod:`relaxtrio._errors`, trio, attrs. Never quart, httpx, torch, or the
api/rollout/train/engine/sglang packages.
"""
