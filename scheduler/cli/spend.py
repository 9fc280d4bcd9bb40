"""``treadle spend``: the tenant's spend envelopes (docs/cost.md) over the API.

``treadle spend`` lists them (spent, reserved by calls in flight, left, period);
``treadle spend set SCOPE [NAME] --cap 5 --period month [--fail]`` creates or changes one
(``tenant``, ``agent NAME``, ``cron ID``); ``treadle spend delete SCOPE [NAME]`` removes one.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import typer
from rich.table import Table

from scheduler.cli.apps import console
from scheduler.cli.runs import DEFAULT_URL, JsonOpt, KeyOpt, UrlOpt, api

__all__ = ["register", "spend_app"]

spend_app = typer.Typer(help="Spend envelopes: list, set, delete", invoke_without_command=True)
Scope = Literal["tenant", "agent", "cron"]


def _table(envelopes: list[dict[str, Any]]) -> Table:
    table = Table("scope", "key", "period", "cap", "spent", "reserved", "left", "ends", "on exceed")
    for e in envelopes:
        table.add_row(
            e["scope"],
            e["key"] or "-",
            e["period"],
            f"{e['cap']:g}",
            f"{e['spent']:.6f}",
            f"{e['reserved']:.6f}",
            f"{e['left']:.6f}",
            e["period_end"],
            e["on_exceed"],
        )
    return table


@spend_app.callback()
def show(
    ctx: typer.Context,
    url: UrlOpt = DEFAULT_URL,
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the envelopes with what is spent and reserved in their current period."""
    if ctx.invoked_subcommand is not None:
        return
    with api(url, key) as client:
        envelopes = client.request("GET", "/v1/spend")["envelopes"]
    if as_json:
        typer.echo(json.dumps(envelopes, indent=2))
    elif not envelopes:
        console.print("no spend envelopes")
    else:
        console.print(_table(envelopes))


@spend_app.command("set")
def set_envelope(
    scope: Annotated[Scope, typer.Argument(help="tenant, agent or cron")],
    name: Annotated[str | None, typer.Argument(help="the agent's name; the cron's id")] = None,
    *,
    cap: Annotated[float, typer.Option("--cap", min=0, help="what may be spent a period")],
    period: Annotated[str, typer.Option("--period", help="day or month")] = "month",
    fail: Annotated[bool, typer.Option("--fail", help="fail runs at the cap (else: wait)")] = False,
    url: UrlOpt = DEFAULT_URL,
    key: KeyOpt = None,
) -> None:
    """Create or change an envelope (runs waiting for one go on)."""
    body = {"cap": cap, "period": period, "on_exceed": "fail" if fail else "wait"}
    with api(url, key) as client:
        envelope = client.request("PUT", _path(scope, name), json=body)
    console.print(_table([envelope]))


@spend_app.command("delete")
def delete_envelope(
    scope: Annotated[Scope, typer.Argument(help="tenant, agent or cron")],
    name: Annotated[str | None, typer.Argument(help="the agent's name; the cron's id")] = None,
    url: UrlOpt = DEFAULT_URL,
    key: KeyOpt = None,
) -> None:
    """Remove an envelope."""
    with api(url, key) as client:
        client.request("DELETE", _path(scope, name))
    console.print(f"deleted the {scope} envelope {name or ''}".rstrip())


def _path(scope: Scope, name: str | None) -> str:
    """The envelope's route: ``/v1/spend/tenant``, ``/v1/spend/agents/NAME``, ``…/crons/ID``."""
    if scope == "tenant":
        if name:
            raise typer.BadParameter("the tenant's own envelope takes no name")
        return "/v1/spend/tenant"
    if not name:
        raise typer.BadParameter(f"a {scope} envelope needs the {scope}'s name or id")
    return f"/v1/spend/{scope}s/{name}"


def register(app: typer.Typer) -> None:
    app.add_typer(spend_app, name="spend")
