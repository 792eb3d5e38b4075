"""Running an example under ``examples/`` through ``python -m relaxtrio rollout`` or ``train``.

The job runs as a real subprocess with the example's own launcher (``bash run_agent_app.sh``),
either on the embedded engine with a given model, or on a scripted engine served over SGLang's
native API (:mod:`relaxtrio.testing.scripted_server`) that answers with the harness's tool calls.
Every agent gets a marker variable, so that the test can check afterwards that no process of the
run (agent, sub-agent, tool, CLI) is left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from relaxtrio.models import load_tokenizer
from relaxtrio.testing.scripted_engine import ScriptedEngine
from relaxtrio.testing.scripted_server import Rule, rules_engine, serve_scripted_engine

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
MARK_VAR = "RELAXTRIO_EXAMPLE_TEST_MARK"


@attrs.define(kw_only=True)
class ExampleRun:
    """What one job left: exit code, output text, sample records, and the scripted engine."""

    returncode: int
    output: str
    samples: list[dict[str, Any]]
    dump: dict[str, Any]
    engine: ScriptedEngine | None
    output_dir: Path

    def names(self) -> list[str | None]:
        return [s["name"] for s in self.samples]

    def sessions(self) -> list[dict[str, Any]]:
        """The dumped Sessions of every Group (accepted and dropped), forests included."""
        return [s for g in self.dump.get("groups", []) for s in g["sessions"]]


def processes_with_mark(mark: str) -> list[int]:
    """Pids of live processes whose environment carries ``MARK_VAR=mark``."""
    needle = f"{MARK_VAR}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if needle in env.split(b"\0") and stat[stat.rfind(")") + 2:].split()[0] != "Z":
            found.append(int(entry.name))
    return found


def assert_response_masks(sample: dict[str, Any], *, min_responses: int = 1) -> int:
    """Checks a sample's loss mask: 0 over the prompt, then runs of 1 (responses) and 0
    (observations), the last token trained; returns the number of response runs."""
    mask = sample["loss_mask"]
    assert len(mask) == len(sample["token_ids"]) == len(sample["rollout_logprobs"])
    prompt = sample["prompt_length"]
    assert prompt > 0 and set(mask[:prompt]) == {0} and mask[prompt] == 1 and mask[-1] == 1
    runs = sum(1 for i in range(prompt, len(mask)) if mask[i] == 1 and mask[i - 1] == 0)
    assert runs >= min_responses, (runs, min_responses)
    for lp, m in zip(sample["rollout_logprobs"], mask, strict=True):
        assert (lp == 0.0) if m == 0 else lp <= 0.0
    return runs


async def run_example(
    example: str,
    tmp_path: Path,
    model_dir: Path,
    *,
    rules: Sequence[Rule] | None = None,
    engine: ScriptedEngine | None = None,
    command: str = "train",
    args: Sequence[str] = (),
    agent_env: Sequence[str] = (),
    timeout_s: float = 300,
) -> ExampleRun:
    """Runs ``python -m relaxtrio <command>`` on ``examples/<example>`` for one step.

    Args:
        example: directory name under ``examples/``; its ``data/train.jsonl`` is the prompt data.
        model_dir: the model (tokenizer) the job loads.
        rules: when given, generation goes to a scripted engine answering by these rules;
            otherwise the job starts the embedded engine on ``model_dir``.
        engine: a scripted engine of the test's own (instead of ``rules``; e.g. one that holds a
            reply on a gate).
        command: ``rollout`` (no training; samples are read from its samples file) or ``train``
            (one step; samples are read from its rollout dump).
        args: more flags (they override the defaults set here).
        agent_env: ``KEY=VALUE`` for ``--agent-env``.
    """
    out = tmp_path / "run"
    mark = uuid.uuid4().hex
    argv = [sys.executable, "-m", "relaxtrio", command,
            "--agent-cwd", str(EXAMPLES / example), "--agent-command", "bash run_agent_app.sh",
            "--prompt-data", str(EXAMPLES / example / "data" / "train.jsonl"),
            "--hf-checkpoint", str(model_dir), "--output-dir", str(out),
            "--num-rollout", "1", "--n-samples-per-prompt", "1", "--rollout-batch-size", "1",
            "--no-rollout-shuffle", "--agent-timeout", "240", "--rollout-max-response-len", "512", "--log-level", "INFO",
            "--save-debug-rollout-data", str(out / "dump_{rollout_id}.json"),
            "--agent-env", f"{MARK_VAR}={mark}", *agent_env, *args]
    # As if the virtual environment were activated: agents' launchers find its python and tools.
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false", VIRTUAL_ENV=sys.prefix,
               PATH=f"{venv_bin}:{os.environ.get('PATH', '')}")
    with trio.fail_after(timeout_s):
        async with trio.open_nursery() as nursery:
            if rules is not None:
                tokenizer = load_tokenizer(model_dir)
                engine = rules_engine(tokenizer, tokenizer.eos_token_id, rules)
            if engine is not None:
                url = await nursery.start(serve_scripted_engine, engine)
                argv[argv.index("--output-dir"):argv.index("--output-dir")] = ["--engine-url", url]
            done = await trio.run_process(argv, env=env, cwd=tmp_path, check=False,
                                          capture_stdout=True, stderr=subprocess.STDOUT)
            nursery.cancel_scope.cancel()
    output = done.stdout.decode(errors="replace")
    (tmp_path / "job.log").write_text(output)
    dump_path = out / "dump_0.json"
    dump = json.loads(dump_path.read_text()) if dump_path.exists() else {}
    left = processes_with_mark(mark)
    assert not left, f"processes of the run left behind: {left}"
    return ExampleRun(returncode=done.returncode, output=output, samples=dump.get("samples", []), dump=dump,
                      engine=engine,
                      output_dir=out)
