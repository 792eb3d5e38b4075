"""``freeze_startup_heap``: the start-up heap frozen and the serving GC thresholds set, once.

Run in a child interpreter: freezing and thresholds are process-wide, and pytest's own process
must keep Python's defaults.
"""

from __future__ import annotations

import pytest

import json
import subprocess
import sys

from relaxtrio._serving import SERVING_GC_THRESHOLDS

_CHILD = """
import gc, json
from relaxtrio._serving import freeze_startup_heap
before = gc.get_threshold()
junk = [object() for _ in range(1000)]
freeze_startup_heap()
frozen = gc.get_freeze_count()
after_first = gc.get_threshold()
gc.set_threshold(1, 2, 3)  # a second call must leave thresholds and the frozen heap alone
freeze_startup_heap()
print(json.dumps({"before": before, "frozen": frozen, "after_first": after_first,
                  "after_second": gc.get_threshold(),
                  "frozen_second": gc.get_freeze_count()}))
"""


@pytest.mark.slow
def test_freeze_startup_heap_sets_serving_thresholds_once() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], check=True, capture_output=True, text=True,
                         timeout=60)
    result = json.loads(out.stdout)
    assert result["before"] == [700, 10, 10]
    assert result["frozen"] > 0
    assert result["after_first"] == list(SERVING_GC_THRESHOLDS)
    assert result["after_second"] == [1, 2, 3]
    assert result["frozen_second"] == result["frozen"]


def test_serving_thresholds_collect_young_objects_less_often_than_python() -> None:
    gen0, gen1, gen2 = SERVING_GC_THRESHOLDS
    assert gen0 > 700 and gen1 >= 1 and gen2 >= 1
