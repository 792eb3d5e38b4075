"""A local Ray instance per test module (started once, checked for leftovers when it stops)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from tests.support.procs import descendants
from tests.support.ray_state import live_actors
from tests.support.waits import wait_until_sync

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance (4 CPUs) for one test module; reports its start-up cost. When the
    module is done no actor may be alive, and after Ray stops no process it started may be left."""
    ray = pytest.importorskip("ray")
    before = set(descendants(os.getpid()))
    start = time.monotonic()
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    print(json.dumps({"ray_start_s": round(time.monotonic() - start, 2)}))
    yield ray
    assert not live_actors(), "Ray actors left behind"
    ray.shutdown()
    wait_until_sync(lambda: not set(descendants(os.getpid())) - before, timeout_s=30,
                    what="Ray's processes to exit")
    left = set(descendants(os.getpid())) - before
    assert not left, f"Ray processes left behind: {sorted(left)}"

