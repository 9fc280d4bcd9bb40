"""What the offline ``demo`` model says: a deterministic reply from the request alone.

It shows every feature without a real model. In a tool loop it works in stages read off the
run's own transcript: plan (``set_plan``) and ask (``ask_user``) when those tools are offered;
then the work: ``current_time`` for a question about time, ``calculator`` for arithmetic,
``save_note`` (a write a guarded agent must approve) when offered, with the plan updated
alongside; then it closes the plan and answers from the results. The helper kinds get real
answers: classify picks the category sharing the most words with the input, extract fills the
fields it can find (numbers, emails, dates, names...), expand_query writes query variants.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from shared.agent.messages import Message, Reply, ToolCall
from shared.llm.base import ModelRequest

__all__ = ["demo_reply"]

_TIME_WORDS = ("time", "clock", "date", "几点", "时间")
_EXPR = re.compile(r"[\d.]+(?:\s*[-+*/^]\s*\(?[\d.]+\)?)+")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset(
    re.findall(
        r"\w+",
        "a an the and or of to for in on at by with from about is are was were be been do does "
        "did i me my we our you your it its this that these those please can could would should "
        "will how what why when where which who whom whose there their them they he she his her",
    )
)
_PLAN_DONE = "call_demo_plan_done"


def demo_reply(request: ModelRequest) -> Reply:
    """The demo model's whole reply to ``request``."""
    system = next((m.text for m in request.messages if m.role == "system"), "")
    if system.startswith("You are a classifier."):
        return _answer(_classify(system, _last_user(request.messages)))
    if system.startswith("You extract structured data from text."):
        return _answer(_extract(system, _last_user(request.messages)))
    if system.startswith("You rewrite a user's question into several search queries"):
        return _answer(_expand(_last_user(request.messages)))
    return _Loop(request).reply()


def _answer(text: str, reasoning: str = "") -> Reply:
    return Reply(text=text, reasoning=reasoning, finish_reason="stop")


def _last_user(messages: Sequence[Message]) -> str:
    return next((m.text for m in reversed(messages) if m.role == "user" and not m.kind), "")


def _words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.casefold()) if w not in _STOP]


# --------------------------------------------------------------------------- the tool loop


class _Loop:
    """The stage of the run, read off its own messages (not a thread's history)."""

    def __init__(self, request: ModelRequest) -> None:
        own = [m for m in request.messages if not m.kind]
        self.request = request
        self.question = _last_user(own)
        self.tools = {t.name for t in request.tools}
        self.calls = [c for m in own if m.role == "assistant" for c in m.tool_calls]
        self.called = {c.name for c in self.calls}
        by_id = {m.tool_call_id: m for m in own if m.role == "tool"}
        self.results = [(c, by_id[c.id]) for c in self.calls if c.id in by_id]

    def reply(self) -> Reply:
        if self.request.tool_choice != "none":
            for stage in (self._plan_and_ask, self._ask, self._work, self._close_plan):
                reply = stage()
                if reply is not None:
                    return reply
        return _answer(self._final_text(), "I have what I need; composing the answer.")

    # -- stages, in order; each returns None when it has nothing to do

    def _plan_and_ask(self) -> Reply | None:
        if "set_plan" not in self.tools or "set_plan" in self.called or self._direct():
            return None
        name, steps = _plan_for(self.question)
        calls = [_call("call_demo_plan", "set_plan", {"name": name, "steps": steps})]
        if "ask_user" in self.tools and "ask_user" not in self.called:
            calls.append(_ask_call(self.question))
        return _tools(calls, "A multi-step task: I will plan it first, and ask what I need.")

    def _ask(self) -> Reply | None:
        if "ask_user" not in self.tools or "ask_user" in self.called or self._direct():
            return None
        return _tools([_ask_call(self.question)], "One thing is unclear; asking before acting.")

    def _work(self) -> Reply | None:
        work = self._work_calls()
        if not work or any(c.name in self.called for c in work):
            return None
        calls = list(work)
        if self._plan_steps():
            updates = [{"id": "s1", "status": "done", "note": self._answer_given() or None}]
            if len(self._plan_steps()) > 1:
                updates.append({"id": "s2", "status": "in_progress"})
            calls.insert(0, _call("call_demo_plan_progress", "update_plan", {"updates": updates}))
        return _tools(calls, "The question needs a tool; calling it first.")

    def _close_plan(self) -> Reply | None:
        steps = self._plan_steps()
        if not steps or any(c.id == _PLAN_DONE for c in self.calls):
            return None
        answer = self._answer_given()
        updates: list[dict[str, Any]] = [
            {"id": f"s{i}", "status": "done"} for i in range(1, len(steps) + 1)
        ]
        if answer and "update_plan" not in self.called:
            updates[0]["note"] = answer
        call = _call(_PLAN_DONE, "update_plan", {"updates": updates})
        return _tools([call], "Every step is covered; closing the plan.")

    # -- what the transcript holds

    def _direct(self) -> bool:
        """A question one lookup answers (the time, a sum): no plan, no question back
        (SPEC P-6: plan only for multi-step tasks; A-1: ask only for hard blockers)."""
        return any(c.name in ("current_time", "calculator") for c in self._work_calls())

    def _work_calls(self) -> list[ToolCall]:
        calls: list[ToolCall] = []
        low = self.question.casefold()
        if "current_time" in self.tools and any(w in low for w in _TIME_WORDS):
            calls.append(ToolCall(id="call_demo_time", name="current_time", arguments="{}"))
        expr = _EXPR.search(self.question)
        if "calculator" in self.tools and expr:
            args = json.dumps({"expression": expr.group(0).strip()})
            calls.append(ToolCall(id="call_demo_calc", name="calculator", arguments=args))
        if "save_note" in self.tools:
            answer = self._answer_given()
            text = (self.question.strip() + (f"\nChosen: {answer}" if answer else ""))[
                :2000
            ] or "Note"
            calls.append(
                _call("call_demo_save", "save_note", {"title": _title(self.question), "text": text})
            )
        return calls

    def _plan_steps(self) -> list[str]:
        for call in self.calls:
            if call.name == "set_plan":
                steps = _arguments(call).get("steps")
                return [str(s) for s in steps] if isinstance(steps, list) else []
        return []

    def _answer_given(self) -> str:
        """The user's answer to the ask (``Answer: <label - value>`` lines of its result)."""
        for call, result in self.results:
            if call.name == "ask_user":
                found = re.findall(r"^Answer: (.+)$", result.text, re.MULTILINE)
                return "; ".join(a.split(" - ")[0] for a in found)
        return ""

    def _final_text(self) -> str:
        parts: list[str] = []
        steps = self._plan_steps()
        if steps:
            name = _arguments(next(c for c in self.calls if c.name == "set_plan")).get("name")
            listed = "; ".join(f"{i}. {s}" for i, s in enumerate(steps, 1))
            parts.append(f'Plan "{name}" is done: {listed}.')
        answer = self._answer_given()
        if answer:
            parts.append(f"You chose: {answer}.")
        internal = {"set_plan", "update_plan", "ask_user"}
        facts = [f"{c.name}: {r.text}" for c, r in self.results if c.name not in internal]
        if facts:
            parts.append("Here is what I found. " + "; ".join(facts[-3:]))
        if not parts:
            return (
                f"Hello! You asked: {self.question.strip()[:200]}. This is treadle's offline "
                "demo model answering."
            )
        return " ".join(parts)


def _tools(calls: Sequence[ToolCall], reasoning: str) -> Reply:
    return Reply(reasoning=reasoning, tool_calls=tuple(calls), finish_reason="tool_calls")


def _call(call_id: str, tool: str, arguments: Mapping[str, Any]) -> ToolCall:
    return ToolCall(id=call_id, name=tool, arguments=json.dumps(arguments, ensure_ascii=False))


def _arguments(call: ToolCall) -> dict[str, Any]:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _title(question: str) -> str:
    words = question.strip().split()
    return (" ".join(words[:8]) or "Note")[:200]


_TRIP = ("trip", "travel", "vacation", "holiday", "journey", "旅行")
_NOTE = ("note", "remember", "write down", "save")


_ASKS = {  # a kind of question: why ask, what, and the options (label, value)
    "trip": (
        "The request does not say what kind of trip you want.",
        "What kind of trip do you have in mind?",
        [("City break", "city"), ("Beach holiday", "beach"), ("Hiking in the mountains", "hiking")],
    ),
    "note": (
        "I need to know what the note should hold.",
        "Which note should I save?",
        [
            ("Meeting summary", "meeting-summary"),
            ("Shopping list", "shopping-list"),
            ("Reminder for tomorrow", "reminder"),
        ],
    ),
    "other": (
        "The request leaves open how much detail you want.",
        "How detailed should the answer be?",
        [("Brief", "brief"), ("Step by step", "detailed")],
    ),
}


def _kind(question: str) -> str:
    """Which canned plan and question fit: ``trip``, ``note`` or ``other``."""
    low = question.casefold()
    if any(w in low for w in _TRIP):
        return "trip"
    return "note" if any(w in low for w in _NOTE) else "other"


def _plan_for(question: str) -> tuple[str, list[str]]:
    kind = _kind(question)
    if kind == "trip":
        return "Trip", [
            "Choose the kind of trip",
            "Pick the destination and dates",
            "Book travel and a place to stay",
            "Write the day-by-day plan",
        ]
    if kind == "note":
        return "Save a note", ["Ask which note to save", "Save the note", "Confirm"]
    topic = _title(question)
    return topic, ["Clarify what you need", f"Work on it: {topic}", "Summarise the result"]


def _ask_call(question: str) -> ToolCall:
    reason, text, options = _ASKS[_kind(question)]
    ask = {"question": text, "options": [{"label": lb, "value": v} for lb, v in options]}
    return _call("call_demo_ask", "ask_user", {"reason": reason, "questions": [ask]})


# --------------------------------------------------------------------------- helper kinds


def _section(system: str, title: str) -> str:
    """The text of ``## <title>`` in a helper's system prompt, up to the next section."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=\n\n## |\Z)", system, re.S | re.M)
    return match.group(1) if match else ""


def _classify(system: str, question: str) -> str:
    """The category sharing the most words with the input (its key and description); the
    last one when none shares any (the prompt's rule)."""
    try:
        categories = json.loads(_section(system, "Categories"))
    except ValueError:
        categories = []
    if not categories:
        return ""
    asked = set(_words(question))
    best, best_score, matched = categories[-1], 0, []
    for category in categories:
        words = _words(f"{category.get('key', '')} {category.get('description', '')}")
        stems = {_stem(w) for w in words}
        common = sorted(w for w in asked if _stem(w) in stems)
        if len(common) > best_score:
            best, best_score, matched = category, len(common), common
    reason = f"shares {', '.join(matched)}" if matched else "no category matched; the last one"
    return json.dumps({"category": best.get("key"), "reason": reason}, ensure_ascii=False)


def _stem(word: str) -> str:
    """The word without a plural or -ing/-ed ending, so 'refunds' meets 'refund'."""
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_PHONE = re.compile(r"\+?\d[\d\s().-]{6,}\d")
_URL = re.compile(r"https?://\S+")
_MONTHS = (
    "january|february|march|april|may|june|july|august|september|october|november|december|"
    "jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec"
)
_DATE = re.compile(
    rf"\b(\d{{4}}-\d{{2}}-\d{{2}}|\d{{1,2}}/\d{{1,2}}/\d{{2,4}}|"
    rf"\d{{1,2}} (?:{_MONTHS})[a-z]*(?: \d{{4}})?|(?:{_MONTHS})[a-z]* \d{{1,2}}(?:, \d{{4}})?|"
    rf"today|tomorrow|yesterday|(?:next |this )?(?:monday|tuesday|wednesday|thursday|friday|"
    rf"saturday|sunday))\b",
    re.I,
)
_NAME_AFTER = ("my name is", "name:", "i am", "i'm", "this is")  # the surest first
_NAME = r"([A-Z][\w'-]+(?:\s+[A-Z][\w'-]+)*)"  # capitalised words: case matters here
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")


def _extract(system: str, text: str) -> str:
    """A JSON object with the fields found in the text (none invented)."""
    try:
        schema = json.loads(_section(system, "JSON schema"))
    except ValueError:
        return "{}"
    body = text.split("\n\n", 1)[1] if text.startswith("Extract the fields") else text
    found: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        value = _field_value(str(name), prop if isinstance(prop, Mapping) else {}, body)
        if value is not None:
            found[name] = value
    return json.dumps(found, ensure_ascii=False)


def _field_value(name: str, prop: Mapping[str, Any], text: str) -> Any:
    hint = f"{name} {prop.get('description', '')}".casefold()
    kind = prop.get("type")
    if isinstance(prop.get("enum"), list):
        low = text.casefold()
        return next((v for v in prop["enum"] if str(v).casefold() in low), None)
    if kind == "boolean":
        return None  # a yes/no the text rarely states plainly: left out, never invented
    patterns: list[tuple[tuple[str, ...], re.Pattern[str]]] = [
        (("email", "mail"), _EMAIL),
        (("phone", "mobile", "tel"), _PHONE),
        (("url", "link", "website"), _URL),
        (("date", "day", "when", "deadline"), _DATE),
    ]
    for words, pattern in patterns:
        if any(w in hint for w in words):
            match = pattern.search(text)
            return match.group(0).strip() if match else None
    if "name" in hint:
        return _name(text)
    if kind in ("number", "integer"):
        return _number_near(name, text, kind)
    labelled = re.search(rf"\b{re.escape(name)}\s*(?:is|:|=)\s*([^,.;\n]+)", text, re.I)
    return labelled.group(1).strip() if labelled else None


def _name(text: str) -> str | None:
    """The capitalised words after "my name is" (or "I am", "I'm", "this is")."""
    for lead in _NAME_AFTER:
        match = re.search(rf"(?i:\b{re.escape(lead)})\s+{_NAME}", text)
        if match:
            return match.group(1).strip()
    return None


def _number_near(name: str, text: str, kind: str) -> int | float | None:
    """The number after the field's name, else the first number in the text."""
    near = re.search(rf"\b{re.escape(name)}\D{{0,20}}?({_NUMBER.pattern})", text, re.I)
    match = near.group(1) if near else (m.group(0) if (m := _NUMBER.search(text)) else None)
    if match is None:
        return None
    number = float(match.replace(",", "."))
    return int(number) if kind == "integer" or number.is_integer() else number


_GREETINGS = frozenset({"hi", "hello", "hey", "thanks", "thank", "bye", "你好", "谢谢"})


def _expand(user_text: str) -> str:
    """A JSON array of search queries for the question (``Question: ...`` in the prompt)."""
    match = re.search(r"^Question: (.*)$", user_text, re.M)
    question = (match.group(1) if match else user_text).strip()
    words = _words(question)
    if not words or set(words) <= _GREETINGS:
        return "[]"
    keywords = " ".join(words)
    variants = [
        keywords,
        f"how to {keywords}",
        f"{keywords} step by step",
        f"{keywords} troubleshooting",
        f"{keywords} explained",
        f"{keywords} examples",
    ]
    if len(words) > 2:
        variants.append(" ".join(words[:2]))
        variants.append(" ".join(words[-2:]))
    return json.dumps(variants, ensure_ascii=False)
