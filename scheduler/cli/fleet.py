"""``treadle runs``: list runs (newest first), ``runs search --filter``, and act on many at
once: ``runs cancel|suspend|resume --filter`` (or ``--id``), at most 500 runs a call (docs/
api.md, "Search and bulk actions")."""

from __future__ import annotations

import json
from typing import Annotated, Any, Final

import typer
from rich.table import Table
from rich.text import Text

from scheduler.cli.apps import console
from scheduler.cli.runs import DEFAULT_URL, JsonOpt, KeyOpt, UrlOpt, api, fail, runs_table

__all__ = ["bulk_body", "register", "search_params"]

runs_app = typer.Typer(help="List runs, search them, and cancel, suspend or resume many.")

PLAIN_KEYS: Final = frozenset(
    {
        "agent",
        "status",
        "thread_id",
        "created_after",
        "created_before",
        "ended_after",
        "ended_before",
    }
)
FilterOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--filter",
        "-f",
        help="KEY=VALUE (repeat): metadata.<key>, agent, status, thread_id, created_after, "
        "created_before, ended_after, ended_before (times: ISO 8601 with an offset)",
        show_default=False,
    ),
]
IdOpt = Annotated[
    list[str] | None, typer.Option("--id", help="a run id (repeat)", show_default=False)
]


def _pairs(filters: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for item in filters or ():
        key, sep, value = item.partition("=")
        if not sep or not (key in PLAIN_KEYS or (key.startswith("metadata.") and len(key) > 9)):
            raise fail(
                f"bad --filter {item!r}: KEY=VALUE with KEY metadata.<key> or one of "
                f"{', '.join(sorted(PLAIN_KEYS))}"
            )
        out.append((key, value))
    return out


def search_params(filters: list[str] | None) -> list[tuple[str, str]]:
    """``GET /v1/runs`` query parameters of the ``--filter`` options."""
    return _pairs(filters)


def bulk_body(filters: list[str] | None, ids: list[str] | None, limit: int) -> dict[str, Any]:
    """The body of ``POST /v1/runs/{action}``: ids, or the filter."""
    if ids:
        if filters:
            raise fail("give --id or --filter, not both")
        return {"ids": ids}
    found: dict[str, Any] = {}
    for key, value in _pairs(filters):
        if key.startswith("metadata."):
            found.setdefault("metadata", {})[key.removeprefix("metadata.")] = value
        elif key == "status":
            found.setdefault("status", []).append(value)
        else:
            found[key] = value
    if not found:
        raise fail("name the runs: --filter KEY=VALUE or --id RUN")
    return {"filter": found, "limit": limit}


@runs_app.callback(invoke_without_command=True)
def runs(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="only runs with this status")] = None,
    thread: Annotated[str | None, typer.Option(help="only runs on this thread")] = None,
    limit: Annotated[int, typer.Option(help="how many (newest first)")] = 20,
    as_json: JsonOpt = False,
    url: UrlOpt = DEFAULT_URL,
    key: KeyOpt = None,
) -> None:
    """List runs, newest first (``runs search``: by filter)."""
    if ctx.invoked_subcommand is not None:
        return
    with api(url, key) as client:
        page = client.runs(status=status, thread_id=thread, limit=limit)
    if as_json:
        print(json.dumps(page, ensure_ascii=False))
        return
    console.print(runs_table(page["runs"]) if page["runs"] else Text("no runs", style="dim"))


@runs_app.command()
def search(
    filters: FilterOpt = None,
    limit: Annotated[int, typer.Option(help="how many at most (newest first)")] = 50,
    as_json: JsonOpt = False,
    url: UrlOpt = DEFAULT_URL,
    key: KeyOpt = None,
) -> None:
    """Runs that match every --filter, newest first (pages through up to --limit)."""
    params = search_params(filters)
    found: list[dict[str, Any]] = []
    cursor: str | None = None
    with api(url, key) as client:
        while len(found) < limit:
            page = client.search(params, limit=min(200, limit - len(found)), cursor=cursor)
            found += page["runs"]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    if as_json:
        print(json.dumps({"runs": found, "next_cursor": cursor}, ensure_ascii=False))
        return
    console.print(runs_table(found) if found else Text("no runs", style="dim"))


def _act(action: str, body: dict[str, Any], url: str, key: str | None, every: bool) -> list[Any]:
    results: list[Any] = []
    with api(url, key) as client:
        for _ in range(1000):  # --all: call again while the filter matches more
            got = client.bulk(action, body)
            results += got["results"]
            if not (every and got["more"] and got["results"]):
                break
    return results


def _print_outcomes(results: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"results": results}, ensure_ascii=False))
        return
    table = Table(box=None, header_style="bold dim", pad_edge=False)
    for col in ("run", "outcome", "status", "detail"):
        table.add_column(col)
    for r in results:
        table.add_row(r["run_id"], r["outcome"], r.get("status") or "", r.get("detail") or "")
    console.print(table if results else Text("no runs matched", style="dim"))


def _bulk_command(action: str, doc: str) -> Any:
    def command(
        filters: FilterOpt = None,
        ids: IdOpt = None,
        limit: Annotated[int, typer.Option(help="runs per call (at most 500)")] = 100,
        every: Annotated[bool, typer.Option("--all", help="call again until none is left")] = False,
        as_json: JsonOpt = False,
        url: UrlOpt = DEFAULT_URL,
        key: KeyOpt = None,
    ) -> None:
        results = _act(action, bulk_body(filters, ids, limit), url, key, every)
        _print_outcomes(results, as_json)

    command.__doc__ = doc
    command.__name__ = action
    return command


runs_app.command("cancel")(_bulk_command("cancel", "Cancel the runs named (not ended ones)."))
runs_app.command("suspend")(
    _bulk_command("suspend", "Suspend running runs at their next round boundary.")
)
runs_app.command("resume")(_bulk_command("resume", "Resume suspended runs."))


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
