"""The workers of a run: every command (``train``, ``rollout``, ``serve``, ``doctor``) generates
through one :class:`~relaxtrio.fleet.fleet.EngineFleet`, a fleet of one where there is one engine.

Owns:

- the per-engine client interface (:mod:`.engine_api`: ``EngineAPI``, ``EngineConnections``),
  which each wire protocol implements in a sibling package (:mod:`relaxtrio.sglang`; vLLM's);
- the fleet (:mod:`.fleet`), which *has* its parts: membership and quorum (:mod:`.members`),
  the gateway's listing (:mod:`.gateway`), health probes (:mod:`.health`), Session routing and
  generations in flight (:mod:`.routing`, :mod:`.generations`), control fan-out and the weight
  update bracket (:mod:`.control`);
- opening a command's fleet, launched or connected (:mod:`.connect`);
- launching engines and the gateway (:mod:`.launch_fleet`), booting and supervising each process
  (:mod:`.processes`), where a process runs (:mod:`.starter`; Ray's starter is
  :mod:`relaxtrio.cluster.engines`), and one embedded engine without a fleet (:mod:`.embedded`).

May import: :mod:`relaxtrio.sglang` and its sibling protocol packages, :mod:`relaxtrio.config`,
:mod:`relaxtrio.models`, :mod:`relaxtrio._errors`, :mod:`relaxtrio._reaper`, trio, httpx. Never
torch, quart, Ray, or the nursery/api/rollout/train/run/tools packages.
"""
