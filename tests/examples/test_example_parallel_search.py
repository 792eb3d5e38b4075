"""examples/parallel_search: a main agent and parallel searcher sub-agent processes, explicit
JSONL export of three contexts, and the outcome x usefulness credit."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from tests.support.examples import EXAMPLES, assert_response_masks, run_example

from relaxtrio.testing.scripted_server import Rule

pytestmark = pytest.mark.slow  # starts real processes

_END = r"<\|im_end\|>\n<\|im_start\|>assistant\n$"


def _call(name: str, **arguments: str) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


RULES = [
    # searchers: a lookup, then the note
    Rule(match=r"You are a searcher.*completed in 1889.*</tool_response>" + _END,
         reply="The Eiffel Tower was completed in 1889 in Paris."),
    Rule(match=r"You are a searcher.*Exposition Universelle.*</tool_response>" + _END,
         reply="The 1889 World's Fair was held in Paris."),
    Rule(match=r"You are a searcher.*user\nEiffel Tower" + _END, reply=_call("lookup", term="eiffel tower")),
    Rule(match=r"You are a searcher.*user\nWorld's Fair 1889" + _END, reply=_call("lookup", term="world's fair")),
    # main: two parallel searches, then the answer from both notes
    Rule(match=r"World's Fair\?.*</tool_response>" + _END, reply="It was built in Paris."),
    Rule(match=r"World's Fair\?" + _END,
         reply=_call("search", query="Eiffel Tower") + "\n" + _call("search", query="World's Fair 1889")),
]


async def test_main_and_two_parallel_searchers_export_three_contexts(tiny_model_dir: Path,
                                                                     tmp_path: Path) -> None:
    run = await run_example("parallel_search", tmp_path, tiny_model_dir, rules=RULES, command="rollout",
                            args=["--agentic-custom-advantage-path",
                                  "examples.parallel_search.advantage.credit",
                                  "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096"])
    assert run.returncode == 0, run.output[-3000:]
    assert run.names() == ["main", "searcher_0", "searcher_1"]
    by_name = {s["name"]: s for s in run.samples}
    assert by_name["main"]["reward"] == 1.0 and by_name["main"]["metadata"]["num_searchers"] == 2
    for sample in run.samples:
        assert assert_response_masks(sample) == 2  # every context: a tool call, then text
        assert sample["advantage"] == 0.0  # one Session: centered credit is zero
    assert 0.0 < by_name["searcher_0"]["metadata"]["usefulness"] < 1.0
    assert run.engine is not None and len(run.engine.calls) == 6


def _advantage_module():
    found = importlib.util.spec_from_file_location("ps_advantage", EXAMPLES / "parallel_search" / "advantage.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def test_credit_is_outcome_times_usefulness_centered_per_name() -> None:
    credit = _advantage_module().credit
    # Two Sessions: outcome 1.0 / usefulness 0.6, outcome 0.0 / usefulness 0.2.
    out = credit([{"main": {"outcome": 1.0}, "searcher_0": {"outcome": 1.0, "usefulness": 0.6}},
                  {"main": {"outcome": 0.0}, "searcher_0": {"outcome": 0.0, "usefulness": 0.2}}])
    assert out == [{"main": 0.5, "searcher_0": pytest.approx(0.3)},
                   {"main": -0.5, "searcher_0": pytest.approx(-0.3)}]
    # A name only one Session exported is centered over that Session alone.
    assert credit([{"main": {"outcome": 1.0}, "searcher_1": {"outcome": 1.0, "usefulness": 0.5}},
                   {"main": {"outcome": 1.0}}]) == [{"main": 0.0, "searcher_1": 0.0}, {"main": 0.0}]
