"""``treadle prune --older-than 30d [--dry-run]``: delete ended runs older than that, straight on
the database (the reaper does the same each pass with ``TREADLE_RETENTION_DAYS``)."""

from __future__ import annotations

import re
from typing import Annotated

import typer

from scheduler.cli.apps import console

__all__ = ["parse_age", "register"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_AGE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*$")


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s`` in seconds; typer.BadParameter otherwise."""
    found = _AGE.match(text.lower())
    if found is None:
        raise typer.BadParameter(f"{text!r}: a number and a unit s, m, h, d or w (e.g. 30d)")
    return float(found.group(1)) * _UNITS[found.group(2)]


def prune(
    older_than: Annotated[
        str, typer.Option("--older-than", help="age of ended runs to delete: 30d, 12h, 2w")
    ],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="count them, delete nothing")] = False,
) -> None:
    """Delete ended runs (with every row of them) that ended longer ago than --older-than."""
    from shared.engine import retention
    from shared.store.db import migrate
    from shared.wiring import get_runtime

    age = parse_age(older_than)
    rt = get_runtime()
    migrate(rt.engine)
    if dry_run:
        report = retention.purge(rt, older_than_s=age, dry_run=True)
        console.print(f"{report.runs} runs would be deleted (dry run: nothing deleted)")
        return
    total = 0
    while True:  # batches of short transactions until nothing is left
        report = retention.purge(rt, older_than_s=age)
        total += report.deleted
        if report.deleted == 0:
            break
    console.print(f"deleted {total} runs")


def register(app: typer.Typer) -> None:
    app.command("prune")(prune)
