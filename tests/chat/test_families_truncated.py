"""A tool-call turn cut by the token limit, in every model family's format
(docs/client-quirks.md#a-tool-call-cut-by-the-token-limit): finish ``length``, no call, and the
generated text kept verbatim in the content (after the reasoning the family's parser splits off)."""

from __future__ import annotations

import pytest
from tests.chat.families_testkit import FAMILIES, TOOLS, rendered_turn
from tests.chat.test_families_round_trip import family_conversation

from relaxtrio.chat.parsers import decode_assistant

CUT_TOKENS = 4
"""Ids dropped from the end of the sampled call turn: the cut lands inside the last call."""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_cut_call_is_length_and_verbatim_text(family: str) -> None:
    fam = FAMILIES[family]
    compiler = fam.compiler()
    messages = family_conversation(family)
    prompt_ids, sampled = rendered_turn(compiler, messages, 2) or pytest.fail("the call turn must render")
    cut = sampled[:-CUT_TOKENS]
    decoded = decode_assistant(
        cut, "length", compiler=compiler, parent_state_hash="ab" * 32, stop_token_ids=compiler.stop_token_ids,
        reasoning_parser=fam.reasoning_parser, tool_call_parser=fam.tool_call_parser, tools=TOOLS,
        prompt_opened_think=compiler.prompt_opens_think(prompt_ids),
    )
    assert decoded.finish_reason == "length"
    assert "tool_calls" not in decoded.message
    content = decoded.message["content"]
    text = compiler.decode(cut)
    assert content and text.endswith(content), (text, content)  # the cut call is kept as generated
    assert content.endswith(compiler.decode(cut[-1:]).rstrip())
