"""The ``treadle`` commands that talk to the API: submit, watch, answer, approve, cancel,
resume, show (``runs`` is ``scheduler.cli.fleet``'s). The API is ``--url`` /
``TREADLE_URL``; the key ``--key`` / ``TREADLE_API_KEY``.

Exit codes: 0 the run completed (or the command did what it was asked), 1 the run failed or
was cancelled, 2 a usage or API error, 3 the run is waiting (on a question or an approval).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table
from rich.text import Text

from scheduler.cli.apps import console, err_console
from scheduler.cli.client import FINAL, ApiClient, ApiError
from scheduler.cli.decisions import FlagError, flag_decisions
from scheduler.cli.interactive import ask_answers, decide_approval, watch_run
from scheduler.cli.prompts import interactive_terminal
from scheduler.cli.render import print_run, print_transcript, print_warnings
from scheduler.cli.watch import STATUS_STYLE, model_name

__all__ = ["DEFAULT_URL", "exit_code", "load_agent", "register", "runs_table"]

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_OK, EXIT_RUN, EXIT_USAGE, EXIT_WAITING = 0, 1, 2, 3


UrlOpt = Annotated[str, typer.Option("--url", envvar="TREADLE_URL", help="API base URL")]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--key",
        envvar="TREADLE_API_KEY",
        help="API key (sent as a bearer token)",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON (for scripts)")]
InputOpt = Annotated[
    bool | None,
    typer.Option(
        "--input/--no-input",
        help="answer pauses here (default: when in a terminal)",
        show_default=False,
    ),
]
RunIdArg = Annotated[str, typer.Argument(help="the run id")]
FollowOpt = Annotated[bool, typer.Option("--watch", help="then follow the run")]

AgentOpt = Annotated[
    str | None,
    typer.Option(
        "--agent",
        "-a",
        help="agent file (YAML/JSON) or registered name (default: demo)",
        show_default=False,
    ),
]
WaitOpt = Annotated[
    bool,
    typer.Option(
        "--wait/--detach",
        "-w/-d",
        help="wait until it ends or waits for you (shows the plan and the question); "
        "--detach returns at once",
    ),
]


def exit_code(run: dict[str, Any]) -> int:
    status = run.get("status")
    if status in ("failed", "cancelled"):
        return EXIT_RUN
    return EXIT_WAITING if status == "waiting" else EXIT_OK


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    err_console.print(f"[red]error:[/] {message}")
    return typer.Exit(code)


@contextmanager
def api(url: str, key: str | None) -> Iterator[ApiClient]:
    """A client; an API error ends the command with exit code 2."""
    client = ApiClient(url, key)
    try:
        yield client
    except ApiError as exc:
        raise fail(str(exc)) from None
    finally:
        client.close()


def load_agent(agent: str) -> Any:
    """An agent file (YAML or JSON) as a spec, or else the string (a registered name)."""
    path = Path(agent)
    if not path.is_file():
        return agent
    text = path.read_text(encoding="utf-8")
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)


def _agent_spec(agent: str | None, overrides: dict[str, Any]) -> Any:
    loaded = load_agent(agent) if agent else None
    if not overrides:
        return loaded or "demo"
    if isinstance(loaded, str):
        raise fail(
            f"{loaded!r} is not a file: spec flags (--model, --tool, …) combine with an "
            "agent file or stand alone, not with a registered name"
        )
    return {**(loaded or {"kind": "agent", "model": "demo"}), **overrides}


def _read_input(text: str | None) -> str:
    if text is not None and text != "-":
        return text
    if text is None and sys.stdin.isatty():
        raise fail("give the input as an argument (or '-' to read it from stdin)")
    return sys.stdin.read()


def _print_result(run: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(run, ensure_ascii=False))
        return
    print_run(console, run)
    if run.get("status") == "completed" and (run.get("result") or {}).get("text"):
        console.print(Text(run["result"]["text"]))
    if run.get("status") == "waiting":
        kind = (run.get("pending") or {}).get("kind")
        if kind == "provider":
            profile = (run.get("pending") or {}).get("profile")
            console.print(f"[magenta]waiting:[/] for model provider {profile} (tried again soon)")
            return
        cmd = "answer" if kind == "ask" else "approve"
        console.print(f"[magenta]waiting:[/] treadle {cmd} {run['id']}")
    if run.get("status") in ("failed", "cancelled"):
        console.print(Text(f"resume it: treadle resume {run['id']}", style="dim"))


_API_OPTIONS = tuple(
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=option)
    for name, option, default in (
        ("as_json", JsonOpt, False),
        ("url", UrlOpt, DEFAULT_URL),
        ("key", KeyOpt, None),
    )
)


def _run_command(body: Callable[..., None]) -> Callable[..., None]:
    """A command on one run, whose name, help and own options are ``body``'s: it takes the run
    id, those options, then ``--json``, ``--url`` and ``--key``, and calls
    ``body(client, run_id, as_json, **options)`` with a client of the API (an API error ends
    it with exit code 2)."""

    @functools.wraps(body)
    def command(run_id: str, *, as_json: bool, url: str, key: str | None, **options: Any) -> None:
        with api(url, key) as client:
            body(client, run_id, as_json, **options)

    own = list(inspect.signature(body, eval_str=True).parameters.values())[3:]
    run_id = inspect.Parameter("run_id", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    params = [run_id.replace(annotation=RunIdArg), *own, *_API_OPTIONS]
    command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
    return command


def _watch(client: ApiClient, run_id: str, interactive: bool | None, as_json: bool) -> int:
    ask = interactive_terminal() if interactive is None else interactive
    run = watch_run(client, run_id, err_console if as_json else console, interactive=ask)
    if as_json:
        print(json.dumps(run, ensure_ascii=False))
    elif run["status"] == "waiting":
        _print_result(run, False)
    return exit_code(run)


def submit(
    text: Annotated[str | None, typer.Argument(help="the input ('-': read stdin)")] = None,
    agent: AgentOpt = None,
    kind: Annotated[str | None, typer.Option(help="spec: kind (agent, chat, …)")] = None,
    model: Annotated[str | None, typer.Option(help="spec: model profile name")] = None,
    tool: Annotated[list[str] | None, typer.Option(help="spec: a tool (repeat)")] = None,
    system: Annotated[str | None, typer.Option(help="spec: system prompt")] = None,
    plan: Annotated[bool, typer.Option("--plan", help="spec: planning agent")] = False,
    ask: Annotated[bool, typer.Option("--ask", help="spec: may ask the user")] = False,
    guarded: Annotated[bool, typer.Option("--guarded", help="spec: writes need approval")] = False,
    thread: Annotated[str | None, typer.Option(help="thread id")] = None,
    metadata: Annotated[str | None, typer.Option(help="metadata (a JSON object)")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Idempotency-Key header")] = None,
    wait: WaitOpt = True,
    watch: Annotated[bool, typer.Option("--watch", help="follow it live")] = False,
    interactive: InputOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = DEFAULT_URL,
    key: KeyOpt = None,
) -> None:
    """Submit a run: a registered agent, an agent file, or a spec from flags."""
    overrides = _given(
        kind=kind,
        model=model,
        tools=tool or None,
        system_prompt=system,
        plan=plan or None,
        ask=ask or None,
        guarded=guarded or None,
    )
    spec = _agent_spec(agent, overrides)
    meta = _json_object(metadata) if metadata else None
    if isinstance(spec, str):  # a registered agent: its name shows in `runs` and the console
        meta = {"agent": spec, **(meta or {})}
    with api(url, key) as client:
        run = client.submit(
            spec,
            _read_input(text),
            thread_id=thread,
            metadata=meta,
            idempotency_key=idempotency_key,
        )
        if watch:
            raise typer.Exit(_watch(client, run["id"], interactive, as_json))
        if wait:
            run = client.wait(run["id"])
    if wait or as_json:
        _print_result(run, as_json)
    else:
        _print_submitted(run)
    raise typer.Exit(exit_code(run) if wait else EXIT_OK)


def _given(**flags: Any) -> dict[str, Any]:
    """The spec flags given on the command line (the others: the agent's own)."""
    return {k: v for k, v in flags.items() if v is not None}


def _print_submitted(run: dict[str, Any]) -> None:
    """A detached submit: the run's id and how to follow it."""
    console.print(
        Text.assemble(
            "submitted ", (run["id"], "bold cyan"), (f"   treadle watch {run['id']}", "dim")
        )
    )
    print_warnings(console, run)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise fail(f"--metadata is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise fail("--metadata must be a JSON object")
    return value


@_run_command
def watch(client: ApiClient, run_id: str, as_json: bool, interactive: InputOpt = None) -> None:
    """Follow a run live: reasoning, streaming text, tools, plan, cost; answer its pauses."""
    raise typer.Exit(_watch(client, run_id, interactive, as_json))


def _waiting_on(client: ApiClient, run_id: str, kind: str) -> dict[str, Any]:
    """The run's pending question or approval (``kind``); a usage error if it waits on none."""
    run = client.run(run_id)
    pending = run.get("pending") or {}
    if run["status"] != "waiting" or pending.get("kind") != kind:
        what = "a question" if kind == "ask" else "an approval"
        raise fail(f"run {run_id} is {run['status']}, not waiting on {what}")
    return dict(pending)


def _prompt_console(as_json: bool) -> Console:
    """Where a prompt goes: stderr when stdout is the JSON a script reads."""
    return err_console if as_json else console


def _after(
    client: ApiClient, run: dict[str, Any], follow: bool, as_json: bool, interactive: bool | None
) -> None:
    if follow:
        raise typer.Exit(_watch(client, run["id"], interactive, as_json))
    _print_result(run, as_json)
    raise typer.Exit(EXIT_OK if run["status"] not in FINAL else exit_code(run))


@_run_command
def answer(
    client: ApiClient,
    run_id: str,
    as_json: bool,
    answers: Annotated[
        list[str] | None,
        typer.Option(
            "--answer",
            "-a",
            help="the answer to the next question, in order (repeat); an "
            "option's value or label, or free text",
        ),
    ] = None,
    follow: FollowOpt = False,
    interactive: InputOpt = None,
) -> None:
    """Answer the run's question: pick an option or type an answer."""
    pending = _waiting_on(client, run_id, "ask")
    given = [_option_value(pending, i, a) for i, a in enumerate(answers or [])]
    answered = given or ask_answers(_prompt_console(as_json), pending)
    _after(client, client.answer(run_id, pending["ask_id"], answered), follow, as_json, interactive)


def _option_value(pending: dict[str, Any], index: int, text: str) -> str:
    """A label typed on the command line counts as its option's value."""
    questions = pending.get("questions") or []
    options = questions[index].get("options") or [] if index < len(questions) else []
    return next((o["value"] for o in options if text in (o["label"], o["value"])), text)


@_run_command
def approve(
    client: ApiClient,
    run_id: str,
    as_json: bool,
    approve_all: Annotated[
        bool, typer.Option("--all", help="approve every write (but the --reject ones)")
    ] = False,
    approve_ids: Annotated[
        list[str] | None,
        typer.Option("--approve", help="approve this call id (repeat); the others are rejected"),
    ] = None,
    reject_ids: Annotated[
        list[str] | None,
        typer.Option(
            "--reject",
            help="reject this call id, or ID=MESSAGE: the model reads 'Declined by user: "
            "MESSAGE' (repeat); the others are approved",
        ),
    ] = None,
    edits: Annotated[
        list[str] | None,
        typer.Option(
            "--edit",
            help="approve this call with other arguments: ID='{json}' (checked against the "
            "tool's schema; repeat); counts as an --approve",
        ),
    ] = None,
    note: Annotated[str | None, typer.Option(help="a note for the model")] = None,
    follow: FollowOpt = False,
    interactive: InputOpt = None,
) -> None:
    """Approve, edit or reject the run's proposed writes (a checklist, or flags for scripts)."""
    pending = _waiting_on(client, run_id, "approval")
    ids = [i["call_id"] for i in pending.get("items") or []]
    if approve_all or approve_ids or reject_ids or edits:
        try:
            decided = flag_decisions(
                ids, approve_all, approve_ids or [], reject_ids or [], edits or []
            )
        except FlagError as exc:
            raise fail(str(exc)) from None
    else:
        decided = decide_approval(_prompt_console(as_json), pending)
    run = client.decide(run_id, pending["approval_id"], decided, note)
    _after(client, run, follow, as_json, interactive)


@_run_command
def cancel(client: ApiClient, run_id: str, as_json: bool) -> None:
    """Cancel a run that has not ended."""
    _print_result(client.cancel(run_id), as_json)


@_run_command
def resume(
    client: ApiClient,
    run_id: str,
    as_json: bool,
    model: Annotated[str | None, typer.Option(help="go on with this model profile instead")] = None,
    agent: Annotated[
        str | None,
        typer.Option(help="spec fields to override (a JSON object)", show_default=False),
    ] = None,
    watch: Annotated[bool, typer.Option("--watch", help="follow it live")] = False,
    interactive: InputOpt = None,
) -> None:
    """Take up a failed or cancelled run from its last checkpoint (same run id)."""
    overrides = _json_object(agent) if agent else {}
    if model:
        overrides["model"] = model
    run = client.resume(run_id, overrides or None)
    if watch:
        raise typer.Exit(_watch(client, run["id"], interactive, as_json))
    if as_json:
        _print_result(run, as_json)
    else:
        console.print(
            Text.assemble(
                "resumed ", (run["id"], "bold cyan"), (f"   treadle watch {run['id']}", "dim")
            )
        )


def _age(created: str) -> str:
    from datetime import UTC, datetime

    then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    secs = (datetime.now(UTC) - then).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs / size:.0f}{unit} ago"
    return f"{secs:.0f}s ago"


def runs_table(rows: list[dict[str, Any]]) -> Table:
    """Runs as a table: id, status, kind, model, round, tokens, cost, age."""
    table = Table(box=None, header_style="bold dim", pad_edge=False)
    for col in ("run", "status", "kind", "model", "round", "tokens in→out", "cost", "created"):
        table.add_column(col, justify="right" if col in ("round", "cost") else "left")
    for r in rows:
        u = r["usage"]
        table.add_row(
            r["id"],
            Text(r["status"], style=STATUS_STYLE.get(r["status"], "")),
            r["kind"],
            (r.get("metadata") or {}).get("agent") or model_name(r["agent"]),
            str(r["round"]),
            f"{u['input_tokens']}→{u['output_tokens']}",
            f"${u['cost']:.4f}",
            _age(r["created_at"]),
        )
    return table


@_run_command
def show(client: ApiClient, run_id: str, as_json: bool) -> None:
    """Show a run and its transcript."""
    run, msgs = client.run(run_id), client.messages(run_id)
    if as_json:
        print(json.dumps({"run": run, "messages": msgs}, ensure_ascii=False))
        return
    print_run(console, run)
    print_transcript(console, msgs)


def register(app: typer.Typer) -> None:
    for command in (submit, watch, answer, approve, cancel, resume, show):
        app.command()(command)
