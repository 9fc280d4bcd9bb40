"""A run's tool catalog and result budget, built once per process for its very spec and held
in the runtime's caches (``shared.engine.cache.RunCaches``); a catalog missing an MCP server
that could not be listed is built again next time."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

from shared.agent.compression import tool_result_budget
from shared.agent.spec import AgentSpec
from shared.config import DEFAULT_TENANT
from shared.engine import metrics
from shared.engine.cache import CATALOG_ENTRY_BYTES, schema_tokens_of
from shared.engine.catalog import Catalog, build_catalog
from shared.engine.gate import Stage
from shared.engine.runtime import Runtime
from shared.errors import ConfigError
from shared.llm.profiles import resolve_profile
from shared.tools.mcp_tools import McpAccess

__all__ = ["catalog", "mcp_access", "result_budget"]

log = logging.getLogger("treadle.mcp")


def catalog(
    rt: Runtime,
    run_id: str,
    spec: AgentSpec,
    attachments: Sequence[Any],
    *,
    tenant: str = DEFAULT_TENANT,
    deadline: float | None = None,
) -> Catalog:
    """The run's tool catalog, built once per process for this very ``spec`` (``given``); a
    catalog missing an MCP server that could not be listed is built again next time (its
    listing waits at most until the run's ``deadline``, and counts against ``tenant``)."""
    found = rt.caches.catalogs.get(run_id)
    if found is None or found[0] is not spec:
        mcp = replace(mcp_access(rt), tenant=tenant, deadline=deadline) if spec.mcp else None
        with rt.gate.outside(Stage.CLAIM) if mcp else nullcontext():  # MCP listing: I/O
            built = build_catalog(
                spec, rt.profiles, attachments=attachments, mcp=mcp, mcp_lists=rt.mcp_lists
            )
        tokens = schema_tokens_of(built)
        found = (spec, built, tokens)
        if built.partial:
            if not built.deferred:  # a deferred round comes back: counted when it gives up
                _unavailable(run_id, built)
        else:  # its tools' schemas, as Python objects: about 4 bytes a character, 4 a token
            rt.caches.catalogs.put(run_id, found, CATALOG_ENTRY_BYTES + 16 * tokens)
    return found[1]


def _unavailable(run_id: str, built: Catalog) -> None:
    """A log line and the metric for each MCP server a catalog lacks (the round that uses
    the catalog records a ``tool.unavailable`` event and tells the model)."""
    for server, why in built.unreachable.items():
        metrics.MCP_UNAVAILABLE.inc()
        log.warning("run %s: the tools of MCP server %r are unavailable: %s", run_id, server, why)


def mcp_access(rt: Runtime) -> McpAccess:
    """How this process reaches MCP servers (its settings)."""
    s = rt.settings
    hosts = tuple(h.strip() for h in s.allow_hosts.split(",") if h.strip())
    return McpAccess(
        allow_hosts=hosts,
        ttl=s.mcp_tools_ttl,
        max_bytes=s.mcp_max_bytes,
        timeout_s=s.mcp_timeout_s,
        max_tools=s.max_tools,
        list_bytes=s.mcp_list_max_bytes,
        wait_s=s.mcp_list_wait_s,
    )


def result_budget(rt: Runtime, run_id: str, spec: AgentSpec) -> int:
    """The run's tool-result budget in tokens (L-7: from its profile's window)."""
    found = rt.caches.budgets.get(run_id)
    if found is None or found[0] is not spec:
        try:
            window = resolve_profile(spec.model, rt.profiles).context_window
        except ConfigError:
            window = 128_000
        found = (spec, tool_result_budget(window, spec.tool_result_max_tokens))
        rt.caches.budgets.put(run_id, found, 64)
    return found[1]
