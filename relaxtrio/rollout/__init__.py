"""One rollout step end to end.

Owns: dataset rows to Groups, engine-backed turns (match, render, generate, commit), the resident
rollout pipeline (capacity, runtime lease, prelaunch, partial rollout, fully async), eval over it
(:mod:`relaxtrio.rollout.eval`), the first-request barrier watchdog, rewards, advantages and
custom-advantage hooks, capacity planning, metrics, and the debug dumps and rollout-only sample
files (:mod:`relaxtrio.rollout.dumps`).

May import: :mod:`relaxtrio.forest`, :mod:`relaxtrio.nursery`, :mod:`relaxtrio.chat`,
:mod:`relaxtrio.media`, :mod:`relaxtrio.sglang`, :mod:`relaxtrio.tracing` (Group spans), trio.
Never quart, torch, or the api/train/engine packages.
"""
