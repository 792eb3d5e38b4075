"""Fixtures of the fleet tests: in-process embedded engines that a test can stop one by one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio

from relaxtrio.engine.server import EngineConfig, serve_engine


@attrs.define(eq=False)
class Engines:
    """Embedded engines served in the test's nursery; ``labels[i]`` is engine i's weight version."""

    urls: list[str]
    labels: list[str]
    scopes: list[trio.CancelScope]

    def stop(self, index: int) -> None:
        """Stop engine ``index`` at once (its listener closes, open connections drop)."""
        self.scopes[index].cancel()

    def label_of(self, url: str) -> str:
        return self.labels[self.urls.index(url)]


StartEngines = Callable[..., "trio.lowlevel.Task"]


@pytest.fixture
def start_engines(nursery: trio.Nursery, tiny_model_dir: Path):
    """``await start_engines(n)`` serves ``n`` engines labelled ``w0``, ``w1``, ..."""

    async def start(n: int, *, max_running_requests: int = 4) -> Engines:
        engines = Engines(urls=[], labels=[], scopes=[])
        for i in range(n):
            scope = trio.CancelScope()
            label = f"w{i}"
            config = EngineConfig(model_path=tiny_model_dir, weight_version=label,
                                  max_running_requests=max_running_requests)

            async def run(config: EngineConfig = config, scope: trio.CancelScope = scope, *,
                          task_status: trio.TaskStatus[str]) -> None:
                with scope:
                    await serve_engine(config, task_status=task_status)

            engines.urls.append(await nursery.start(run))
            engines.labels.append(label)
            engines.scopes.append(scope)
        return engines

    return start
