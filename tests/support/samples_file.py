"""Reading back a rollout-only samples file (``python -m relaxtrio rollout``), as a user's script would."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any


def read_samples(path: Path) -> list[dict[str, Any]]:
    """The records of a samples file, one dict per non-empty line (gzip when it ends in ``.gz``)."""
    path = Path(path)
    if path.suffix == ".gz":
        text = gzip.decompress(path.read_bytes()).decode("utf-8")
    else:
        text = path.read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
