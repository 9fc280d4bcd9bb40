"""The ``treadle`` command (typer)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console

from scheduler.render import print_run, print_transcript

__all__ = ["app", "main"]

app = typer.Typer(help="treadle: durable, distributed execution of LLM agents on Celery.",
                  no_args_is_help=True, add_completion=False)
console = Console()
FINAL = {"completed", "failed", "cancelled"}
DEFAULT_URL = "http://127.0.0.1:8000"

UrlOpt = Annotated[str, typer.Option("--url", envvar="TREADLE_URL", help="API base URL")]


def _setup_logging() -> None:
    from shared.config import get_settings
    from shared.logs import configure_logging

    configure_logging(get_settings().log_level, get_settings().log_format)


@app.command()
def up(host: Annotated[str | None, typer.Option(help="bind address")] = None,
       port: Annotated[int | None, typer.Option(help="port")] = None,
       concurrency: Annotated[int, typer.Option("-c", help="worker threads")] = 8) -> None:
    """Embedded mode: API + in-process worker + reaper on SQLite, one process."""
    import uvicorn

    from scheduler.api import create_app
    from scheduler.embedded import start_embedded
    from shared.config import get_settings
    from worker.runtime import get_runtime

    _setup_logging()
    settings = get_settings()
    if not settings.embedded:
        console.print("[yellow]TREADLE_BROKER_URL is set: `treadle up` still runs a worker "
                      "in-process against it[/]")
    start_embedded(get_runtime(), concurrency)
    bind = host or settings.api_host
    console.print(f"treadle up: API on http://{bind}:{port or settings.api_port}  "
                  f"database {settings.database_url}  broker {settings.broker_url}")
    if bind not in ("127.0.0.1", "localhost", "::1"):
        console.print("[yellow]warning: no API keys yet; bind to 127.0.0.1 in embedded mode[/]")
    uvicorn.run(create_app(), host=bind, port=port or settings.api_port, log_level="warning")


@app.command()
def api(host: Annotated[str | None, typer.Option()] = None,
        port: Annotated[int | None, typer.Option()] = None) -> None:
    """Production API process (migrates the database first)."""
    import uvicorn

    from scheduler.api import create_app
    from shared.config import get_settings
    from shared.store.db import migrate
    from worker.runtime import get_runtime

    _setup_logging()
    settings = get_settings()
    migrate(get_runtime().engine)
    uvicorn.run(create_app(), host=host or settings.api_host, port=port or settings.api_port)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(ctx: typer.Context,
           concurrency: Annotated[int | None, typer.Option("-c", help="threads")] = None,
           pool: Annotated[str, typer.Option("-P", help="pool")] = "threads") -> None:
    """A Celery worker (threads pool); extra arguments go to `celery worker`."""
    from shared.config import get_settings
    from worker.app import app as celery_app

    conc = concurrency or get_settings().worker_concurrency
    from worker.app import ALL_QUEUES

    celery_app.worker_main(["worker", "-P", pool, "-c", str(conc), "-E", "--without-mingle",
                            "--without-gossip", "-Q", ",".join(ALL_QUEUES), *ctx.args])


@app.command()
def beat() -> None:
    """The reaper's clock (Celery beat): one replica per deployment."""
    from worker.app import app as celery_app

    celery_app.start(["beat", "--loglevel", "INFO"])


@app.command()
def flower(port: Annotated[int, typer.Option(help="port")] = 5555,
           address: Annotated[str, typer.Option(help="bind address")] = "127.0.0.1") -> None:
    """Flower (watch workers and tasks). Basic auth from TREADLE_FLOWER_AUTH=user:password."""
    from worker.app import app as celery_app

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
    from worker.runtime import get_runtime

    do_migrate(get_runtime().engine)
    console.print("database is at the newest schema")


def _load_agent(agent: str) -> Any:
    path = Path(agent)
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return agent


def _client(url: str) -> httpx.Client:
    headers = {}
    key = os.environ.get("TREADLE_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def _check(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            err = resp.json()["error"]
            console.print(f"[red]error {resp.status_code} {err['code']}: {err['message']}[/]")
        except (ValueError, KeyError):
            console.print(f"[red]error {resp.status_code}: {resp.text[:500]}[/]")
        raise typer.Exit(2)
    return resp.json()


@app.command()
def submit(text: Annotated[str, typer.Argument(help="the input")],
           agent: Annotated[str, typer.Option(help="agent file (YAML/JSON) or name")] = "demo",
           wait: Annotated[bool, typer.Option(help="wait for a final or waiting state")] = False,
           as_json: Annotated[bool, typer.Option("--json")] = False,
           url: UrlOpt = DEFAULT_URL) -> None:
    """Submit a run over the API."""
    with _client(url) as client:
        run = _check(client.post("/v1/runs", json={"agent": _load_agent(agent), "input": text}))
        while wait and run["status"] not in FINAL | {"waiting"}:
            time.sleep(0.3)
            run = _check(client.get(f"/v1/runs/{run['id']}"))
    if as_json:
        print(json.dumps(run))
    else:
        print_run(console, run)
    if run["status"] == "failed":
        raise typer.Exit(1)


@app.command()
def show(run_id: str, as_json: Annotated[bool, typer.Option("--json")] = False,
         url: UrlOpt = DEFAULT_URL) -> None:
    """Show a run and its transcript."""
    with _client(url) as client:
        run = _check(client.get(f"/v1/runs/{run_id}"))
        msgs = _check(client.get(f"/v1/runs/{run_id}/messages"))["messages"]
    if as_json:
        print(json.dumps({"run": run, "messages": msgs}))
        return
    print_run(console, run)
    print_transcript(console, msgs)


@app.command()
def demo(question: Annotated[str, typer.Argument()] = "What time is it, and what is 17 * 23?",
         agent: Annotated[str, typer.Option()] = "demo",
         timeout: Annotated[float, typer.Option()] = 30.0) -> None:
    """Run a demo agent end to end in embedded mode and print its transcript."""
    from scheduler.agents import resolve_agent
    from scheduler.embedded import start_embedded
    from scheduler.schemas import message_view, run_view
    from shared.engine.commands import RunInput, submit_run
    from shared.store import repo
    from worker.runtime import get_runtime

    rt = get_runtime()
    start_embedded(rt, concurrency=4)
    row, _ = submit_run(rt, RunInput(agent=resolve_agent(_load_agent(agent)), input=question))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with rt.engine.connect() as conn:
            row = repo.get_run(conn, row["id"])  # type: ignore[assignment]
        if row["status"] in FINAL | {"waiting"}:
            break
        time.sleep(0.05)
    with rt.engine.connect() as conn:
        msgs = [message_view(m).model_dump() for m in repo.list_messages(conn, row["id"])]
    view = run_view(row).model_dump()
    print_run(console, view)
    print_transcript(console, msgs)
    if row["status"] != "completed":
        raise typer.Exit(1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
