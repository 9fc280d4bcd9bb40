"""The real ``langgraph-sdk``'s ``client.crons.*`` on treadle's crons (the firing itself is
tested in tests/engine/test_schedule.py and tests/services/test_schedule_workers.py)."""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

from tests.interop.conftest import Served

HELLO = {"messages": [{"role": "user", "content": "hi"}]}


def test_crons_through_the_sdk(served: Served) -> None:
    client = get_sync_client(url=f"{served.url}/langgraph", api_key="unused-locally")
    info = httpx.get(f"{served.url}/langgraph/info").json()
    assert info["flags"]["crons"] is True
    cron = client.crons.create(
        "it-chat", schedule="*/10 * * * *", input=HELLO, metadata={"k": "v"}, timezone="UTC"
    )
    assert cron["cron_id"].startswith("cron_") and cron["assistant_id"] == "it-chat"
    assert cron["enabled"] is True and cron["next_run_date"] and cron["metadata"] == {"k": "v"}
    thread = client.threads.create()
    on_thread = client.crons.create_for_thread(
        thread["thread_id"],
        "it-chat",
        schedule="0 9 * * MON-FRI",
        input=HELLO,
        timezone="Europe/Berlin",
    )
    assert on_thread["thread_id"] == thread["thread_id"]
    assert on_thread["timezone"] == "Europe/Berlin"
    found = client.crons.search(assistant_id="it-chat")
    assert {c["cron_id"] for c in found} >= {cron["cron_id"], on_thread["cron_id"]}
    mine = client.crons.search(thread_id=thread["thread_id"])
    assert [c["cron_id"] for c in mine] == [on_thread["cron_id"]]
    assert client.crons.count(thread_id=thread["thread_id"]) == 1
    named = client.threads.create(thread_id="cron-named-thread")  # stored scoped to the tenant
    on_named = client.crons.create_for_thread(
        "cron-named-thread", "it-chat", schedule="0 12 * * *", input=HELLO
    )
    assert on_named["thread_id"] == named["thread_id"] == "cron-named-thread"
    assert [c["cron_id"] for c in client.crons.search(thread_id="cron-named-thread")] == [
        on_named["cron_id"]
    ]
    client.crons.delete(on_named["cron_id"])
    off = client.crons.update(cron["cron_id"], enabled=False)
    assert off["enabled"] is False and off["next_run_date"] is None
    client.crons.delete(cron["cron_id"])
    client.crons.delete(on_thread["cron_id"])
    assert not [c for c in client.crons.search() if c["cron_id"] == cron["cron_id"]]
    with pytest.raises(NotFoundError):
        client.crons.delete(cron["cron_id"])
    with pytest.raises(UnprocessableEntityError):
        client.crons.create("it-chat", schedule="not a cron", input=HELLO)
    with pytest.raises(NotFoundError):
        client.crons.create_for_thread(
            "no-such-thread", "it-chat", schedule="* * * * *", input=HELLO
        )
