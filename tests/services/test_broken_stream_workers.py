"""A model server dying mid-stream, through a real Celery worker (SPEC M-2, M-8, L-12).

The server ends its bodies by closing the connection (``tests.closing_llm``), so its death
mid-reply looks like a stream that ended. It is a broken stream, not the run's answer: the
round is retried and the run's answer is the whole reply of the next call, and ``/usage``
shows the abandoned partial call (``committed: false``, estimated) beside the one that
committed, both in the run's cost.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from scheduler.app import create_app
from shared.engine.runtime import Runtime
from shared.llm.fake_server import ReplySpec
from tests.closing_llm import ClosingLLMServer
from tests.support import WorkerProcs, wait_for

ANSWER = "The whole answer, from its first word to its last one."
PRICING = {"tiers": [{"input": 1.0, "output": 2.0}]}


def test_server_dying_mid_stream_is_retried_and_billed(
    prod_rt: Runtime, workers: WorkerProcs
) -> None:
    workers.start("alpha")
    with ClosingLLMServer() as llm, TestClient(create_app(lambda: prod_rt)) as client:
        llm.script(ReplySpec(text=ANSWER, cut_after=4), ReplySpec(text=ANSWER))
        model = {"provider": "openai", "base_url": llm.base_url, "model": "m", "pricing": PRICING}
        run = client.post(
            "/v1/runs", json={"agent": {"kind": "chat", "model": model}, "input": "hi"}
        ).json()
        done = wait_for(
            lambda: (
                (r := client.get(f"/v1/runs/{run['id']}").json())["status"]
                in ("completed", "failed")
                and r
            ),
            60,
        )
        rows = client.get(f"/v1/runs/{run['id']}/usage").json()["usage"]
        assert len(llm.bodies) == 2
    assert done["status"] == "completed", done
    assert done["result"]["text"] == ANSWER  # the whole reply, not the part before the cut
    abandoned, kept = sorted(rows, key=lambda r: r["committed"])
    assert not abandoned["committed"] and abandoned["estimated"], abandoned
    assert abandoned["output_tokens"] > 0 and abandoned["cost"] > 0, abandoned
    assert abandoned["output_tokens"] < kept["output_tokens"], (abandoned, kept)
    assert kept["committed"], kept
    assert done["usage"]["cost"] == pytest.approx(abandoned["cost"] + kept["cost"])
