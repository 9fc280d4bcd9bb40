"""The floor plan as tests: imports point down only.

``shared/`` (core → adapters → engine) is below ``worker/`` and ``scheduler/``; nothing in
``shared/`` or ``worker/`` imports ``scheduler/``, and ``scheduler/`` never imports ``worker/``
(it sends tasks by name). Inside ``scheduler/`` neither the modules nor the rooms (``cli``,
``app``, ``interop``, ``http``, ``embedded``) form a cycle. The store imports nothing above
it. Every import counts, lazy ones inside functions too: a lazy import hides a cycle, it does
not remove it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "worker", "scheduler")
STORE_MAY_IMPORT = (
    "shared.store",
    "shared.agent",
    "shared.config",
    "shared.errors",
    "shared.isotime",
    "shared.vocab",
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module a file imports (``from a.b import c`` counts as ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            assert node.module is not None
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def _graph(package: str) -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports."""
    modules = {_module_name(p): p for p in _sources(package)}
    return {
        name: {m for m in _imports(path) if m in modules and m != name}
        for name, path in modules.items()
    }


def _cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a path, or None (depth-first, three colours)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def _offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {m}"
        for path in _sources(package)
        for m in sorted(_imports(path))
        if m.split(".")[0] in forbidden
    ]


def test_nothing_below_imports_the_scheduler() -> None:
    assert _offenders("shared", ("scheduler",)) == []
    assert _offenders("worker", ("scheduler",)) == []


def test_shared_never_imports_the_worker() -> None:
    assert _offenders("shared", ("worker",)) == []


def test_the_scheduler_never_imports_the_worker() -> None:
    assert _offenders("scheduler", ("worker",)) == []


def test_the_scheduler_modules_have_no_import_cycle() -> None:
    assert _cycle(_graph("scheduler")) is None


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "scheduler"


def test_the_scheduler_rooms_have_no_import_cycle() -> None:
    rooms: dict[str, set[str]] = {}
    for module, deps in _graph("scheduler").items():
        rooms.setdefault(_room(module), set()).update(
            _room(d) for d in deps if _room(d) != _room(module)
        )
    rooms.pop("scheduler", None)  # the package's own __init__ imports nothing
    assert _cycle(rooms) is None, rooms


def test_the_store_imports_nothing_above_it() -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {m}"
        for path in _sources("shared/store")
        for m in sorted(_imports(path))
        if m.split(".")[0] in PACKAGES and not m.startswith(STORE_MAY_IMPORT)
    ]
    assert bad == []


def test_the_store_loads_no_code_by_name() -> None:
    """A renderer (or anything else) the store calls is handed to it, never imported from a
    string found in a row."""
    for path in _sources("shared/store"):
        text = path.read_text(encoding="utf-8")
        assert "import_module" not in text and "__import__" not in text, path


def test_the_checks_see_a_violation() -> None:
    """The helpers themselves: a cycle and an upward import are found."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert "scheduler.http.auth" in _imports(ROOT / "scheduler" / "app.py")


def test_the_vocabulary_imports_nothing_of_the_project() -> None:
    """``shared.vocab`` is at the bottom: every room may import it."""
    assert [m for m in _imports(ROOT / "shared" / "vocab.py") if m.split(".")[0] in PACKAGES] == []


def _lazy_imports(path: Path) -> list[str]:
    """Imports that are not at a module's top level (inside a function, a class, an ``if``:
    ``if TYPE_CHECKING:`` too — a cycle hidden from the interpreter is still a cycle)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)}
    return [
        f"{path.relative_to(ROOT)}:{n.lineno}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in top
    ]


def test_the_engine_modules_have_no_import_cycle() -> None:
    """The kernel reads bottom-up: change → tx → join → follow-ups → transition → the rest."""
    assert _cycle(_graph("shared/engine")) is None


def test_the_engine_has_no_lazy_import() -> None:
    assert [hit for path in _sources("shared/engine") for hit in _lazy_imports(path)] == []


SQL_FREE = ("shared", "worker", "scheduler")
SQLALCHEMY_OUTSIDE_STORE = ("sqlalchemy.engine", "sqlalchemy.exc", "sqlalchemy.event")
"""What code outside the store may take from SQLAlchemy: the engine and connection types,
its errors and engine events — nothing that builds a statement."""


def _sql_builders(path: Path) -> list[str]:
    """Imports in ``path`` that can build SQL: ``sqlalchemy`` itself (``sa.select``…),
    anything of it but types, errors and events, and the store's tables."""
    hits: list[str] = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Import):
            mods = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module:
            mods = (
                [n.module]
                if n.module != "sqlalchemy"
                else [f"sqlalchemy.{a.name}" for a in n.names]
            )
        else:
            continue
        hits += [
            f"{path.relative_to(ROOT)}:{n.lineno} {m}"
            for m in mods
            if (m.split(".")[0] == "sqlalchemy" and not m.startswith(SQLALCHEMY_OUTSIDE_STORE))
            or m.startswith("shared.store.tables")
        ]
    return hits


def test_no_sql_is_built_outside_the_store() -> None:
    """The store owns all SQL: no statement constructor (``sa.select``, a table's
    ``.delete()``) is within reach of any other module."""
    outside = [
        path
        for package in SQL_FREE
        for path in _sources(package)
        if not path.is_relative_to(ROOT / "shared" / "store")
    ]
    assert [hit for path in outside for hit in _sql_builders(path)] == []
    assert _sql_builders(ROOT / "shared" / "store" / "runs.py")  # the check sees one
