"""The external agent server: runs mini-swe-agent tasks with a fixed number of slots.

Started once, outside relaxtrio's per-Session command (like a team's shared agent platform); each
Session's launcher (``submit.py``) posts its task here and waits for the result. A task holds one
slot from the moment it is admitted until its reward is known; a task arriving while every slot is
busy waits in the queue. That hard limit is why a relaxtrio run against this server declares
``--agent-external-slots <slots>``: relaxtrio refuses to start a run whose Groups could not all get
slots (docs/scheduling.md#external-agent-capacity).

Per task: a copy of the task's repository becomes the workspace, the unmodified ``mini`` CLI runs
against the Session's model endpoint with mini-swe-agent's ``bubblewrap`` environment (every shell
command the model writes runs in the sandbox of ``sandbox.py``; none runs on the host), and the
task's test runs in the same sandbox: exit status 0 is reward 1.0.

    python examples/mini_swe_agent/agent_server.py --slots 4 --port 8765 --work-dir /tmp/mswea

HTTP API (JSON): ``POST /v1/tasks`` {task, repo, test, base_url, api_key} → {reward, metadata};
``GET /v1/stats`` → {slots, busy, queued, peak_busy, completed}. Bad input → 400 naming the field;
a task that fails on the server (its repository cannot be copied, bwrap is gone) → 500 with the
error. A Session that relaxtrio ends early (its agent timed out) leaves its task running until
``mini``'s next model request is refused or ``--task-timeout-s`` passes; the slot is then free.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sandbox  # noqa: E402  (the example's own module, next to this file)

FIELDS = ("task", "repo", "test", "base_url", "api_key")


class BadTask(ValueError):
    """A task request with a missing or invalid field (answered 400)."""


class TaskServer(ThreadingHTTPServer):
    """HTTP server owning the slots, the running ``mini`` processes and the counters."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, slots: int, work_dir: Path, task_timeout_s: float,
                 command_timeout_s: int) -> None:
        super().__init__(address, Handler)
        self.slots = slots
        self.work_dir = work_dir
        self.task_timeout_s = task_timeout_s
        self.command_timeout_s = command_timeout_s
        self.gate = threading.BoundedSemaphore(slots)
        self.lock = threading.Lock()
        self.counts = {"busy": 0, "queued": 0, "peak_busy": 0, "completed": 0, "started": 0}
        self.procs: set[subprocess.Popen[bytes]] = set()

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"slots": self.slots, **self.counts}

    def _count(self, key: str, delta: int) -> int:
        with self.lock:
            self.counts[key] += delta
            if key == "busy":
                self.counts["peak_busy"] = max(self.counts["peak_busy"], self.counts["busy"])
            return self.counts[key]

    def run_task(self, req: dict[str, str]) -> dict[str, Any]:
        """Waits for a slot, runs the task, frees the slot; returns the Session output object."""
        self._count("queued", 1)
        with self.gate:
            self._count("queued", -1)
            self._count("busy", 1)
            try:
                return self._run(req, self._count("started", 1))
            finally:
                self._count("busy", -1)
                self._count("completed", 1)

    def _run(self, req: dict[str, str], number: int) -> dict[str, Any]:
        task_dir = self.work_dir / f"task-{number:05d}"
        workspace = task_dir / "workspace"
        shutil.copytree(HERE / req["repo"], workspace)
        env_config = {"environment": {"environment_class": "bubblewrap", "cwd": str(workspace),
                                      "timeout": self.command_timeout_s,
                                      "executable": sandbox.bwrap_executable(),
                                      "wrapper_args": sandbox.wrapper_args()}}
        (task_dir / "sandbox.yaml").write_text(json.dumps(env_config))  # JSON is YAML
        exit_status = self._run_mini(req, task_dir)
        test = sandbox.run_in_sandbox(workspace, req["test"], timeout_s=self.command_timeout_s)
        (task_dir / "test.log").write_text(test.stdout)
        traj = task_dir / "trajectory.json"
        steps = 0
        if traj.exists():
            steps = sum(1 for m in json.loads(traj.read_text()).get("messages", [])
                        if m.get("role") == "assistant")
        passed = test.returncode == 0
        return {"reward": 1.0 if passed else 0.0,
                "metadata": {"tests_passed": passed, "steps": steps, "mini_exit": exit_status,
                             "task_dir": str(task_dir)}}

    def _run_mini(self, req: dict[str, str], task_dir: Path) -> int | None:
        mini = Path(sys.executable).parent / "mini"
        argv = [str(mini) if mini.exists() else "mini", "--yolo", "--exit-immediately",
                "--model-class", "litellm_textbased", "-c", "mini_textbased.yaml",
                "-c", str(task_dir / "sandbox.yaml"),
                "-c", "model.model_name=openai/policy",
                "-c", f"model.model_kwargs.api_base={req['base_url']}",
                "-c", f"model.model_kwargs.api_key={req['api_key']}",
                # Requests may be held while relaxtrio waits for capacity or weights: a long
                # client timeout and no client retries (a retry would be a second request).
                "-c", "model.model_kwargs.timeout=3600", "-c", "model.model_kwargs.num_retries=0",
                "-c", f"model.model_kwargs.max_tokens={os.environ.get('MSWEA_MAX_TOKENS', '256')}",
                "-c", f"agent.step_limit={os.environ.get('MSWEA_STEP_LIMIT', '6')}",
                "-c", "agent.cost_limit=0", "-o", str(task_dir / "trajectory.json"), "-t", req["task"]]
        # Offline and non-interactive: no first-run prompt, no cost-map download, no telemetry,
        # a config directory per task, cost tracking off (the served model has no price).
        env = dict(os.environ, MSWEA_CONFIGURED="true", MSWEA_GLOBAL_CONFIG_DIR=str(task_dir / "mswea"),
                   MSWEA_COST_TRACKING="ignore_errors", LITELLM_LOCAL_MODEL_COST_MAP="True",
                   LITELLM_TELEMETRY="False", MSWEA_SILENT_STARTUP="1", TMPDIR=str(task_dir))
        with open(task_dir / "mini.log", "wb") as log:
            proc = subprocess.Popen(argv, cwd=task_dir, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            with self.lock:
                self.procs.add(proc)
            try:
                return proc.wait(timeout=self.task_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return None  # a run past its time limit still gets its test's reward
            finally:
                with self.lock:
                    self.procs.discard(proc)

    def stop_tasks(self) -> None:
        """Kills every running ``mini`` process group (server shutdown)."""
        with self.lock:
            procs = list(self.procs)
        for proc in procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def parse_task(body: bytes) -> dict[str, str]:
    """Validates a task request. Raises BadTask naming the first bad field."""
    try:
        req = json.loads(body)
    except ValueError as exc:
        raise BadTask(f"body: not JSON ({exc})") from None
    if not isinstance(req, dict):
        raise BadTask("body: expected a JSON object")
    for name in FIELDS:
        if not isinstance(req.get(name), str) or not req[name]:
            raise BadTask(f"{name}: required non-empty string")
    repo = (HERE / req["repo"]).resolve()
    if HERE not in repo.parents or not repo.is_dir():
        raise BadTask(f"repo: {req['repo']!r} is not a repository directory of the example")
    return {name: req[name] for name in FIELDS}


class Handler(BaseHTTPRequestHandler):
    server: TaskServer
    protocol_version = "HTTP/1.1"

    def _reply(self, status: int, obj: object) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == "/v1/stats":
            self._reply(200, self.server.stats())
        else:
            self._reply(404, {"error": f"no such path {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        if self.path != "/v1/tasks":
            self._reply(404, {"error": f"no such path {self.path}"})
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            req = parse_task(body)
        except BadTask as exc:
            self._reply(400, {"error": str(exc)})
            return
        try:
            result = self.server.run_task(req)
        except Exception as exc:  # the task's own failure: answer it, keep serving others
            self._reply(500, {"error": f"{type(exc).__name__}: {exc}"})
            return
        self._reply(200, result)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        sys.stderr.write(f"agent_server: {format % args}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, required=True, help="tasks run at once; more wait")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    parser.add_argument("--work-dir", type=Path, required=True, help="per-task directories go here")
    parser.add_argument("--task-timeout-s", type=float, default=3600.0)
    parser.add_argument("--command-timeout-s", type=int, default=60, help="one sandboxed command's limit")
    args = parser.parse_args()
    if args.slots < 1:
        parser.error("--slots must be at least 1")
    sandbox.bwrap_executable()  # fail at start, not at the first task
    args.work_dir.mkdir(parents=True, exist_ok=True)
    server = TaskServer((args.host, args.port), slots=args.slots, work_dir=args.work_dir.resolve(),
                        task_timeout_s=args.task_timeout_s, command_timeout_s=args.command_timeout_s)

    def stop(signum: int, frame: object) -> None:
        server.stop_tasks()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    host, port = server.server_address[:2]
    print(f"agent_server listening on http://{host}:{port} with {args.slots} slots", flush=True)
    server.serve_forever()
    server.stop_tasks()


if __name__ == "__main__":
    main()
