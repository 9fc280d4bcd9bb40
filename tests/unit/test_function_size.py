"""Short functions as a test: no function of the product packages is over 60 lines,
and a Celery task's body (its docstring aside) is at most 10 lines: what every task shares is
the base class's (``worker.base``). ruff's C901 and PLR0915 (``pyproject.toml``) bound the
branches and statements; this bounds the length they do not see. Migrations are exempt.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "worker", "scheduler")
MAX_LINES = 60
MAX_TASK_BODY = 10
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _functions() -> Iterator[tuple[str, Function]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            where = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, Function):
                    yield where, node


def _lines(node: ast.AST) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def _body_lines(fn: Function) -> int:
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if not body:
        return 0
    end = body[-1].end_lineno
    assert end is not None
    return end - body[0].lineno + 1


def _is_task(fn: Function) -> bool:
    for d in fn.decorator_list:
        call = d.func if isinstance(d, ast.Call) else d
        if isinstance(call, ast.Attribute) and call.attr == "task":
            return True
    return False


def test_no_function_is_over_60_lines() -> None:
    long = {
        f"{where}:{fn.name} ({_lines(fn)} lines)"
        for where, fn in _functions()
        if _lines(fn) > MAX_LINES
    }
    assert not long, f"split into short named helpers: {sorted(long)}"


def test_every_task_body_is_at_most_10_lines() -> None:
    tasks = [(where, fn) for where, fn in _functions() if where.startswith("worker/")]
    tasks = [(where, fn) for where, fn in tasks if _is_task(fn)]
    assert len(tasks) >= 4  # round, tool, webhook, reap: the check sees them
    long = [f"{w}:{fn.name}" for w, fn in tasks if _body_lines(fn) > MAX_TASK_BODY]
    assert not long, f"task bodies over {MAX_TASK_BODY} lines: {long}"
