"""Benchmark: SessionForest.match against the naive prefix loop (``reference_s``).

The naive loop (docs/canonical-contract.md#prefix-matching) re-serializes and re-hashes
``messages[:k]`` for k = n, n-1, ..., 1 until a committed state is found: O(n^2) bytes when the
longest committed prefix is short. ``SessionForest.match`` hashes the request once, message by
message.

Two scenarios per size n (number of request messages; realistic messages of a few hundred
characters, every other assistant turn with a tool call):

* ``no_prefix``: the forest holds a committed n-message agent conversation; the request is the
  same conversation with a different task message (a new task or a compacted history), so no
  prefix is committed and the naive loop hashes all n prefixes. This is the headline ratio.
* ``extend``: the request is the committed conversation plus one new tool result (the common agent
  turn; the naive loop finds the match after two hashes).

Timings are seconds per match (median of repeated runs). ``ours_s`` times ``forest.match`` on an
already canonical Conversation (the API builds it once to validate the request anyway);
``ours_with_canonicalize_s`` adds ``Conversation.from_wire`` on the raw wire messages. Prints one
JSON line per size.

Run: ``.venv/bin/python benchmarks/forest_matching.py [--sizes 16 64 256 1024]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from typing import Any

from relaxtrio.forest import Conversation, SessionForest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web and return the top snippets.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "top_k": {"type": "integer"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file from the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
]
TEMPLATE_KWARGS = {"enable_thinking": False}


def _text(rng: random.Random, n_chars: int) -> str:
    words = []
    total = 0
    while total < n_chars:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
        words.append(word)
        total += len(word) + 1
    return " ".join(words)


def make_messages(n: int, seed: int = 0, task: str = "Find the population of Lyon.") -> list[dict[str, Any]]:
    """A wire-shaped agent conversation of exactly ``n`` messages."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a research agent. " + _text(rng, 300)},
        {"role": "user", "content": task + " " + _text(rng, 200)},
    ]
    turn = 0
    while len(messages) < n:
        if messages[-1]["role"] != "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": _text(rng, rng.randint(150, 400))}
            if turn % 2 == 0:
                message["tool_calls"] = [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {
                            "name": "search",
                            "arguments": json.dumps({"top_k": 3, "query": _text(rng, 40)}),
                        },
                    }
                ]
            turn += 1
        elif "tool_calls" in messages[-1]:
            message = {
                "role": "tool",
                "tool_call_id": messages[-1]["tool_calls"][0]["id"],
                "content": _text(rng, 350),
            }
        else:
            message = {"role": "user", "content": _text(rng, 250)}
        messages.append(message)
    return messages[:n]


def commit_linear(forest: SessionForest, conv: Conversation) -> None:
    """Commits ``conv`` as one lineage: observations for non-assistant runs, responses otherwise."""
    messages = conv.messages
    k = 0
    parent = None
    while k < len(messages):
        if messages[k]["role"] == "assistant" and parent is not None:
            ids = list(range(len(messages[k]["content"]) // 4 + 1))
            parent = forest.add_response(
                parent, messages[k], token_ids=ids, rollout_logprobs=[-0.5] * len(ids), finish_reason="stop"
            )
            k += 1
            continue
        end = k
        while end < len(messages) and (messages[end]["role"] != "assistant" or end == 0):
            end += 1
        end = max(end, k + 1)
        match = forest.match(Conversation(messages[:end], conv.tools, conv.template_kwargs))
        parent = forest.add_observation(match, token_ids=list(range(50 * (end - k))))
        k = end


def _reference_hash(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], kwargs: dict[str, Any]
) -> str:
    payload = json.dumps(
        {"messages": messages, "tools": tools, "template_kwargs": kwargs},
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def reference_match(
    forest: SessionForest, messages: list[dict[str, Any]], tools: list[dict[str, Any]], kwargs: dict[str, Any]
) -> tuple[Any, list[dict[str, Any]]]:
    """The naive matching loop: re-hash every prefix, longest first.

    See docs/canonical-contract.md#prefix-matching.
    """
    for prefix_length in range(len(messages), 0, -1):
        parent = forest.get(_reference_hash(messages[:prefix_length], tools, kwargs))
        if parent is not None:
            return parent, messages[prefix_length:]
    return forest.root, messages


def per_call_s(fn: Callable[[], object], budget_s: float) -> float:
    """Median seconds per call over repeated batches filling about ``budget_s``."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    batch = max(1, int(0.02 / once))
    rounds = max(3, min(25, int(budget_s / (once * batch))))
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch)
    return statistics.median(samples)


def time_scenario(n: int, scenario: str, budget_s: float) -> dict[str, Any]:
    """Times one scenario at ``n`` request messages and checks both matchers agree."""
    forest = SessionForest("bench")
    if scenario == "no_prefix":
        committed = make_messages(n)
        wire = make_messages(n, task="Summarize the previous findings about Lyon.")
    else:
        committed = make_messages(n - 1)
        wire = make_messages(n)
    commit_linear(forest, Conversation.from_wire(committed, TOOLS, TEMPLATE_KWARGS))
    conv = Conversation.from_wire(wire, TOOLS, TEMPLATE_KWARGS)
    canonical = list(conv.messages)
    tools, kwargs = list(conv.tools), conv.template_kwargs
    ours = forest.match(conv)
    ref_parent, ref_delta = reference_match(forest, canonical, tools, kwargs)
    if ours.parent is not ref_parent or list(ours.delta) != ref_delta:
        raise SystemExit(f"mismatch at n={n} ({scenario})")
    ours_s = per_call_s(lambda: forest.match(conv), budget_s)
    e2e_s = per_call_s(lambda: forest.match(Conversation.from_wire(wire, TOOLS, TEMPLATE_KWARGS)), budget_s)
    ref_s = per_call_s(lambda: reference_match(forest, canonical, tools, kwargs), budget_s)
    return {
        "matched_messages": len(wire) - len(ref_delta),
        "ours_s": ours_s,
        "ours_with_canonicalize_s": e2e_s,
        "reference_s": ref_s,
        "ratio": ref_s / ours_s,
        "ratio_with_canonicalize": ref_s / e2e_s,
    }


def run_size(n: int, budget_s: float) -> dict[str, Any]:
    """Both scenarios at ``n`` request messages; ``ratio`` is the ``no_prefix`` speed-up."""
    result: dict[str, Any] = {"benchmark": "forest_matching", "n_messages": n}
    for scenario in ("no_prefix", "extend"):
        result[scenario] = time_scenario(n, scenario, budget_s)
    result["ratio"] = result["no_prefix"]["ratio"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--budget-s", type=float, default=0.5, help="rough time budget per timing")
    args = parser.parse_args(argv)
    for n in args.sizes:
        print(json.dumps(run_size(n, args.budget_s)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
