"""``treadle keys create | list | revoke | webhook-secret``: API keys, straight on the database,
and a tenant's webhook secret.

A key is printed once, when it is created; only its SHA-256 is kept.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Annotated

import typer
from rich.table import Table
from sqlalchemy.engine import Engine

from scheduler.cli.apps import command_group, console
from shared.errors import NotFound, SpecError
from shared.isotime import iso, iso_or_none
from shared.store import keys

__all__ = ["keys_app", "register"]

keys_app = command_group("API keys: create (printed once), list, revoke.")
_SCOPE_HELP = f"a scope: {', '.join(keys.SCOPES)} (repeat; default runs:write and runs:read)"


def _engine() -> Engine:
    from shared.store.db import migrate
    from shared.wiring import get_runtime

    engine = get_runtime().engine
    migrate(engine)
    return engine


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _fail(message: str) -> typer.Exit:
    console.print(f"[red]{message}[/]")
    return typer.Exit(2)


@keys_app.command("create")
def create(
    tenant: Annotated[str, typer.Option(help="the tenant (created if new)")],
    scope: Annotated[list[str] | None, typer.Option(help=_SCOPE_HELP)] = None,
    name: Annotated[str | None, typer.Option(help="a label for people")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Create a key for a tenant and print it (the only time it is shown)."""
    try:
        with _engine().begin() as conn:
            new = keys.create_key(conn, tenant, scope or list(keys.DEFAULT_SCOPES), name)
    except SpecError as exc:
        raise _fail(str(exc)) from None
    if as_json:
        print(
            json.dumps(
                {
                    "id": new.key.id,
                    "tenant": new.key.tenant,
                    "key": new.secret,
                    "scopes": list(new.key.scopes),
                }
            )
        )
        return
    console.print(f"key {new.key.id}  tenant {tenant}  scopes {', '.join(new.key.scopes)}")
    print(new.secret)
    console.print("[dim]Store it now: it is not shown again (only its hash is kept).[/]")


@keys_app.command("list")
def list_(
    tenant: Annotated[str | None, typer.Option(help="only this tenant")] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List keys (never the keys themselves: their first characters)."""
    with _engine().connect() as conn:
        found = keys.list_keys(conn, tenant)
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "id": k.id,
                        "tenant": k.tenant,
                        "prefix": k.prefix,
                        "name": k.name,
                        "scopes": list(k.scopes),
                        "created_at": iso(k.created_at),
                        "revoked_at": iso_or_none(k.revoked_at),
                    }
                    for k in found
                ]
            )
        )
        return
    table = Table("id", "tenant", "key", "name", "scopes", "created", "revoked")
    for k in found:
        table.add_row(
            k.id,
            k.tenant,
            k.prefix + "…",
            k.name or "",
            ", ".join(k.scopes),
            _when(k.created_at),
            _when(k.revoked_at),
        )
    console.print(table)


@keys_app.command("revoke")
def revoke(key_id: Annotated[str, typer.Argument(help="the key's id (key_...)")]) -> None:
    """Revoke a key: it stops working at once."""
    try:
        with _engine().begin() as conn:
            key = keys.revoke_key(conn, key_id)
    except NotFound as exc:
        raise _fail(str(exc)) from None
    console.print(f"revoked {key.id} (tenant {key.tenant}) at {_when(key.revoked_at)}")


@keys_app.command("webhook-secret")
def webhook_secret(tenant: Annotated[str, typer.Option(help="the tenant")]) -> None:
    """Print the tenant's webhook secret (whsec_...): its facade webhooks are signed with it.
    Derived from the operator's secret (TREADLE_WEBHOOK_SECRET_ENV), which never leaves."""
    from shared.config import get_settings
    from shared.engine.webhooks import tenant_secret

    name = get_settings().webhook_secret_env
    value = os.environ.get(name) if name else None
    if not value:
        raise _fail("set TREADLE_WEBHOOK_SECRET_ENV (and that variable) to sign webhooks")
    print(tenant_secret(value, tenant))


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app, name="keys")
