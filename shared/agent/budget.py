"""Budgets checked before every model call (SPEC L-2, L-9)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.agent.spec import AgentSpec
from shared.agent.state import LoopState

__all__ = ["BudgetVerdict", "check_budgets"]


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """``stop_reason`` set = a budget is exhausted. ``final_call`` = make one last model call
    with ``tool_choice: none`` first (``final_answer_on_limit``)."""

    stop_reason: str | None = None
    final_call: bool = False


def _exhausted(
    spec: AgentSpec, state: LoopState, now: float, deadline_at: float | None
) -> str | None:
    if state.round >= spec.effective_max_rounds:
        return "max_rounds"
    budget = spec.budget
    if budget.max_cost is not None and state.cost >= budget.max_cost:
        return "budget_cost"
    if deadline_at is not None and now >= deadline_at:
        return "budget_deadline"
    if budget.max_tool_calls is not None and state.tool_calls >= budget.max_tool_calls:
        return "budget_tool_calls"
    return None


def check_budgets(
    spec: AgentSpec, state: LoopState, now: float, deadline_at: float | None
) -> BudgetVerdict:
    """Before a model call: may it go ahead? A round already finalizing always may."""
    if state.finalizing:
        return BudgetVerdict()
    reason = _exhausted(spec, state, now, deadline_at)
    if reason is None:
        return BudgetVerdict()
    # a deadline or cost overrun cannot afford another call; rounds and tool calls can
    final = spec.final_answer_on_limit and reason in ("max_rounds", "budget_tool_calls")
    return BudgetVerdict(stop_reason=reason, final_call=final)
