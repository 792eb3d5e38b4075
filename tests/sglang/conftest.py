"""Fixtures of the SGLang client tests: one tiny model per session, an in-process embedded
engine (the same API as SGLang's) per test (``scheduler`` gives the test its scheduler)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
import trio

from relaxtrio.engine._info import EngineState
from relaxtrio.engine.scheduler import Scheduler
from relaxtrio.engine.server import EngineConfig, load_engine, serve_engine_state
from relaxtrio.models import load_model


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir: Path) -> torch.nn.Module:
    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def reference_logprobs(tiny_model: torch.nn.Module) -> Callable[..., list[float]]:
    """Logprobs of ``output_ids`` after ``prompt`` from one unpadded full forward pass."""

    def compute(prompt: Sequence[int], output_ids: Sequence[int], temperature: float = 1.0) -> list[float]:
        ids = torch.tensor([list(prompt) + list(output_ids)])
        with torch.inference_mode():
            logits = tiny_model(input_ids=ids).logits[0]  # (T, V)
        start = len(prompt) - 1
        rows = logits[start : start + len(output_ids)] / temperature  # (N, V)
        logprobs = torch.log_softmax(rows, dim=-1)
        return logprobs.gather(1, torch.tensor(list(output_ids)).unsqueeze(1)).squeeze(1).tolist()

    return compute


@pytest.fixture
def engine_config(tiny_model_dir: Path) -> EngineConfig:
    return EngineConfig(model_path=tiny_model_dir, max_running_requests=4)


@pytest.fixture
async def engine_state(engine_config: EngineConfig) -> EngineState:
    """The loaded engine behind ``engine_url`` (its scheduler's events replace polling)."""
    return await load_engine(engine_config)


@pytest.fixture
def scheduler(engine_state: EngineState) -> Scheduler:
    return engine_state.scheduler


@pytest.fixture
async def engine_url(nursery: trio.Nursery, engine_config: EngineConfig, engine_state: EngineState) -> str:
    return await nursery.start(serve_engine_state, engine_state, engine_config)
