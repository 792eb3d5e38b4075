"""examples/search_r1: a Search-R1 agent over one BM25 retriever started once for the run (a
cross-session service), in text mode (one context, implicit export) and multi-agent mode (main +
searcher contexts, explicit export, per-role custom advantage, pass rate on ``main``); plus its
reward, its retriever and its credit function on their own."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from types import ModuleType

import httpx
import pytest
import trio
from tests.support.examples import EXAMPLES, REPO, assert_response_masks, run_example

from relaxtrio.models import load_tokenizer
from relaxtrio.testing.scripted_server import Rule, rules_engine, serve_scripted_engine

HERE = EXAMPLES / "search_r1"
_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"


def _approx(value: float) -> object:
    return pytest.approx(value, abs=1e-4)  # credits are divided by std + 1e-6


def _module(name: str) -> ModuleType:
    found = importlib.util.spec_from_file_location(f"search_r1_{name}", HERE / f"{name}.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


@asynccontextmanager
async def _retriever() -> AsyncIterator[str]:
    """The example's retriever as ``launch.sh`` starts it (once, before the run); yields its URL."""
    async with trio.open_nursery() as nursery:
        process = await nursery.start(partial(
            trio.run_process, [sys.executable, str(HERE / "retriever.py"), "--port", "0"],
            stdout=subprocess.PIPE, check=False))
        line = b""
        with trio.fail_after(60):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some()
                assert chunk, "the retriever exited before listening"
                line += chunk
        yield line.decode().removeprefix("retriever listening on ").strip()
        nursery.cancel_scope.cancel()


def _requests_served(url: str) -> int:
    return httpx.get(url + "/health", timeout=10).json()["requests"]


# Text mode, two Sessions of two prompts. Sydney: two searches (topk 1), then the right answer.
# Hubble: a reply without tags (a reminder comes back), a search, then a wrong answer.
TEXT_RULES = [
    Rule(match=r"born in Copenhagen in 1918.*</information>" + _END, reply="<answer>Copenhagen</answer>"),
    Rule(match=r"Bennelong Point.*</information>" + _END,
         reply="The architect was Jorn Utzon. <search>Jorn Utzon</search>"),
    Rule(match=r"designer of the Sydney Opera House born\?" + _END,
         reply="<search>Sydney Opera House architect</search>"),
    Rule(match=r"Space Shuttle Discovery\..*</information>" + _END, reply="<answer>Atlantis</answer>"),
    Rule(match=r"or the answer between <answer> and </answer>\." + _END,
         reply="<search>Hubble Space Telescope launch</search>"),
    Rule(match=r"Hubble Space Telescope into orbit\?" + _END, reply="I should look this up."),
]


@pytest.mark.slow  # starts real processes
async def test_text_mode_two_sessions_share_the_one_retriever(tiny_model_dir: Path, tmp_path: Path) -> None:
    async with _retriever() as url:
        run = await run_example("search_r1", tmp_path, tiny_model_dir, rules=TEXT_RULES, command="rollout",
                                agent_env=[f"RETRIEVER_URL={url}", "SEARCH_R1_TOPK=1"],
                                args=["--rollout-batch-size", "2", "--log-passrate"])
        served = await trio.to_thread.run_sync(_requests_served, url)
    assert run.returncode == 0, run.output[-3000:]
    sydney, hubble = sorted(run.samples, key=lambda s: -s["reward"])
    assert run.names() == [None, None]
    assert (sydney["reward"], sydney["metadata"]["searches"]) == (1.0, 2)
    assert (hubble["reward"], hubble["metadata"]["searches"]) == (0.0, 1)
    assert hubble["metadata"]["answered"] is True
    assert assert_response_masks(sydney) == 3 and assert_response_masks(hubble) == 3
    assert served == 3  # one retriever answered both Sessions' searches
    assert run.engine is not None and len(run.engine.calls) == 6
    metrics = [json.loads(line) for line in (run.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["rollout/pass@1"] == 0.5


def _retriever_pids() -> set[int]:
    needle = str(HERE / "retriever.py").encode()
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "cmdline").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow  # starts real processes
async def test_launch_script_starts_the_retriever_for_the_run_and_stops_it(tiny_model_dir: Path,
                                                                          tmp_path: Path) -> None:
    before = _retriever_pids()
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = rules_engine(tokenizer, tokenizer.eos_token_id, TEXT_RULES)
    out = tmp_path / "run"
    venv_bin = str(Path(sys.executable).parent)
    env = dict(os.environ, PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false", VIRTUAL_ENV=sys.prefix,
               PATH=f"{venv_bin}:{os.environ.get('PATH', '')}", RETRIEVER_PORT="0", SEARCH_R1_TOPK="1")
    with trio.fail_after(300):
        async with trio.open_nursery() as nursery:
            url = await nursery.start(serve_scripted_engine, engine)
            done = await trio.run_process(
                ["bash", str(HERE / "launch.sh"), "rollout", "--prompt-data", str(HERE / "data" / "train.jsonl"),
                 "--hf-checkpoint", str(tiny_model_dir), "--engine-url", url, "--output-dir", str(out),
                 "--num-rollout", "1", "--n-samples-per-prompt", "1", "--rollout-batch-size", "1",
                 "--no-rollout-shuffle", "--rollout-max-response-len", "512",
                 "--save-debug-rollout-data", str(out / "dump_{rollout_id}.json")],
                env=env, cwd=tmp_path, check=False, capture_stdout=True, stderr=subprocess.STDOUT)
            nursery.cancel_scope.cancel()
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output[-3000:]
    [sample] = json.loads((out / "dump_0.json").read_text())["samples"]
    assert sample["reward"] == 1.0 and sample["metadata"]["searches"] == 2
    assert _retriever_pids() <= before  # the retriever ended with the run


# Multi-agent mode, one Session: main -> searcher_0 (rewrite, note without the answer) -> main ->
# searcher_1 (rewrite, note naming Copenhagen) -> main answers.
MULTI_RULES = [
    Rule(match=r"search assistant.*Query: Sydney Opera House architect.*</information>" + _END,
         reply="The opera house was designed by Jorn Utzon."),
    Rule(match=r"search assistant.*Query: Sydney Opera House architect" + _END,
         reply="<search>Sydney Opera House</search>"),
    Rule(match=r"search assistant.*Query: Jorn Utzon.*</information>" + _END,
         reply="Jorn Utzon was born in Copenhagen."),
    Rule(match=r"search assistant.*Query: Jorn Utzon" + _END, reply="<search>Jorn Utzon birthplace</search>"),
    Rule(match=r"born in Copenhagen\.\n</information>" + _END, reply="<answer>Copenhagen</answer>"),
    Rule(match=r"designed by Jorn Utzon\.\n</information>" + _END, reply="<search>Jorn Utzon</search>"),
    Rule(match=r"designer of the Sydney Opera House born\?" + _END,
         reply="<search>Sydney Opera House architect</search>"),
]


@pytest.mark.slow  # starts real processes
async def test_multi_agent_mode_exports_main_and_searchers_with_per_role_credit(tiny_model_dir: Path,
                                                                               tmp_path: Path) -> None:
    async with _retriever() as url:
        run = await run_example(
            "search_r1", tmp_path, tiny_model_dir, rules=MULTI_RULES, command="rollout",
            agent_env=[f"RETRIEVER_URL={url}", "SEARCH_R1_MODE=multi"],
            args=["--agentic-custom-advantage-path", "examples.search_r1.advantage.per_role_credit",
                  "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096", "--log-passrate"])
        served = await trio.to_thread.run_sync(_requests_served, url)
    assert run.returncode == 0, run.output[-3000:]
    assert run.names() == ["main", "searcher_0", "searcher_1"]
    by_name = {s["name"]: s for s in run.samples}
    main, first, second = by_name["main"], by_name["searcher_0"], by_name["searcher_1"]
    assert main["reward"] == 1.0 and main["metadata"]["searches"] == 2
    assert first["reward"] is None and second["reward"] is None  # the outcome is main's alone
    assert (first["metadata"]["found"], second["metadata"]["found"]) == (0.0, 1.0)
    assert assert_response_masks(main) == 3
    assert assert_response_masks(first) == 2 and assert_response_masks(second) == 2
    # One Session: main is alone in its role (0); the searchers are standardized against each other.
    assert main["advantage"] == 0.0
    assert first["advantage"] == _approx(-1.0) and second["advantage"] == _approx(1.0)
    assert served == 2
    metrics = [json.loads(line) for line in (run.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["rollout/pass@1"] == 1.0


def test_reward_is_exact_match_after_normalization() -> None:
    qa = _module("qa")
    assert qa.exact_match("The Netherlands.", ["Netherlands"]) == 1.0
    assert qa.exact_match("  space shuttle DISCOVERY ", ["Space Shuttle Discovery"]) == 1.0
    assert qa.exact_match("Discovery shuttle", ["Discovery"]) == 0.0
    assert qa.exact_match("", ["Warsaw"]) == 0.0 and qa.exact_match(None, ["Warsaw"]) == 0.0
    assert qa.parse_action("hmm <search> jorn utzon </search> <answer>x</answer>") == ("search", "jorn utzon")
    assert qa.parse_action("<search> </search><answer>Copenhagen</answer>") == ("answer", "Copenhagen")
    assert qa.parse_action("<answer>Copenhagen") is None
    assert qa.mentions("He was born in Copenhagen.", ["copenhagen"])
    assert not qa.mentions("Born near Copenhagenville.", ["Copenhagen"])


def test_retriever_ranks_the_corpus_and_names_a_bad_field() -> None:
    retriever = _module("retriever")
    index = retriever.Index(retriever.load_corpus(HERE / "data" / "corpus.jsonl"))
    assert [r["id"] for r in index.search("Sydney Opera House architect", 2)] == ["d05", "d06"]
    assert index.search("Jorn Utzon", 1)[0]["title"] == "Jorn Utzon"
    assert index.search("zzyzx quux", 3) == []  # no shared word: nothing, not arbitrary passages
    assert index.requests == 3
    assert retriever.parse_request(b'{"query": "nile"}') == ("nile", 3)
    for body, field in [(b"[1]", "body"), (b"{", "body"), (b'{"query": ""}', "query"),
                        (b'{"query": "nile", "topk": 11}', "topk"), (b'{"query": "nile", "topk": true}', "topk")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            retriever.parse_request(body)


def test_every_task_is_answerable_from_the_corpus() -> None:
    qa = _module("qa")
    corpus = " ".join(json.loads(line)["text"] for line in (HERE / "data" / "corpus.jsonl").read_text().splitlines())
    for line in (HERE / "data" / "train.jsonl").read_text().splitlines():
        assert qa.mentions(corpus, json.loads(line)["metadata"]["answers"]), line


def test_per_role_credit_standardizes_each_role_over_the_group() -> None:
    credit = _module("advantage").per_role_credit
    main = {"role": "main"}
    searcher = {"role": "searcher"}
    out = credit([
        {"main": dict(main, outcome=1.0), "searcher_0": dict(searcher, outcome=1.0, found=1.0)},
        {"main": dict(main, outcome=0.0), "searcher_0": dict(searcher, outcome=0.0, found=1.0),
         "searcher_1": dict(searcher, outcome=0.0, found=0.0)},
    ])
    # main: [1, 0] -> +-1. searchers: raw [1, 0.5, 0], mean 0.5, std sqrt(1/6).
    assert out[0]["main"] == _approx(1.0) and out[1]["main"] == _approx(-1.0)
    scale = (1 / 6) ** 0.5
    assert out[0]["searcher_0"] == _approx(0.5 / scale)
    assert out[1] == {"main": _approx(-1.0), "searcher_0": _approx(0.0),
                      "searcher_1": _approx(-0.5 / scale)}
    # All equal within a role: zeros (nothing to learn from).
    same = credit([{"main": dict(main, outcome=1.0)}, {"main": dict(main, outcome=1.0)}])
    assert same == [{"main": 0.0}, {"main": 0.0}]


@pytest.mark.slow  # the retriever is a process
def test_the_retriever_exits_when_its_launcher_is_killed() -> None:
    """A launcher killed with SIGKILL runs no cleanup: the retriever notices its parent is gone."""
    import select

    launcher = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} {HERE / 'retriever.py'} --port 0 & echo $!; wait"],
        stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    retriever_pid = int(launcher.stdout.readline())
    assert launcher.stdout.readline().startswith("retriever listening on ")
    launcher.kill()
    launcher.wait()
    # The pipe reaches end-of-file when its last writer, the retriever, has exited.
    ready, _, _ = select.select([launcher.stdout], [], [], 30)
    try:
        assert ready and launcher.stdout.read() == "", "the retriever outlived its launcher"
    finally:
        launcher.stdout.close()
        try:
            os.kill(retriever_pid, 9)
        except ProcessLookupError:
            pass
