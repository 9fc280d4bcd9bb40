"""The vocabulary is defined once (``shared/vocab.py``): event types, and the statuses of runs,
calls and webhook deliveries, are named from it, never spelled as literals elsewhere."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from shared.vocab import CallStatus, DeliveryStatus, EventType, Status

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("shared", "worker", "scheduler")
STATUS_ROOMS = ("shared/engine", "shared/store", "worker", "scheduler/http")
"""Where a status is the project's own (the facades speak their protocols' statuses, and the
pure core's call plan has its own literal type, ``shared.agent.decisions.CallStatus``)."""
EVENT_TYPES = frozenset(e.value for e in EventType)
STATUSES = frozenset(s.value for enum in (Status, CallStatus, DeliveryStatus) for s in enum)


def _sources(*rooms: str) -> Iterator[Path]:
    for room in rooms:
        for path in sorted((ROOT / room).rglob("*.py")):
            if "migrations" not in path.parts and path != ROOT / "shared" / "vocab.py":
                yield path


def _prose(tree: ast.AST) -> set[int]:
    """Docstrings and f-string pieces: text, not names."""
    ids: set[int] = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            ids.add(id(body[0].value))
        if isinstance(n, ast.JoinedStr):
            ids.update(id(v) for v in n.values)
    return ids


def event_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prose = _prose(tree)
    return [
        f"{path.relative_to(ROOT)}:{n.lineno} {n.value!r}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in EVENT_TYPES and id(n) not in prose
    ]


def _is_status(e: ast.expr) -> bool:
    if isinstance(e, ast.Attribute):
        return e.attr == "status"
    if isinstance(e, ast.Subscript):
        return isinstance(e.slice, ast.Constant) and e.slice.value == "status"
    return isinstance(e, ast.Name) and e.id == "status"


def _literals(e: ast.expr) -> list[ast.Constant]:
    items = e.elts if isinstance(e, ast.Tuple | ast.List | ast.Set) else [e]
    return [x for x in items if isinstance(x, ast.Constant) and x.value in STATUSES]


def status_literals(path: Path) -> list[str]:
    """Status literals compared with, or given as, a ``status``."""
    hits: list[ast.Constant] = []
    for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(n, ast.Compare) and any(_is_status(s) for s in [n.left, *n.comparators]):
            hits += [c for s in [n.left, *n.comparators] for c in _literals(s)]
        elif isinstance(n, ast.keyword) and n.arg == "status":
            hits += _literals(n.value)
    return [f"{path.relative_to(ROOT)}:{c.lineno} {c.value!r}" for c in hits]


def test_no_event_type_is_spelled_outside_the_vocabulary() -> None:
    assert [hit for path in _sources(*PRODUCT) for hit in event_literals(path)] == []


def test_no_status_is_spelled_where_the_project_owns_it() -> None:
    assert [hit for path in _sources(*STATUS_ROOMS) for hit in status_literals(path)] == []


def test_the_checks_see_a_literal() -> None:
    bad = ROOT / "tests" / "unit" / "_vocab_probe.py"
    try:
        bad.write_text('if run.status == "queued" or ev["type"] == "run.failed":\n    pass\n')
        assert status_literals(bad) and event_literals(bad)
    finally:
        bad.unlink()
