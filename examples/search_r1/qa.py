"""What both search_r1 agents share: the reply format, the retriever client, and the reward.

Reply format (Search-R1's tags): a reply asks for a search with ``<search>query</search>`` or ends
the task with ``<answer>text</answer>``; search results come back in the next user message between
``<information>`` and ``</information>``.

Reward: exact match. The answer and each gold answer are normalized (lower case, punctuation and
the articles a/an/the dropped, whitespace collapsed); the reward is 1.0 when the answer equals one
of them, else 0.0. A reply without ``<answer>`` scores 0.0.
"""

from __future__ import annotations

import re
import string
from typing import Any

import httpx

_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.S)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def parse_action(reply: str) -> tuple[str, str] | None:
    """The reply's first ``("search" | "answer", text)`` (text stripped), or None when it has
    neither tag (or only empty ones)."""
    for match in _TAG.finditer(reply):
        if match.group(2).strip():
            return match.group(1), match.group(2).strip()
    return None


def normalize_answer(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = _ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION))
    return " ".join(text.split())


def exact_match(answer: str | None, gold: list[str]) -> float:
    """1.0 when ``answer`` normalizes to one of ``gold``'s normalized answers, else 0.0."""
    if answer is None:
        return 0.0
    return 1.0 if normalize_answer(answer) in {normalize_answer(g) for g in gold} else 0.0


def mentions(text: str, gold: list[str]) -> bool:
    """Whether one of ``gold`` occurs in ``text`` as whole normalized words."""
    padded = f" {normalize_answer(text)} "
    return any(f" {normalize_answer(g)} " in padded for g in gold if normalize_answer(g))


def retrieve(client: httpx.Client, url: str, query: str, topk: int) -> list[dict[str, Any]]:
    """The retriever's ``topk`` passages for ``query`` (``POST {url}/retrieve``).

    Raises:
        httpx.HTTPError: the retriever is unreachable or answered with an error status.
    """
    response = client.post(url.rstrip("/") + "/retrieve", json={"query": query, "topk": topk})
    response.raise_for_status()
    return response.json()["results"]


def information(results: list[dict[str, Any]]) -> str:
    """The user message carrying search results: ``<information>`` with one numbered passage a line."""
    lines = [f"Doc {i} ({r['title']}): {r['text']}" for i, r in enumerate(results, 1)]
    return "<information>\n" + ("\n".join(lines) or "No results.") + "\n</information>"
