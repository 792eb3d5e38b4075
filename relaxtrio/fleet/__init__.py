"""The workers of a run: launching engines (each backend with its own interpreter) and the
gateway, routing each Session to one worker, fanning control calls out to every worker, health,
failover and weight versions. Engine wire protocols live beside it (:mod:`relaxtrio.sglang`)."""
