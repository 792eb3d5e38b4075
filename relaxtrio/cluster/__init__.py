"""relaxtrio.cluster: placement on a Ray cluster (``--ray-address``); the only package that imports Ray.

* :mod:`~relaxtrio.cluster.runtime`: connecting to (or starting) Ray, from worker threads only;
* :mod:`~relaxtrio.cluster.trainer`: trainer ranks as Ray actors in a placement group;
* :mod:`~relaxtrio.cluster.engines`: launched engines, one Ray actor each on a node with the
  engine's GPUs and CPUs free (the fleet launcher's engine starter);
* :mod:`~relaxtrio.cluster.agents`: ``--agent-executor ray``, a pool of long-lived Ray actors
  (each reserving ``--agent-num-cpus``) running one Session's agent at a time on their nodes;
  the actor itself is :mod:`~relaxtrio.cluster._agent_actor`.

Nothing outside this package imports Ray, and this ``__init__`` imports none of its modules:
the driver imports them only when a run asks for Ray. The trio driver calls Ray only through
``trio.to_thread.run_sync`` (Ray's own event loop never meets trio's; no asyncio in our code).
"""
