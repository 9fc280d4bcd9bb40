"""The chat node and the helper kinds as a round builds and decides them (SPEC C-1..C-4,
H-1..H-3): the request builder and ``step``, pure."""

from __future__ import annotations

import json
from typing import Any

from shared.agent.chat import SYSTEM_PROMPT_SEPARATOR, stream_enabled
from shared.agent.decisions import Finish
from shared.agent.messages import Message, Reply
from shared.agent.request import last_user_text, plan_request, split_question
from shared.agent.spec import AgentSpec, ModelProfile
from shared.agent.state import LoopState
from shared.agent.step import step
from shared.agent.thread import thread_history

CATEGORIES = [
    {"key": "weather", "description": "questions about weather"},
    {"key": "other", "description": "anything else"},
]
FIELDS = [{"name": "city", "type": "string", "required": True}, {"name": "days", "type": "integer"}]


def _spec(kind: str = "chat", **kw: Any) -> AgentSpec:
    return AgentSpec.model_validate({"kind": kind, "model": "demo", **kw})


def _plan(
    spec: AgentSpec, messages: list[Message], profile: ModelProfile | None = None, **inputs: Any
) -> Any:
    return plan_request(
        spec,
        profile=profile or ModelProfile(name="p"),
        state=LoopState(),
        messages=messages,
        catalog={},
        plan=None,
        inputs=inputs,
    )


def _turns(n: int, size: int = 200) -> list[Message]:
    runs = [
        [
            Message(role="user", content=f"q{i} " + "x" * size),
            Message(role="assistant", content=f"a{i} " + "y" * size),
        ]
        for i in range(1, n + 1)
    ]
    return thread_history(runs)


# --- C-1 / C-2: the chat request ------------------------------------------------------


def test_chat_request_joins_system_parts_and_quotes() -> None:
    # SPEC C-1, C-2: profile prompt, agent prompt, quote prompt; quotes in the system prompt
    spec = _spec(system_prompt="Be brief.")
    profile = ModelProfile(name="p", default_system_prompt="House rules.")
    req = _plan(
        spec,
        [Message(role="user", content="Q?")],
        profile,
        quotes=[{"q": "Paris is the capital.", "a": "", "source": "wiki"}],
    )
    system = req.messages[0].text
    assert system.startswith("House rules." + SYSTEM_PROMPT_SEPARATOR + "Be brief.")
    assert "Paris is the capital." in system
    assert req.messages[-1].text == "Q?" and req.tools == () and req.tool_choice is None


def test_chat_user_role_quotes_go_into_the_question() -> None:
    # SPEC C-2: quote_role user → quotes and question in the user message
    req = _plan(
        _spec(quote_role="user"),
        [Message(role="user", content="Q?")],
        quotes=[{"q": "fact one"}, {"q": "fact two"}],
    )
    assert "fact one\n------\nfact two" in req.messages[-1].text
    assert 'Question: """Q?"""' in req.messages[-1].text


# --- C-3: thread history trimmed at request time ----------------------------------------


def test_chat_thread_history_comes_before_the_question() -> None:
    history = _turns(2, size=5)
    req = _plan(_spec(system_prompt="S"), [*history, Message(role="user", content="now")])
    assert [m.text.split()[0] for m in req.messages] == ["S", "q1", "a1", "q2", "a2", "now"]


def test_chat_small_window_drops_the_oldest_turns_first() -> None:
    # SPEC C-3: groups kept newest first while they fit; system and the question always kept
    profile = ModelProfile(name="p", context_window=500, max_tokens=100)
    req = _plan(
        _spec(system_prompt="S"), [*_turns(5), Message(role="user", content="now")], profile
    )
    firsts = [m.text.split()[0] for m in req.messages]
    assert firsts[0] == "S" and firsts[-1] == "now"
    kept = [f for f in firsts if f.startswith("q")]
    assert kept and kept == [f"q{i}" for i in range(6 - len(kept), 6)]  # a suffix: newest turns
    assert "q1" not in firsts


def test_helper_history_is_trimmed_too() -> None:
    # SPEC C-3 applies to helper requests as well
    profile = ModelProfile(name="p", context_window=500, max_tokens=100)
    req = _plan(
        _spec("classify", categories=CATEGORIES),
        [*_turns(5), Message(role="user", content="rain?")],
        profile,
    )
    firsts = [m.text.split()[0] for m in req.messages if m.role != "system"]
    assert firsts[-1] == "rain?" and "q1" not in firsts


# --- C-4: streaming flags ------------------------------------------------------------


def test_streaming_flags_default_on() -> None:
    # SPEC C-4
    spec = _spec()
    assert stream_enabled(spec, "reasoning") and stream_enabled(spec, "text")


def test_streaming_flags_gate_each_kind() -> None:
    # SPEC C-4: each behind its own flag; tool deltas are not gated by them
    quiet = _spec(stream_reasoning=False)
    assert not stream_enabled(quiet, "reasoning") and stream_enabled(quiet, "text")
    mute = _spec(stream_answer=False)
    assert stream_enabled(mute, "reasoning") and not stream_enabled(mute, "text")
    assert stream_enabled(_spec(stream_answer=False, stream_reasoning=False), "tool")


def test_chat_answer_is_the_run_text() -> None:
    # SPEC C-4: the answer is the run's text
    result = step(_spec(), LoopState(), Reply(text="Paris.", reasoning="easy"), {})
    assert result.decision == Finish(stop_reason="completed", text="Paris.")


# --- H-1 classify ------------------------------------------------------------------------


def test_classify_previous_result_on_the_thread_is_context() -> None:
    # SPEC H-1: the previous result on the same thread is given as context
    spec = _spec("classify", categories=CATEGORIES)
    req = _plan(
        spec,
        [Message(role="user", content="and tomorrow?")],
        last_result={"text": "weather", "category": "weather"},
    )
    assert "classified as: weather" in req.messages[0].text
    fresh = _plan(spec, [Message(role="user", content="and tomorrow?")])
    assert "Previous result" not in fresh.messages[0].text


def test_classify_step_result() -> None:
    # SPEC H-1: no match → the last category
    spec = _spec("classify", categories=CATEGORIES)
    d = step(spec, LoopState(), Reply(text="weather"), {}, question="rain?").decision
    assert isinstance(d, Finish) and d.result == {"category": "weather"}
    d = step(spec, LoopState(), Reply(text="no idea"), {}, question="hm").decision
    assert isinstance(d, Finish) and d.result == {"category": "other"}


# --- H-2 extract -------------------------------------------------------------------------


def test_extract_response_format_only_where_the_profile_supports_it() -> None:
    # SPEC H-2: response_format json_schema where supported, else the prompt alone
    spec = _spec("extract", fields=FIELDS)
    msgs = [Message(role="user", content="3 days in Oslo")]
    with_schema = _plan(spec, msgs, ModelProfile(name="p", json_schema=True))
    assert with_schema.response_format is not None
    assert with_schema.response_format["type"] == "json_schema"
    assert with_schema.response_format["json_schema"]["schema"]["required"] == ["city"]
    assert _plan(spec, msgs).response_format is None
    assert "## JSON schema" in _plan(spec, msgs).messages[0].text


def test_extract_previous_fields_are_context() -> None:
    # SPEC H-1 applied to extract: the previous result on the thread
    req = _plan(
        _spec("extract", fields=FIELDS),
        [Message(role="user", content="make it 4")],
        last_result={"fields": {"city": "Oslo", "days": 3}, "success": True},
    )
    assert '"city": "Oslo"' in req.messages[0].text


def test_extract_step_result_never_raises() -> None:
    # SPEC H-2
    spec = _spec("extract", fields=FIELDS)
    d = step(spec, LoopState(), Reply(text='Sure: {city: "Oslo", days: "3"}'), {}).decision
    assert isinstance(d, Finish) and d.result == {
        "fields": {"city": "Oslo", "days": 3},
        "success": True,
    }
    d = step(spec, LoopState(), Reply(text="garbage"), {}).decision
    assert isinstance(d, Finish) and d.result == {"fields": {}, "success": False}


# --- H-3 expand_query --------------------------------------------------------------------


def test_expand_query_needs_the_question() -> None:
    # SPEC H-3: output = original + kept; the round passes the question to step
    spec = _spec("expand_query", keep=2)
    messages = [Message(role="user", content="reset password")]
    _, question = split_question(messages)
    assert last_user_text(messages) == question
    turns = [*messages, Message(role="assistant", content="ok"), Message(role="tool", content="x")]
    assert last_user_text(turns) == "reset password" and last_user_text(turns[1:]) == ""
    reply = Reply(text=json.dumps(["forgot password", "reset password", "account recovery"]))
    d = step(spec, LoopState(), reply, {}, question=question).decision
    assert isinstance(d, Finish)
    assert d.result["queries"][0] == "reset password"
    assert len(d.result["queries"]) == 3 and len(set(d.result["queries"])) == 3


def test_expand_query_history_goes_into_the_prompt() -> None:
    # SPEC H-3: rewrite the question with history
    req = _plan(_spec("expand_query"), [*_turns(1, size=3), Message(role="user", content="free?")])
    assert "user: q1" in req.messages[-1].text and "Question: free?" in req.messages[-1].text
