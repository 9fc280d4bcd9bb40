"""Stored run state read back across versions (tests/fixtures/state/README.md), as the
OpenAI Agents SDK keeps its run-state fixtures: what is stored today round-trips, what older
code stored still reads, what newer code stored is refused rather than misread."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.agent.decisions import AwaitAnswer, AwaitApproval, Continue, Finish
from shared.agent.state import SCHEMA_VERSION, LoopState
from shared.engine.change import decode_after, encode_after

HERE = Path(__file__).resolve().parents[1] / "fixtures" / "state"


def _load(name: str) -> Any:
    return json.loads((HERE / name).read_text(encoding="utf-8"))


def test_the_current_loop_state_round_trips() -> None:
    stored = _load("loop_v1.json")
    state = LoopState.from_dict(stored)
    assert state.round == 7 and state.profile_index == 1 and state.failover_at == 1796300000.5
    assert json.loads(json.dumps(state.to_dict())) == stored
    assert stored["v"] == SCHEMA_VERSION


def test_a_v1_loop_state_from_before_a_field_reads_with_its_default() -> None:
    stored = _load("loop_v1.json")
    del stored["compress_failed_at"]  # added to v1 with a default (no new version)
    assert LoopState.from_dict(stored).compress_failed_at == 0


def test_an_unversioned_loop_state_still_reads_with_defaults() -> None:
    state = LoopState.from_dict(_load("loop_unversioned.json"))
    assert (state.round, state.tool_calls, state.cost) == (3, 2, 0.004)
    assert state.profile_index == 0 and state.failover_at is None and state.output_repairs == 0


def test_a_newer_loop_state_is_refused() -> None:
    with pytest.raises(ValueError, match="newer than this code"):
        LoopState.from_dict(_load("loop_future.json"))


def test_every_after_join_type_round_trips() -> None:
    stored = _load("after_join.json")
    kinds = {
        "continue": Continue,
        "ask": AwaitAnswer,
        "approval": AwaitApproval,
        "finish": Finish,
    }
    for name, body in stored.items():
        after = decode_after(body)
        if name in kinds:
            assert isinstance(after, kinds[name]), name
        assert encode_after(after) == body, name


def test_an_unknown_after_join_type_is_refused_not_taken_for_a_failure() -> None:
    with pytest.raises(ValueError, match="not known to this code"):
        decode_after(_load("after_join_future.json"))
