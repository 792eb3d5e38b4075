"""Turn handling details: client logprobs cover content only; replay mismatches are logged.

See docs/client-quirks.md#logprobs-of-the-content-only and
docs/client-quirks.md#dropped-reasoning-on-replay.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.sessions import leased_session

from relaxtrio.chat.compiler import ChatCompiler
from relaxtrio.models import load_tokenizer
from relaxtrio.rollout.client_logprobs import content_logprobs


def _ids(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def test_content_span_excludes_reasoning_markup_and_stop(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    compiler = ChatCompiler(tok)
    think, answer, call = _ids(tok, "<think>hmm</think>"), _ids(tok, "The answer is 4."), _ids(
        tok, '\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>')
    ids = think + answer + call + [tok.eos_token_id]
    logprobs = [-float(i) for i in range(len(ids))]
    got = content_logprobs(compiler, ids, logprobs, "The answer is 4.")
    assert "".join(e.token for e in got) == "The answer is 4."
    assert [e.logprob for e in got] == logprobs[len(think): len(think) + len(answer)]


def test_plain_content_drops_only_the_stop_token(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    compiler = ChatCompiler(tok)
    ids = _ids(tok, "hello world") + [tok.eos_token_id]
    got = content_logprobs(compiler, ids, [-1.0] * len(ids), "hello world")
    assert len(got) == len(ids) - 1
    assert content_logprobs(compiler, ids, [-1.0] * len(ids), "") == ()


async def test_unmatched_assistant_message_is_logged_as_a_new_branch(
    tiny_model_dir: Path, caplog
) -> None:
    import logging

    import trio

    from relaxtrio.config import GenerationConfig
    from relaxtrio.forest import Conversation
    from relaxtrio.nursery.turns import TurnRequest
    from relaxtrio.rollout.turns import EngineTurnHandler
    from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

    caplog.set_level(logging.WARNING)
    tok = load_tokenizer(tiny_model_dir)
    engine = ScriptedEngine(tokenizer=tok, eos_id=tok.eos_token_id,
                            replies=lambda ids: Reply(text="four"))
    handler = EngineTurnHandler(client=engine, compiler=ChatCompiler(tok), config=GenerationConfig())
    session = leased_session(budget_s=10)
    user = {"role": "user", "content": "2+2?"}
    turn = session.turn_context()
    first = await handler.complete(turn, TurnRequest(conversation=Conversation.from_wire([user])))
    assert "matches no committed response" not in caplog.text
    edited = [user, {"role": "assistant", "content": "4 (edited)"}, {"role": "user", "content": "sure?"}]
    with trio.fail_after(10):
        await handler.complete(turn, TurnRequest(conversation=Conversation.from_wire(edited)))
    assert "matches no committed response (matched 1 of 3 messages)" in caplog.text
    assert len(session.forest.leaves()) == 2 and first.message["content"] == "four"


async def test_a_tool_list_change_is_named_instead_of_assistant_replay(tiny_model_dir: Path, caplog) -> None:
    """Codex's compaction request replays the history exactly but sends no tools."""
    import logging

    import trio

    from relaxtrio.config import GenerationConfig
    from relaxtrio.forest import Conversation
    from relaxtrio.nursery.turns import TurnRequest
    from relaxtrio.rollout.turns import EngineTurnHandler
    from relaxtrio.testing.scripted_engine import Reply, ScriptedEngine

    caplog.set_level(logging.WARNING)
    tok = load_tokenizer(tiny_model_dir)
    engine = ScriptedEngine(tokenizer=tok, eos_id=tok.eos_token_id, replies=lambda ids: Reply(text="done"))
    handler = EngineTurnHandler(client=engine, compiler=ChatCompiler(tok), config=GenerationConfig())
    session = leased_session(budget_s=10)
    shell = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}
    user = {"role": "user", "content": "fix it"}
    turn = session.turn_context()
    with trio.fail_after(10):
        first = await handler.complete(turn, TurnRequest(conversation=Conversation.from_wire([user], [shell])))
        compact = [user, first.message, {"role": "user", "content": "Summarize the conversation."}]
        await handler.complete(turn, TurnRequest(conversation=Conversation.from_wire(compact)))
    assert "the tool list changed (0 tools now, 1 before; removed shell)" in caplog.text
    assert "its history matches 2 of its 3 messages" in caplog.text
    assert "Replay assistant messages exactly" not in caplog.text


async def test_only_an_unavailable_engine_is_fatal(tiny_model_dir: Path) -> None:
    """A 4xx refusal fails its turn; an unavailable engine is recorded as the run's fatal error."""
    import pytest

    from relaxtrio import EngineRejectedError, EngineUnavailableError
    from relaxtrio.config import GenerationConfig
    from relaxtrio.forest import Conversation
    from relaxtrio.nursery.turns import TurnRequest
    from relaxtrio.rollout.turns import EngineTurnHandler
    from relaxtrio.testing.scripted_engine import ScriptedEngine

    tok = load_tokenizer(tiny_model_dir)
    failures = [EngineRejectedError("engine http://e/generate answered HTTP 400: bad image",
                                    engine_url="http://e", status_code=400),
                EngineUnavailableError("engine http://e/generate answered HTTP 502: down",
                                       engine_url="http://e", status_code=502)]

    def replies(ids):
        raise failures.pop(0)

    engine = ScriptedEngine(tokenizer=tok, eos_id=tok.eos_token_id, replies=replies)
    handler = EngineTurnHandler(client=engine, compiler=ChatCompiler(tok), config=GenerationConfig())
    turn = leased_session(group_id="g", session_id="s", budget_s=10).turn_context()
    request = TurnRequest(conversation=Conversation.from_wire([{"role": "user", "content": "hi"}]))
    with pytest.raises(EngineRejectedError):
        await handler.complete(turn, request)
    assert handler.fatal_error is None
    with pytest.raises(EngineUnavailableError) as caught:
        await handler.complete(turn, request)
    assert handler.fatal_error is caught.value and handler.fatal_error.status_code == 502
