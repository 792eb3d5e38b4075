"""The main agent of a multi-agent app: it plans searches, runs searcher sub-agents in parallel
(each its own process with its own HTTP conversation), and answers from their notes.

1. Planning turn: the model sees the question and a ``search(query)`` tool. Every ``search``
   call it makes (several in one reply are run concurrently) starts one searcher process
   (``searcher.py``); its note comes back as the tool result. A reply without calls gets the
   app's default plan instead: ``--num-searchers`` searchers on the question, each told to focus
   on another aspect, whose notes come back as one user message.
2. Answer turn: the model answers with the notes in view.

Export: the process writes one explicit JSONL record per context to ``--output-json``:
``main`` (its conversation, ``metadata.outcome`` 1.0 when the answer names the expected one, and
that outcome as the Session's one ``reward``) and ``searcher_<i>`` (each searcher's
conversation, with ``metadata.usefulness``: the share of its note's words that the main answer
reused, and no reward). ``advantage.credit`` turns that into per-context credit.

Every model call is a plain HTTP POST to ``$OPENAI_BASE_URL/chat/completions`` with
``OPENAI_API_KEY`` as bearer token (no SDK), as many in-house apps do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

SEARCH_TOOL = {"type": "function", "function": {
    "name": "search",
    "description": "Ask a searcher sub-agent to research one query; returns its note.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
}}
HERE = Path(__file__).resolve().parent
FALLBACK_ASPECTS = ("names and places", "dates and numbers", "people", "causes")


def words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 3}


def chat(client: httpx.Client, messages: list[dict[str, Any]], max_tokens: int,
         tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "policy", "messages": messages, "max_tokens": max_tokens}
    if tools:
        body["tools"] = tools
    response = client.post("chat/completions", json=body)
    response.raise_for_status()
    message = response.json()["choices"][0]["message"]
    return {k: v for k, v in message.items() if v is not None}


def run_searchers(queries: list[str], workdir: Path) -> list[dict[str, Any]]:
    """Starts one searcher process per query at once, waits for all; their result records."""
    procs = []
    for i, query in enumerate(queries):
        out = workdir / f"searcher_{i}.json"
        procs.append((out, subprocess.Popen([sys.executable, str(HERE / "searcher.py"), "--query", query,
                                             "--output", str(out)])))
    results = []
    for out, proc in procs:
        if proc.wait() != 0:
            raise SystemExit(f"searcher failed with exit code {proc.returncode}")
        results.append(json.loads(out.read_text(encoding="utf-8")))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    parser.add_argument("--num-searchers", type=int, default=2)
    parser.add_argument("--max-searchers", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=192)
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    messages = task["messages"]
    question = messages[-1]["content"]
    answer = str(task.get("metadata", {}).get("answer", ""))
    workdir = Path(os.environ.get("RELAX_SESSION_IO_DIR") or tempfile.mkdtemp())
    # A request may be held while the Group starts or weights update: a long timeout.
    with httpx.Client(base_url=os.environ["OPENAI_BASE_URL"].rstrip("/") + "/", timeout=3600,
                      headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}) as client:
        plan = chat(client, messages, args.max_tokens, tools=[SEARCH_TOOL])
        messages.append(plan)
        calls = [c for c in plan.get("tool_calls", []) if c["function"]["name"] == "search"]
        calls = calls[: args.max_searchers]
        if calls:
            queries = [str(json.loads(c["function"]["arguments"] or "{}").get("query") or question) for c in calls]
        else:
            queries = [f"{question} (focus on {FALLBACK_ASPECTS[i % len(FALLBACK_ASPECTS)]})"
                       for i in range(args.num_searchers)]
        searchers = run_searchers(queries, workdir)
        if calls:
            for call in plan.get("tool_calls", []):
                index = next((i for i, c in enumerate(calls) if c["id"] == call["id"]), None)
                note = searchers[index]["note"] if index is not None else "error: search limit reached"
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": note or "(empty note)"})
        else:
            notes = "\n".join(f"Note {i + 1}: {s['note'] or '(empty)'}" for i, s in enumerate(searchers))
            messages.append({"role": "user", "content": f"Searcher notes:\n{notes}\nNow answer the question."})
        final = chat(client, messages, args.max_tokens, tools=[SEARCH_TOOL])
        messages.append(final)
    text = final.get("content") or ""
    outcome = 1.0 if answer and re.search(rf"\b{re.escape(answer)}\b", text, re.I) else 0.0
    used = words(text)
    records = [{"name": "main", "messages": messages, "tools": [SEARCH_TOOL],
                "metadata": {"role": "main", "outcome": outcome, "num_searchers": len(searchers)},
                "reward": outcome}]
    for i, s in enumerate(searchers):
        note_words = words(s["note"])
        usefulness = len(note_words & used) / len(note_words) if note_words else 0.0
        records.append({"name": f"searcher_{i}", "messages": s["messages"], "tools": s["tools"],
                        "metadata": {"role": "searcher", "outcome": outcome, "usefulness": usefulness}})
    args.output_json.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


if __name__ == "__main__":
    main()
