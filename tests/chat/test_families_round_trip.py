"""Round trips for the 2026 model families (docs/model-families.md#round-trips).

1. Template level: the ids a template renders for an assistant turn (what a model trained on it
   samples) decode to a message that, echoed back, renders to exactly those ids again.
2. Session level: through the real turn handler (scripted engine, real forest), the agent's echo
   of the committed message plus the tool results continues the same lineage: one leaf, no new
   branch, and the next generation input is the sampled ids verbatim followed by the tool
   results, equal to a full render of the echoed conversation. The tool-call parser is ``auto``
   there, resolved from each template.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from tests.chat.families_testkit import FAMILIES, TOOLS, conversation, rendered_turn

from relaxtrio import InvalidRequestError
from relaxtrio.chat.parsers import decode_assistant
from relaxtrio.config import GenerationConfig
from relaxtrio.forest import Conversation
from relaxtrio.nursery.group import Group
from relaxtrio.nursery.turns import TurnRequest
from relaxtrio.rollout.turns import EngineTurnHandler
from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

# Call ids as each family's model writes them (Kimi-K2 and Mistral render them back; the others
# never render ids, so any id round-trips).
CALL_IDS = {
    "kimi_k2": ("functions.get_weather:0", "functions.get_weather:1", "functions.run_code:2", ""),
    "mistral": ("a1b2c3d4e", "f5a6b7c8d", "e9f0a1b2c", ""),
}
# DeepSeek-V3.1 never renders reasoning in history and Mistral Small 3.2 is no reasoning model, so
# their turns are compared without it.
RENDERS_REASONING = {"deepseek_v3_1": False, "mistral": False}
# Assistant turns whose re-render is a documented exception (docs/model-families.md): the final
# answer of Kimi-K2-Thinking and gpt-oss (history then drops the earlier turns' reasoning).
EXPECTED_TURNS = {
    "deepseek_v3_1": [2, 5, 7], "glm4_6": [2, 5, 7], "kimi_k2": [2, 5], "gpt_oss": [2, 4], "mistral": [2, 5, 7],
}


def family_conversation(family: str) -> list[dict[str, Any]]:
    ids = CALL_IDS.get(family, ("call_1", "call_2", "call_3", ""))
    return conversation(ids, reasoning=RENDERS_REASONING.get(family, True), parallel=family != "gpt_oss")


def without_ids(message: dict[str, Any]) -> dict[str, Any]:
    copy = dict(message)
    if "tool_calls" in copy:
        copy["tool_calls"] = [{**c, "id": None} for c in copy["tool_calls"]]
    return copy


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sampled_turn_decodes_to_a_message_that_renders_the_same_ids(family: str) -> None:
    fam = FAMILIES[family]
    compiler = fam.compiler()
    messages = family_conversation(family)
    checked = []
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        turn = rendered_turn(compiler, messages, index)
        if turn is None:
            continue
        prompt_ids, sampled = turn
        decoded = decode_assistant(
            sampled, "stop", compiler=compiler, parent_state_hash="ab" * 32,
            stop_token_ids=compiler.stop_token_ids, reasoning_parser=fam.reasoning_parser,
            tool_call_parser=fam.tool_call_parser, tools=TOOLS,
            prompt_opened_think=compiler.prompt_opens_think(prompt_ids),
        )
        echo = dict(decoded.message)
        if family in CALL_IDS:
            assert echo == message, index  # ids included: the template renders them
        else:
            assert without_ids(echo) == without_ids(message), index
        assert decoded.finish_reason == ("tool_calls" if message.get("tool_calls") else "stop")
        replayed = rendered_turn(compiler, [*messages[:index], echo], index)
        assert replayed == (prompt_ids, sampled), index
        checked.append(index)
    assert checked == EXPECTED_TURNS[family]


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_agent_echo_continues_the_same_lineage(family: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    fam = FAMILIES[family]
    compiler = fam.compiler()
    messages = family_conversation(family)
    prompt_ids, sampled = rendered_turn(compiler, messages, 2) or pytest.fail("first turn must render")
    if sampled[-1] not in compiler.stop_token_ids:
        # GLM writes no end-of-turn token after a call: the model stops by sampling the next role.
        sampled = (*sampled, compiler.tokenizer.convert_tokens_to_ids("<|observation|>"))
    engine = ScriptedEngine(tokenizer=compiler.tokenizer, eos_id=sampled[-1],
                            replies=[Reply(ids=sampled), Reply(text="Done.")])
    config = GenerationConfig(tool_call_parser="auto", reasoning_parser=fam.reasoning_parser)
    handler = EngineTurnHandler(client=engine, compiler=compiler, config=config)
    group = Group.create("g", num_sessions=1, input_payload={}, timeout_s=10)
    [session] = group.sessions
    group.lease()
    group.note_request(session)
    turn = session.turn_context()
    with trio.fail_after(10):
        first = await handler.complete(turn, TurnRequest(conversation=Conversation.from_wire(messages[:2], TOOLS)))
    assert first.finish_reason == "tool_calls"
    calls = first.message["tool_calls"]
    if family == "mistral":
        assert [c["id"] for c in calls] == list(CALL_IDS["mistral"][:2])
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
    echo = [*messages[:2], dict(first.message), *results]
    with trio.fail_after(10):
        await handler.complete(turn, TurnRequest(conversation=Conversation.from_wire(echo, TOOLS)))
    assert "matches no committed response" not in caplog.text
    assert len(session.forest.leaves()) == 1
    second_input = engine.calls[1][0]
    assert second_input[: len(prompt_ids) + len(sampled)] == (*prompt_ids, *sampled)
    # Within the tool loop these templates are prefix-stable: the lineage is the full render.
    assert second_input == compiler.render([*echo[:2], dict(first.message), *results], TOOLS).token_ids



def test_a_stop_id_that_opens_the_next_message_is_not_repeated_by_the_delta() -> None:
    """GLM ends a final answer by sampling ``<|user|>``: the lineage holds it once, as a full render
    of the next user message does, and a delta that did not come after it keeps its header.
    (Without reasoning: the template drops it once a user message follows, which is no delta matter.)"""
    compiler = FAMILIES["glm4_6"].compiler()
    messages = conversation(("call_1", "call_2", "call_3", ""), reasoning=False)
    prompt_ids, sampled = rendered_turn(compiler, messages, 7) or pytest.fail("the final answer must render")
    user_id = compiler.tokenizer.convert_tokens_to_ids("<|user|>")
    assert sampled[-1] != user_id and user_id in compiler.stop_token_ids
    sampled = (*sampled, user_id)
    kwargs = {"previous": messages[7], "sampled_stop_id": user_id}
    delta = compiler.render_delta(messages[8:], TOOLS, **kwargs).token_ids
    assert (*prompt_ids, *sampled, *delta) == compiler.render(messages, TOOLS).token_ids
    assert compiler.render_delta(messages[8:], TOOLS).token_ids == (user_id, *delta)


def test_a_tool_result_delta_is_rendered_after_the_call_it_answers() -> None:
    """gpt-oss names a tool result after the preceding call, so the dummy prefix alone is refused;
    with the call as context the delta is the full render's tail."""
    compiler = FAMILIES["gpt_oss"].compiler()
    messages = family_conversation("gpt_oss")
    with pytest.raises(InvalidRequestError, match="no previous assistant message"):
        compiler.render_delta(messages[3:4], TOOLS)
    with pytest.raises(InvalidRequestError, match="no previous assistant message"):
        compiler.render_delta(messages[3:4], TOOLS, previous={"role": "assistant", "content": "No call."})
    delta = compiler.render_delta(messages[3:4], TOOLS, previous=messages[2]).token_ids
    prompt_ids, sampled = rendered_turn(compiler, messages, 2) or pytest.fail("the first turn must render")
    assert (*prompt_ids, *sampled, *delta) == compiler.render(messages[:4], TOOLS).token_ids
