"""Facade webhook bodies reach the store as the runtime's renderers, looked up by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.config import Settings
from shared.engine.runtime import Runtime
from shared.interop.webhooks import RENDERERS
from shared.store import deliveries
from shared.store.db import make_engine

DOC = {"type": "run.completed", "data": {"run_id": "r"}}


def test_the_runtime_carries_the_facade_renderers(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    rt = Runtime(engine=engine, settings=Settings(), publish=lambda items: None)
    assert set(RENDERERS) == {"langgraph", "openai", "a2a"}
    assert all(rt.renderers[name] is fn for name, fn in RENDERERS.items())


def test_a_stored_module_path_names_the_same_renderer() -> None:
    """Runs recorded before renderer names kept ``module:langgraph_body``."""
    assert deliveries._renderer_name("scheduler.interop.webhooks:langgraph_body") == "langgraph"
    assert deliveries._renderer_name("openai") == "openai"


def test_an_unknown_renderer_sends_the_treadle_body() -> None:
    cfg: dict[str, Any] = {"url": "https://example.com", "render": "os:system"}
    event = (1, "run.completed", {})
    assert deliveries._render(None, {}, cfg, event, DOC, RENDERERS) is DOC  # type: ignore[arg-type]


def test_a_failing_renderer_sends_the_treadle_body() -> None:
    def broken(conn: Any, run: Any, event: Any, doc: dict[str, Any]) -> dict[str, Any] | None:
        raise RuntimeError("boom")

    cfg = {"url": "https://example.com", "render": "broken-test"}
    event = (1, "run.completed", {})
    renderers = {"broken-test": broken}
    assert deliveries._render(None, {}, cfg, event, DOC, renderers) is DOC  # type: ignore[arg-type]
