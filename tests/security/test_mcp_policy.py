"""What a tenant's spec may name in ``mcp``: public URLs (or allow-listed hosts), allowed
env vars; never a local process."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shared.engine.runtime import Runtime
from tests.security.conftest import MakeKey, bearer


def _agent_body(**mcp: Any) -> dict[str, Any]:
    return {"kind": "agent", "model": "demo", "mcp": [{"name": "srv", **mcp}]}


def test_api_refuses_private_mcp_urls_unless_allowed(
    api: TestClient, make_key: MakeKey, secure_rt: Runtime
) -> None:
    key = bearer(make_key("acme"))
    body = {"agent": _agent_body(url="http://10.1.2.3/mcp"), "input": "hi"}
    res = api.post("/v1/runs", json=body, headers=key)
    assert res.status_code == 403
    assert "mcp 'srv': blocked URL: 10.1.2.3 (private address; not allow-listed)" in res.text
    secure_rt.settings.allow_hosts = "10.1.2.3"
    assert api.post("/v1/runs", json=body, headers=key).status_code == 201


def test_api_polices_mcp_header_env(api: TestClient, make_key: MakeKey) -> None:
    body = _agent_body(url="https://93.184.216.34/mcp", headers_env={"Authorization": "SECRET"})
    res = api.post("/v1/runs", json={"agent": body, "input": "hi"}, headers=bearer(make_key("t")))
    assert res.status_code == 403
    assert "SECRET may not be named" in res.text


def test_stdio_refused_for_tenants_too(api: TestClient, make_key: MakeKey) -> None:
    body = _agent_body(command=["sh", "-c", "id"])
    res = api.post("/v1/runs", json={"agent": body, "input": "hi"}, headers=bearer(make_key("t")))
    assert res.status_code == 403
    assert "stdio servers" in res.text
