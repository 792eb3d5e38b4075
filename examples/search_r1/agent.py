"""A Search-R1 style agent (openai SDK): it answers a question by searching a shared BM25 retriever.

Each turn the model either asks for a search (``<search>query</search>``) or answers
(``<answer>text</answer>``); a reply with neither gets a reminder. Reward: exact match of the
answer against the task's ``metadata.answers`` (``qa.py``).

Two modes (``--mode``, or ``SEARCH_R1_MODE`` in the environment):

- ``text``: one context. The search results come back to the model as the next user message
  (``<information>...</information>``). The agent writes ``{"reward", "metadata"}``; export is
  implicit (the Session's one conversation).
- ``multi``: a main agent and searcher sub-agents, several contexts. Each ``<search>`` of the
  main conversation goes to a new searcher conversation (its own system prompt): the searcher may
  rewrite the query (``<search>``), reads the retrieved passages and writes a note, which comes
  back to the main conversation as the ``<information>``. The agent writes explicit JSONL export
  records: ``main`` (``metadata.outcome`` and the Session's one ``reward``, for
  ``--log-passrate``) and ``searcher_<i>`` (``metadata.outcome`` and ``metadata.found``: 1.0 when
  its note names a gold answer; no reward). ``advantage.py`` turns them into credit.

Settings: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` (the model), ``RETRIEVER_URL`` (the retriever
started once for the whole run, ``retriever.py``), ``SEARCH_R1_MAX_TURNS`` (default 4),
``SEARCH_R1_TOPK`` (default 3), ``SEARCH_R1_MAX_TOKENS`` (per reply, default 256).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from openai import OpenAI

from qa import exact_match, information, mentions, parse_action, retrieve

RETRIEVER_URL = os.environ.get("RETRIEVER_URL", "http://127.0.0.1:8000")
MAX_TURNS = int(os.environ.get("SEARCH_R1_MAX_TURNS", "4"))
TOPK = int(os.environ.get("SEARCH_R1_TOPK", "3"))
REMINDER = "Write a search query between <search> and </search>, or the answer between <answer> and </answer>."
SEARCHER_SYSTEM = ("You are a search assistant. Rewrite the query you are given as one short search between "
                   "<search> and </search>. After the results arrive, write a short note with the facts that "
                   "answer the query.")


class Model:
    """One model endpoint shared by the main and searcher conversations."""

    def __init__(self, max_tokens: int) -> None:
        # A request may be held while its Group starts or weights update: a long timeout.
        self.client = OpenAI(timeout=3600, max_retries=2)
        self.max_tokens = max_tokens

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """Sends the conversation, appends the reply to it (as returned) and gives its text."""
        response = self.client.chat.completions.create(model="policy", messages=messages,
                                                       max_tokens=self.max_tokens)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        return message.content or ""


def solve(model: Model, messages: list[dict[str, Any]], search: Callable[[str], str],
          max_turns: int) -> tuple[str | None, int]:
    """Runs the search-or-answer loop on ``messages`` (extended in place); returns the answer
    (None when the turns ran out) and the number of searches."""
    searches = 0
    for turn in range(max_turns):
        action = parse_action(model.reply(messages))
        if action is not None and action[0] == "answer":
            return action[1], searches
        if turn == max_turns - 1:
            break
        if action is None:
            messages.append({"role": "user", "content": REMINDER})
        else:
            searches += 1
            messages.append({"role": "user", "content": search(action[1])})
    return None, searches


def run_searcher(model: Model, http: httpx.Client, query: str) -> tuple[str, list[dict[str, Any]]]:
    """One searcher conversation: a query rewrite, the passages, a note. Returns the note and the
    conversation (exactly as sent and received, for export)."""
    messages = [{"role": "system", "content": SEARCHER_SYSTEM}, {"role": "user", "content": f"Query: {query}"}]
    action = parse_action(model.reply(messages))
    rewritten = action[1] if action is not None and action[0] == "search" else query
    messages.append({"role": "user", "content": information(retrieve(http, RETRIEVER_URL, rewritten, TOPK))})
    return model.reply(messages).strip(), messages


def text_mode(model: Model, http: httpx.Client, task: dict[str, Any], output: Path) -> None:
    messages, gold = task["messages"], list(task["metadata"]["answers"])
    answer, searches = solve(model, messages,
                             lambda q: information(retrieve(http, RETRIEVER_URL, q, TOPK)), MAX_TURNS)
    reward = exact_match(answer, gold)
    output.write_text(json.dumps({"reward": reward, "metadata": {"searches": searches,
                                                                 "answered": answer is not None}}))


def multi_mode(model: Model, http: httpx.Client, task: dict[str, Any], output: Path) -> None:
    messages, gold = task["messages"], list(task["metadata"]["answers"])
    searchers: list[tuple[str, list[dict[str, Any]]]] = []

    def search(query: str) -> str:
        note, conversation = run_searcher(model, http, query)
        searchers.append((note, conversation))
        return f"<information>\n{note or 'No note.'}\n</information>"

    answer, searches = solve(model, messages, search, MAX_TURNS)
    outcome = exact_match(answer, gold)
    records = [{"name": "main", "messages": messages, "reward": outcome,
                "metadata": {"role": "main", "outcome": outcome, "searches": searches}}]
    records += [{"name": f"searcher_{i}", "messages": conversation,
                 "metadata": {"role": "searcher", "outcome": outcome, "found": float(mentions(note, gold))}}
                for i, (note, conversation) in enumerate(searchers)]
    output.write_text("".join(json.dumps(r) + "\n" for r in records))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--input-json", type=Path, required=True)
    parser.add_argument("--output-json", type=Path, required=True)
    parser.add_argument("--mode", choices=("text", "multi"), default=os.environ.get("SEARCH_R1_MODE", "text"))
    args = parser.parse_args()
    task = json.loads(args.input_json.read_text(encoding="utf-8"))
    model = Model(int(os.environ.get("SEARCH_R1_MAX_TOKENS", "256")))
    with httpx.Client(timeout=60) as http:
        (text_mode if args.mode == "text" else multi_mode)(model, http, task, args.output_json)


if __name__ == "__main__":
    main()
