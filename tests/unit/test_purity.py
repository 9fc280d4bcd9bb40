"""The functional core: shared/agent is pure — no celery, sqlalchemy, httpx, redis."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

FORBIDDEN = {
    "celery",
    "kombu",
    "sqlalchemy",
    "httpx",
    "httpx_sse",
    "redis",
    "fastapi",
    "starlette",
    "psycopg",
    "uvicorn",
}
AGENT = Path(__file__).resolve().parents[2] / "shared" / "agent"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
            if node.module.startswith("shared.") and not node.module.startswith("shared.agent"):
                names.add(node.module)
    return names


def test_agent_sources_import_nothing_impure() -> None:
    files = sorted(AGENT.glob("*.py"))
    assert files, "shared/agent has no modules"
    for f in files:
        bad = (_imports(f) & FORBIDDEN) | {m for m in _imports(f) if m.startswith("shared.")}
        assert not bad, f"{f.name} imports {sorted(bad)}"


def test_importing_the_core_loads_no_io_library() -> None:
    mods = ", ".join(
        f"shared.agent.{f.stem}" for f in sorted(AGENT.glob("*.py")) if f.stem != "__init__"
    )
    code = (
        f"import sys, importlib\nfor m in '{mods}'.split(', '): importlib.import_module(m)\n"
        f"print(sorted(k for k in sys.modules if k.split('.')[0] in {sorted(FORBIDDEN)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
