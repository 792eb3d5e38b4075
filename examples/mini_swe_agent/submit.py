"""The per-Session command: submits this Session's task to the agent server and waits for it.

Reads the task from ``RELAX_INPUT_JSON`` (metadata: task, repo, test), sends it with the Session's
model endpoint (``RELAX_BASE_URL``, ``RELAX_SESSION_ID`` as the key) to ``MSWEA_SERVER_URL``, and
writes the server's answer (reward and metadata) to ``RELAX_OUTPUT_JSON``. Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path


def main() -> int:
    meta = json.loads(Path(os.environ["RELAX_INPUT_JSON"]).read_text())["metadata"]
    body = {"task": meta["task"], "repo": meta["repo"], "test": meta["test"],
            "base_url": os.environ["RELAX_BASE_URL"], "api_key": os.environ["RELAX_SESSION_ID"]}
    server = os.environ["MSWEA_SERVER_URL"].rstrip("/")
    request = urllib.request.Request(f"{server}/v1/tasks", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    # The task may wait for a slot, then for every held model request: the whole task's time.
    timeout_s = float(os.environ.get("MSWEA_SUBMIT_TIMEOUT_S", "7200"))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            result = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        print(f"agent server refused the task: {exc.code} {exc.read().decode(errors='replace')}",
              file=sys.stderr)
        return 1
    Path(os.environ["RELAX_OUTPUT_JSON"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
