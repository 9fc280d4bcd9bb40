"""Per-tenant admission on SQLite and the stub broker: over its limit a tenant's new runs wait
in the database (no dispatch), and each run that ends admits the next, highest priority first;
another tenant is not held behind them; the reaper's pass admits after the limit is raised."""

from __future__ import annotations

from dataclasses import replace

from shared.engine import commands
from shared.engine.reaper import reap
from shared.engine.runtime import Runtime
from shared.engine.testing import StubBroker
from tests.engine.helpers import agent, run

SPEC = agent([{"text": "done"}])


def _submit(rt: Runtime, tenant: str, priority: int = 5) -> str:
    req = commands.RunInput(agent=SPEC, input="go", tenant=tenant, priority=priority)
    return str(commands.submit_run(rt, req)[0]["id"])


def test_a_tenant_over_its_limit_waits_in_the_database(
    sqlite_rt: Runtime, stub: StubBroker
) -> None:
    rt = replace(
        sqlite_rt, settings=sqlite_rt.settings.model_copy(update={"tenant_active_runs": 2})
    )
    a = [_submit(rt, "a") for _ in range(5)]
    urgent = _submit(rt, "a", priority=9)
    b = _submit(rt, "b")
    sent = [d.run_id for d in stub.sent if d.kind == "round"]
    assert sent == [a[0], a[1], b]  # a's others wait; b is not behind them
    assert all(run(rt, i)["held"] for i in a[2:] + [urgent])
    order: list[str] = []
    while (d := stub.pop()) is not None:
        if d.kind == "round" and d.run_id not in order:
            order.append(d.run_id)
        stub.deliver(rt, d)
    assert order[:3] == [a[0], a[1], b]
    assert order[3] == urgent  # the first admitted when a slot frees: priority 9
    assert sorted(order) == sorted([*a, urgent, b])
    assert all(run(rt, i)["status"] == "completed" for i in [*a, urgent, b])


def test_the_reaper_admits_when_the_limit_is_raised(sqlite_rt: Runtime, stub: StubBroker) -> None:
    tight = replace(
        sqlite_rt, settings=sqlite_rt.settings.model_copy(update={"tenant_active_runs": 1})
    )
    ids = [_submit(tight, "a") for _ in range(3)]
    assert len(stub.sent) == 1
    assert reap(tight).released == 0  # still full
    loose = replace(
        sqlite_rt, settings=sqlite_rt.settings.model_copy(update={"tenant_active_runs": 3})
    )
    assert reap(loose).released == 2
    stub.drain(loose)
    assert all(run(loose, i)["status"] == "completed" for i in ids)
