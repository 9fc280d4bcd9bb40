"""Guardrails, the I/O (docs/guardrails.md): the registry of plugin guardrails, and running a
list of guardrails on a text — a rule here, a plugin's function, or a helper-model check
(priced, reserved like any call: ``shared.engine.spend``). The decisions are pure
(``shared.agent.guardrails``); the round (``shared.engine.round``) commits what they found.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.agent.guardrails import (
    Stage,
    Trip,
    check_messages,
    check_rule,
    model_verdict,
)
from shared.agent.pricing import call_usage, price_call
from shared.agent.spec import AgentSpec, GuardrailSpec
from shared.engine import spend
from shared.engine.guard_plugins import run_plugin
from shared.engine.runtime import Runtime
from shared.llm.abort import Abort
from shared.llm.base import ModelRequest
from shared.llm.profiles import make_model, resolve_profile
from shared.store.rows import Run

__all__ = [
    "GUARDRAIL_PURPOSE",
    "CHECK_MAX_TOKENS",
    "Checked",
    "run_guardrails",
]

log = logging.getLogger("treadle.guardrails")

GUARDRAIL_PURPOSE = "guardrail"  # the /usage rows of guardrail model calls
CHECK_MAX_TOKENS = 256  # a classify reply is a key (and maybe a reason)


@dataclass
class Checked:
    """What running guardrails found: the first that tripped (or None), the names of those
    that passed, and the usage rows of their model calls (priced)."""

    trip: Trip | None = None
    passed: list[GuardrailSpec] = field(default_factory=list)
    usage: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cost(self) -> float:
        return float(sum(u["cost"] for u in self.usage))

    @property
    def input_tokens(self) -> int:
        return int(sum(u["input_tokens"] for u in self.usage))

    @property
    def output_tokens(self) -> int:
        return int(sum(u["output_tokens"] for u in self.usage))

    def merged(self, other: Checked) -> Checked:
        """Both checks' findings (this one's trip first)."""
        return Checked(
            self.trip or other.trip, self.passed + other.passed, self.usage + other.usage
        )


def run_guardrails(
    rt: Runtime,
    run: Run,
    spec: AgentSpec,
    guards: Sequence[GuardrailSpec],
    text: str,
    stage: Stage,
    round_no: int,
    out: Checked | None = None,
) -> Checked:
    """Run ``guards`` on ``text`` in order, up to the first that trips, into ``out``. A
    model check's failure (the provider down, the budget spent) raises (``out`` holds the
    calls made so far): a guardrail that cannot run does not pass. ``spend.OverBudget`` /
    ``EnvelopeFull`` as for any call."""
    out = out if out is not None else Checked()
    for g in guards:
        reason = _check(rt, run, spec, g, text, stage, round_no, out)
        if reason is not None:
            out.trip = Trip(g.name, reason[:1000], stage, g.kind)
            return out
        out.passed.append(g)
    return out


def _check(
    rt: Runtime,
    run: Run,
    spec: AgentSpec,
    g: GuardrailSpec,
    text: str,
    stage: Stage,
    round_no: int,
    out: Checked,
) -> str | None:
    if g.rule is not None:
        return check_rule(g.rule, text)
    if g.plugin is not None:
        return run_plugin(g.plugin, text, stage)
    return _model_check(rt, run, spec, g, text, round_no, out)


def _model_check(
    rt: Runtime, run: Run, spec: AgentSpec, g: GuardrailSpec, text: str, round_no: int, out: Checked
) -> str | None:
    assert g.model is not None
    profile = resolve_profile(g.model.model, rt.profiles)
    model = make_model(profile, run.tenant, rt.settings.allow_hosts)
    request = ModelRequest(
        messages=tuple(check_messages(g.model, text)),
        max_tokens=min(profile.max_tokens, CHECK_MAX_TOKENS),
    )
    started = time.time()
    with spend.held_for(rt, run, spec, profile, request) as held:
        reply = model.complete(held.request, None, abort=Abort(run.deadline_at))
        u = reply.usage
        cost = price_call(profile.pricing, u, profile.own_key) if u is not None else 0.0
        held.cost = cost
    latency_ms = int((time.time() - started) * 1000)
    out.usage.append(
        {
            "round": round_no,
            "purpose": GUARDRAIL_PURPOSE,
            "profile": profile.name,
            **call_usage(reply, profile, cost, latency_ms),
        }
    )
    return model_verdict(g.model, reply.text)
