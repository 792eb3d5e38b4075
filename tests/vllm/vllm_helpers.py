"""What the tests of tests/vllm share: the session's vLLM server record and its context size."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import attrs

CONTEXT_TOKENS: Final = 2048
"""``--max-model-len`` of the test server (small, so a too-long prompt is cheap)."""


@attrs.frozen
class VllmServer:
    """A running vLLM server: its base URL, model directory and log file, and the process
    group the tests own (None for a server given by ``RELAXTRIO_VLLM_URLS``: not theirs to
    kill)."""

    url: str
    model_dir: Path
    log_path: Path | None
    pgid: int | None = None
