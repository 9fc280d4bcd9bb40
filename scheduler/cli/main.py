"""The ``treadle`` command (typer): the processes (up, api, worker, beat, flower, migrate),
the demo, and (``scheduler.cli.runs``) the API client commands."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from scheduler.cli import fleet as cli_fleet
from scheduler.cli import keys as keys_cli
from scheduler.cli import prune as prune_cli
from scheduler.cli import runs as cli_runs
from scheduler.cli import spend as spend_cli
from scheduler.cli.apps import command_group, console
from scheduler.cli.render import print_run, print_transcript
from scheduler.cli.runs import exit_code, load_agent
from shared.vocab import FINAL, Status

if TYPE_CHECKING:
    from shared.config import Settings

__all__ = ["app", "main"]

app = command_group("treadle: durable, distributed execution of LLM agents on Celery.")


def _setup_logging() -> None:
    from shared.config import get_settings
    from shared.logs import configure_logging

    configure_logging(get_settings().log_level, get_settings().log_format)


def _auth_mode(settings: Settings, bind: str) -> str:
    """The API's auth mode for this bind, said at start; auth off off loopback: exit 2."""
    from scheduler.http.auth import auth_mode, check_bind, startup_line
    from shared.errors import ConfigError

    mode = auth_mode(settings, bind)
    try:
        check_bind(mode, bind)
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    console.print(startup_line(mode, bind))
    return mode


@app.command()
def up(
    host: Annotated[str | None, typer.Option(help="bind address")] = None,
    port: Annotated[int | None, typer.Option(help="port")] = None,
    concurrency: Annotated[int, typer.Option("-c", help="worker threads")] = 8,
) -> None:
    """Embedded mode: API + in-process worker + reaper on SQLite, one process."""
    import uvicorn

    from scheduler.app import create_app
    from scheduler.embedded import start_embedded
    from shared.config import get_settings
    from shared.wiring import get_runtime

    _setup_logging()
    settings = get_settings()
    if not settings.embedded:
        console.print(
            "[yellow]TREADLE_BROKER_URL is set: `treadle up` still runs a worker "
            "in-process against it[/]"
        )
    start_embedded(get_runtime(), concurrency)
    bind = host or settings.api_host
    console.print(
        f"treadle up: API on http://{bind}:{port or settings.api_port}  "
        f"database {settings.database_url}  broker {settings.broker_url}"
    )
    mode = _auth_mode(settings, bind)
    uvicorn.run(
        create_app(auth=mode), host=bind, port=port or settings.api_port, log_level="warning"
    )


@app.command()
def api(
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
) -> None:
    """Production API process (migrates the database first)."""
    import uvicorn

    from scheduler.app import create_app
    from shared.config import get_settings
    from shared.store.db import migrate
    from shared.wiring import get_runtime

    _setup_logging()
    settings = get_settings()
    migrate(get_runtime().engine)
    bind = host or settings.api_host
    mode = _auth_mode(settings, bind)
    uvicorn.run(create_app(auth=mode), host=bind, port=port or settings.api_port)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    concurrency: Annotated[int | None, typer.Option("-c", help="threads")] = None,
    pool: Annotated[str, typer.Option("-P", help="pool")] = "threads",
) -> None:
    """A Celery worker (threads pool); extra arguments go to `celery worker`."""
    from shared.celery_app import app as celery_app
    from shared.config import get_settings

    settings = get_settings()
    conc = concurrency or settings.worker_concurrency
    from shared.names import ALL_QUEUES

    # the configured log level (Celery's own default would drop INFO: the reaper's re-sends);
    # task events only when asked (TREADLE_TASK_EVENTS; Flower switches them on itself)
    events = ["-E"] if settings.task_events else []
    celery_app.worker_main(
        [
            "worker",
            "-P",
            pool,
            "-c",
            str(conc),
            "-l",
            settings.log_level.upper(),
            *events,
            "--without-mingle",
            "--without-gossip",
            "-Q",
            ",".join(ALL_QUEUES),
            *ctx.args,
        ]
    )


@app.command()
def beat() -> None:
    """The reaper's clock (Celery beat): one replica per deployment."""
    from shared.celery_app import app as celery_app

    celery_app.start(["beat", "--loglevel", "INFO"])


@app.command()
def flower(
    port: Annotated[int, typer.Option(help="port")] = 5555,
    address: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1",
) -> None:
    """Flower (watch workers and tasks). Basic auth from TREADLE_FLOWER_AUTH=user:password."""
    from shared.celery_app import app as celery_app

    args = ["flower", f"--port={port}", f"--address={address}"]
    auth = os.environ.get("TREADLE_FLOWER_AUTH")
    if auth:
        args.append(f"--basic-auth={auth}")
    else:
        console.print("[yellow]TREADLE_FLOWER_AUTH is not set: Flower runs without auth[/]")
    celery_app.start(args)


@app.command()
def migrate() -> None:
    """Create or upgrade the database schema."""
    from shared.store.db import migrate as do_migrate
    from shared.wiring import get_runtime

    do_migrate(get_runtime().engine)
    console.print("database is at the newest schema")


@app.command()
def demo(
    question: Annotated[
        str | None,
        typer.Argument(
            show_default=False,
            help=(
                "the input (default: a time-and-arithmetic question; with --interactive, "
                "'Please save a note for me.')"
            ),
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help=("agent name or file (default: demo; with --interactive, demo-assistant)"),
        ),
    ] = None,
    interactive: Annotated[
        bool,
        typer.Option(
            "--interactive",
            "-i",
            help="watch it live and answer its question and approval "
            "yourself (an in-process API server on a free loopback port)",
        ),
    ] = False,
    timeout: Annotated[float, typer.Option()] = 30.0,
) -> None:
    """Run a demo agent end to end in embedded mode and print its transcript."""
    if interactive:
        raise typer.Exit(
            _interactive_demo(question or "Please save a note for me.", agent or "demo-assistant")
        )
    _embedded_demo(question or "What time is it, and what is 17 * 23?", agent or "demo", timeout)


def _embedded_demo(question: str, agent: str, timeout: float) -> None:
    """The demo in this process: the run submitted, waited for (up to ``timeout`` s), its
    transcript printed; exit status 1 unless it completed."""
    from scheduler.embedded import start_embedded
    from scheduler.http.agents import resolve_agent
    from scheduler.http.schemas import message_view, run_view
    from shared.engine.commands import RunInput, submit_run
    from shared.store import records
    from shared.store import runs as run_store
    from shared.store.db import reading
    from shared.wiring import get_runtime

    rt = get_runtime()
    start_embedded(rt, concurrency=4)
    spec = resolve_agent(load_agent(agent))
    row, _ = submit_run(rt, RunInput(agent=spec, input=question))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with reading(rt.engine) as conn:
            row = run_store.get_run(conn, row["id"])  # type: ignore[assignment]
        if row["status"] in FINAL | {Status.WAITING}:
            break
        time.sleep(0.05)
    with reading(rt.engine) as conn:
        msgs = [message_view(m).model_dump() for m in records.list_messages(conn, row["id"])]
    view = run_view(row).model_dump()
    print_run(console, view)
    print_transcript(console, msgs)
    if row["status"] != "completed":
        raise typer.Exit(1)


def _interactive_demo(question: str, agent: str) -> int:
    """The demo through the HTTP API of an in-process server, answered by the person here."""
    from scheduler.cli.client import ApiClient
    from scheduler.cli.interactive import watch_run
    from scheduler.cli.localapi import LocalApi

    console.print(
        Text.assemble(
            ("treadle demo", "bold"),
            (" (interactive): ", ""),
            (agent, "cyan"),
            " on an in-process embedded server",
        )
    )
    with LocalApi() as server, ApiClient(server.url) as client:
        run = client.submit(load_agent(agent), question)
        console.print(Text(f"API {server.url}   run {run['id']}", style="dim"))
        run = watch_run(client, run["id"], console, interactive=True)
    return exit_code(run)


cli_runs.register(app)  # submit, watch, answer, approve, cancel, resume, show
cli_fleet.register(app)  # runs | runs search | runs cancel|suspend|resume --filter
keys_cli.register(app)  # keys create | list | revoke
prune_cli.register(app)  # prune --older-than 30d [--dry-run]
spend_cli.register(app)  # spend | spend set SCOPE KEY --cap N | spend delete SCOPE KEY


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
