"""Facade webhook bodies reach the store as installed renderers, looked up by name."""

from __future__ import annotations

from typing import Any

from shared.interop.webhooks import RENDERERS
from shared.store import deliveries
from shared.wiring import install_renderers

DOC = {"type": "run.completed", "data": {"run_id": "r"}}


def test_the_composition_root_installs_the_facade_renderers() -> None:
    install_renderers()
    assert set(RENDERERS) == {"langgraph", "openai", "a2a"}
    assert all(deliveries._renderers[name] is fn for name, fn in RENDERERS.items())


def test_a_stored_module_path_names_the_same_renderer() -> None:
    """Runs recorded before renderer names kept ``module:langgraph_body``."""
    assert deliveries._renderer_name("scheduler.interop.webhooks:langgraph_body") == "langgraph"
    assert deliveries._renderer_name("openai") == "openai"


def test_an_unknown_renderer_sends_the_treadle_body() -> None:
    cfg: dict[str, Any] = {"url": "https://example.com", "render": "os:system"}
    assert deliveries._render(None, {}, cfg, (1, "run.completed", {}), DOC) is DOC  # type: ignore[arg-type]


def test_a_failing_renderer_sends_the_treadle_body() -> None:
    def broken(conn: Any, run: Any, event: Any, doc: dict[str, Any]) -> dict[str, Any] | None:
        raise RuntimeError("boom")

    deliveries.use_renderers({"broken-test": broken})
    cfg = {"url": "https://example.com", "render": "broken-test"}
    assert deliveries._render(None, {}, cfg, (1, "run.completed", {}), DOC) is DOC  # type: ignore[arg-type]
