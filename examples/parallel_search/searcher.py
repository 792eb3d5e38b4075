"""A searcher sub-agent: one conversation that may look terms up in a local corpus, then writes a note.

Started by ``main_agent.py`` (one process per query, several at once). It talks to the same
model endpoint over plain HTTP (``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``, inherited), offers the
model a ``lookup(term)`` tool over ``data/corpus.json``, runs the calls of its first reply, and
takes the model's next reply as its note. A first reply without calls is the note itself. It
writes ``{"note", "messages", "tools"}`` to ``--output`` (the conversation exactly as sent and
received, so the main agent can export it).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup",
    "description": "Look a term up in the local corpus.",
    "parameters": {"type": "object", "properties": {"term": {"type": "string"}}, "required": ["term"]},
}}
SYSTEM = ("You are a searcher. Use the lookup tool to find facts for the query, "
          "then write one short note with the facts you found.")


def lookup(term: str) -> str:
    corpus = json.loads((HERE / "data" / "corpus.json").read_text(encoding="utf-8"))
    hits = [text for key, text in corpus.items() if key in term.lower() or term.lower() in key]
    return " ".join(hits) if hits else f"no entry for {term!r}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--query", required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--max-tokens", type=int, default=160)
    args = parser.parse_args()
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": args.query}]
    with httpx.Client(base_url=os.environ["OPENAI_BASE_URL"].rstrip("/") + "/", timeout=3600,
                      headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}) as client:
        def ask() -> dict:
            response = client.post("chat/completions", json={
                "model": "policy", "messages": messages, "tools": [LOOKUP_TOOL], "max_tokens": args.max_tokens})
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            messages.append({k: v for k, v in message.items() if v is not None})
            return messages[-1]

        reply = ask()
        if reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                term = str(json.loads(call["function"]["arguments"] or "{}").get("term", ""))
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": lookup(term)})
            reply = ask()
    args.output.write_text(json.dumps({"note": reply.get("content") or "", "messages": messages,
                                       "tools": [LOOKUP_TOOL]}), encoding="utf-8")


if __name__ == "__main__":
    main()
