"""One external tool call: execute it and commit its result and the join in one transition
(``shared.engine.join.finish_call``).

A tool that is read-only and quick (in-process, no I/O) runs without a claim: duplicates of
its dispatch may run it twice, harmlessly, and only one commit wins (the call's status guards
it). Any other tool is claimed (its row goes ``running``, owned by this worker, whose
heartbeat keeps the lease; the attempt number fences a late commit): a read starts while its
claim commits (a duplicate read is harmless; a lost claim stops it and its result is dropped),
a write only once its claim has committed, so its effect is started by one worker at a time,
and sends ``Idempotency-Key: <run_id>:<call_id>`` so a retried effect after a crash is applied
once by a well-behaved API. A sub-agent call starts a child run
instead (``shared.engine.children``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from shared.agent.approval import edited_result
from shared.agent.arguments import ArgumentsError, parse_arguments
from shared.agent.attachments import attachment_refs
from shared.agent.compression import reduce_tool_result
from shared.agent.spec import AgentSpec
from shared.engine import children, metrics, subagent, toolkit
from shared.engine.attachments import run_files
from shared.engine.busy import when_free
from shared.engine.catalog import DEFER_S
from shared.engine.change import Finished, LostRace
from shared.engine.gate import Stage
from shared.engine.join import finish_call
from shared.engine.knowledge import Knowledge
from shared.engine.memory import RunMemory
from shared.engine.progress import progress_sink
from shared.engine.runtime import Dispatch, Runtime
from shared.engine.standby import Job
from shared.engine.transition import attempt
from shared.engine.tx import Tx
from shared.errors import Aborted, ToolError
from shared.llm.abort import Abort
from shared.store import ancestry
from shared.store import calls as call_store
from shared.store.db import reading
from shared.store.rows import Call, CallStatus, Run
from shared.store.write import tool_started
from shared.tools import InvalidToolArguments, Tool, ToolContext, ToolResult
from shared.tracing import tool_span
from shared.vocab import EventType

__all__ = ["execute_tool", "finished", "run_tool", "runs_in_round"]

log = logging.getLogger("treadle.tool")
STOP_GRACE_S = 2.0  # a stopped tool's thread gets this long to wind down


def run_tool(rt: Runtime, run_id: str, call_id: str, version: int) -> str:
    """stale | committed | lost | deferred."""
    with rt.heartbeat.working(f"{run_id}:{call_id}"):
        outcome = _run_tool(rt, run_id, call_id, version)
    if outcome == "stale":
        metrics.STALE.labels(reason="tool").inc()
    return outcome


def _run_tool(rt: Runtime, run_id: str, call_id: str, version: int) -> str:
    with reading(rt.engine) as conn:
        found = call_store.call_and_run(conn, run_id, call_id)
        if found is None:
            return "stale"
        run, call = found
        given = rt.caches.given(conn, run_id, run.spec_rev)
    if run.version != version or call.status not in (CallStatus.QUEUED, CallStatus.RUNNING):
        return "stale"
    spec = given.serving(run.loop)  # after a handoff, the serving agent's
    refs = attachment_refs(given.inputs)
    catalog = toolkit.catalog(rt, run_id, spec, refs, tenant=run.tenant, deadline=run.deadline_at)
    if catalog.deferred and call.name not in catalog.tools:
        return _come_back(rt, run, call)
    tool = catalog.tool(call.name)
    sub = children.sub_agent_of(spec, call.name)
    if sub is not None:
        return _start_child(rt, spec, sub, run, call)
    return _run_call(rt, spec, run, call, given.inputs, tool)


def _run_call(
    rt: Runtime,
    spec: AgentSpec,
    run: Run,
    call: Call,
    inputs: dict[str, Any] | None,
    tool: Tool | None,
) -> str:
    """A quick call runs unclaimed; a read starts while its claim commits; any other call
    is claimed, fenced, then run."""
    max_attempts = spec.max_attempts or rt.settings.max_attempts
    seconds = metrics.TOOL_SECONDS.labels(tool=call.name)
    if call.status == CallStatus.QUEUED and quick(tool):
        with seconds.time():
            result = execute_tool(rt, run, inputs, tool, call)
        return _commit(rt, spec, run, call, result, started=True)
    if _read_first(tool, call, max_attempts):
        with seconds.time():
            done = _claim_while_running(rt, run, inputs, tool, call)
        return "stale" if done is None else _commit(rt, spec, run, *done)
    claimed = _claim(rt, run, call)
    if claimed is None:
        return "stale"
    if claimed.attempts > max_attempts:  # L-12
        return _commit(rt, spec, run, claimed, ToolResult(text=_never_finished(claimed)))
    if not _still_held(rt, claimed, tool):
        return "stale"
    with seconds.time():
        result = execute_tool(rt, run, inputs, tool, claimed)
    return _commit(rt, spec, run, claimed, result)


def _start_child(rt: Runtime, spec: AgentSpec, sub: AgentSpec, run: Run, call: Call) -> str:
    """A sub-agent call: claimed, then its child run starts (``shared.engine.subagent``)."""
    claimed = _claim(rt, run, call)
    if claimed is None:
        return "stale"
    if claimed.attempts > (spec.max_attempts or rt.settings.max_attempts):  # L-12
        return _commit(rt, spec, run, claimed, ToolResult(text=_never_finished(claimed)))
    if _too_deep(rt, run):
        text = f"Tool error: sub-agents nest at most {ancestry.MAX_DEPTH} levels deep"
        return _commit(rt, spec, run, claimed, ToolResult(text=text))
    return subagent.start(rt, spec, sub, run, claimed)


def _come_back(rt: Runtime, run: Run, call: Call) -> str:
    """The call's tool may be one of an MCP server's that is still listing, and this lookup
    did not wait for it (its tenant's threads already wait): the call is sent again in
    ``DEFER_S`` s, holding no thread meanwhile, as a round does (its row is unchanged; were
    the message lost, the reaper sends it again)."""
    rt.publish([Dispatch.tool(run.id, call.call_id, run.version, run.priority, DEFER_S)])
    log.info("call %s of %s: an MCP listing in flight; again shortly", call.call_id, run.id)
    return "deferred"


def _never_finished(call: Call) -> str:
    """A call whose attempts ran out (each one's worker crashed or was lost): the model is
    told, as for any tool failure (L-5), instead of the call being tried forever (L-12)."""
    tries = call.attempts - 1
    return (
        f"Tool error: {call.name} was attempted {tries} times and never finished "
        "(its worker crashed or was lost each time); it was not run again"
    )


def _still_held(rt: Runtime, call: Call, tool: Tool | None) -> bool:
    """Fencing before an effect: a write starts only while this worker still holds the
    call's lease at its attempt (a worker paused or cut off after its claim may have lost
    it to another; its late commit would be refused, but its effect would not be undone)."""
    if tool is not None and tool.read_only:
        return True
    hb = rt.heartbeat
    if not hb.fresh():  # paused or cut off: beat first, then look
        engine = rt.engine
        if not hb.beat(engine):
            return False
    with reading(rt.engine) as conn:
        held = call_store.holds_call(conn, call.run_id, call.call_id, hb.owner(), call.attempts)
    if not held:
        log.info("call %s of %s was taken over; not started here", call.call_id, call.run_id)
    return held


def quick(tool: Tool | None) -> bool:
    """A read-only tool that runs in-process in well under a second, without I/O: it needs no
    claim (a duplicate run is harmless), and a round whose calls are all quick runs them
    itself (``shared.engine.round``)."""
    return tool is not None and tool.read_only and bool(getattr(tool, "quick", False))


def runs_in_round(rt: Runtime, tools: list[Tool | None]) -> bool:
    """A batch the round's own task may run before its commit: quick tools only, or one
    read-only tool when the operator opted in (``worker_read_tools_in_round``; one only: the
    fan-out runs a batch's I/O side by side, the round would run it in turn). A duplicate
    run of a read is harmless, so it needs no claim of its own."""
    if all(quick(t) for t in tools):
        return True
    read = len(tools) == 1 and tools[0] is not None and tools[0].read_only
    return read and rt.settings.worker_read_tools_in_round


def _read_first(tool: Tool | None, call: Call, max_attempts: int) -> bool:
    """A read-only call, queued, whose claim leaves it within its attempts: it may start
    before its claim commits (``_claim_while_running``)."""
    if tool is None or not tool.read_only or call.status != CallStatus.QUEUED:
        return False
    return call.attempts + 1 <= max_attempts


def _claim_while_running(
    rt: Runtime, run: Run, inputs: dict[str, Any] | None, tool: Tool | None, call: Call
) -> tuple[Call, ToolResult] | None:
    """A read starts in a kept thread, and this task claims its call meanwhile: the claim's
    transaction is off the round's critical path. Starting a read before its claim is safe:
    a duplicate read is harmless, and a claim that loses (another worker holds the call, or
    the run moved on) stops the read and its result is dropped. The claim still counts the
    attempt and writes ``tool.started`` as it does for any other call. None: lost."""
    prepared = _prepare(rt, run, inputs, tool, call)
    if isinstance(prepared, ToolResult):  # nothing to run (unknown tool, bad arguments)
        claimed = _claim(rt, run, call)
        return None if claimed is None else (claimed, prepared)
    fn, abort = prepared
    with tool_span(call.name, call.call_id), rt.stopper.holding(run.id, abort, rt.live):
        job = rt.tool_threads.submit(lambda: _run(fn))
        try:
            claimed = _claim(rt, run, call)
        except BaseException:
            abort.cancel("the tool call's claim failed")
            raise
        if claimed is None:
            abort.cancel("the tool call was taken by another worker")
            return None
        with rt.gate.outside(Stage.TOOL):
            return claimed, _waited(job, rt.settings.tool_timeout, abort)


def _too_deep(rt: Runtime, run: Run) -> bool:
    if run.parent_run_id is None:
        return False
    with reading(rt.engine) as conn:
        return subagent.too_deep(conn, run.id)


def _claim(rt: Runtime, run: Run, call: Call) -> Call | None:
    """Claim the call and write ``tool.started`` in one transaction."""
    hb = rt.heartbeat
    owner = hb.owner()

    def op(tx: Tx) -> Call | None:
        found = tx.rt.store.claim_call(tx.conn, run, call, owner, tx.ts, hb.live_after(tx.ts))
        if found is None:  # taken by another, or the run moved on: nothing of it stays
            raise LostRace(run.id)
        new, claimed = found
        if call.status == CallStatus.RUNNING:  # its worker died holding it
            metrics.TAKEOVERS.labels(what="tool").inc()
        tx.recorded(new, EventType.TOOL_STARTED, tool_started(claimed))
        return claimed

    return attempt(rt, op)


def execute_tool(
    rt: Runtime, run: Run, inputs: dict[str, Any] | None, tool: Tool | None, call: Call
) -> ToolResult:
    """Run the tool; any failure becomes its result text (L-5)."""
    prepared = _prepare(rt, run, inputs, tool, call)
    if isinstance(prepared, ToolResult):
        return prepared
    fn, abort = prepared
    with tool_span(call.name, call.call_id):
        if quick(tool):
            return _run(fn)
        with rt.gate.outside(Stage.TOOL), rt.stopper.holding(run.id, abort, rt.live):
            return _with_timeout(rt, fn, rt.settings.tool_timeout, abort)


def _prepare(
    rt: Runtime, run: Run, inputs: dict[str, Any] | None, tool: Tool | None, call: Call
) -> tuple[Callable[[], ToolResult], Abort] | ToolResult:
    """The call ready to run, and what stops it; or its result when there is nothing to run
    (an unknown tool, arguments that do not parse)."""
    if tool is None:
        return ToolResult(text=f"Tool not found: {call.name}")
    refs = attachment_refs(inputs)
    abort = Abort(run.deadline_at)  # cancelled at the timeout, or when the run is cancelled
    ctx = ToolContext(
        run_id=run.id,
        call_id=call.call_id,
        tenant=run.tenant,
        deadline=run.deadline_at,
        abort=abort,
        allow_hosts=tuple(h.strip() for h in rt.settings.allow_hosts.split(",") if h.strip()),
        attachments=refs,
        files=run_files(rt, run.tenant, inputs) if refs else None,
        knowledge=Knowledge(rt, run.tenant),
        memory=RunMemory(rt, run),
        confinement=rt.confinement,
        http=rt.http_pools,
        on_progress=progress_sink(rt, run.id, call),
        texts=rt.caches.texts,
    )
    try:  # strict JSON first: json5 is pure Python (~100 ms for 500 characters)
        args = parse_arguments(call.arguments or "{}")
    except ArgumentsError as exc:
        return ToolResult(text=f"Invalid arguments for {call.name}: {exc}")
    return (lambda: tool.execute(args, ctx)), abort


def _run(fn: Any) -> ToolResult:
    try:
        result: ToolResult = fn()
    except Exception as exc:  # tool failure is data (L-5)
        return ToolResult(text=_error_text(exc))
    return result


def _with_timeout(rt: Runtime, fn: Any, timeout: float, abort: Abort) -> ToolResult:
    """Run ``fn`` in one of the process's kept threads (in this context: its spans join the
    tool's; ``shared.engine.standby``); after ``timeout`` fire ``abort`` (the tool stops:
    sockets shut, child processes killed) and give it a moment to wind down; failures become
    results."""
    return _waited(rt.tool_threads.submit(lambda: _run(fn)), timeout, abort)


def _waited(job: Job[ToolResult], timeout: float, abort: Abort) -> ToolResult:
    """The result of a tool call running in a kept thread; ``abort`` fired after
    ``timeout``."""
    if not job.wait(timeout):
        abort.cancel(f"timed out after {timeout:g}s")
        if not job.wait(STOP_GRACE_S):
            return ToolResult(text=f"Tool error: timed out after {timeout:g}s")
    if job.result is None:  # the thread died of something no tool should raise
        return ToolResult(text="Tool error: the tool stopped without a result")
    return job.result


def _error_text(exc: Exception) -> str:
    if isinstance(exc, InvalidToolArguments):
        return str(exc)  # the validation message as is (L-5)
    if not isinstance(exc, ToolError | Aborted):
        log.warning("tool raised %s", type(exc).__name__, exc_info=exc)
    return f"Tool error: {exc}" if str(exc) else f"Tool error: {type(exc).__name__}"


def finished(
    rt: Runtime, spec: AgentSpec, run_id: str, call: Call, result: ToolResult, *, started: bool
) -> Finished:
    """What ``finish_call`` records of a tool's result: the text, what the model reads of it,
    and (``started``: the call ran unclaimed) its ``tool.started`` event."""
    for_model = reduce_tool_result(result.text, toolkit.result_budget(rt, run_id, spec))
    if ((call.data or {}).get("decision") or {}).get("action") == "edit":
        for_model = edited_result(call.arguments, for_model)  # what ran, then what came back
    return Finished(
        text=result.text,
        for_model=for_model,
        cost=result.cost,
        data=result.data,
        stop=result.stop,
        started={"call_id": call.call_id, "name": call.name, "round": call.round, "attempt": 1}
        if started
        else None,
    )


def _commit(
    rt: Runtime,
    spec: AgentSpec,
    run: Run,
    call: Call,
    result: ToolResult,
    *,
    started: bool = False,
) -> str:
    """The result and the join, in one transition. ``started``: the call ran unclaimed (its
    ``tool.started`` event goes with the result)."""
    done = finished(rt, spec, run.id, call, result, started=started)
    claimed = call.status == CallStatus.RUNNING

    def op(tx: Tx) -> Run:
        # the join may end or pause the run: its thread and lineage are locked first
        tx.prepare(run, ending=True, tells_parent=True)
        return finish_call(
            tx,
            run,
            call,
            done,
            from_status=[CallStatus.RUNNING] if claimed else [CallStatus.QUEUED],
            attempts=call.attempts if claimed else None,
            ask_timeout_s=spec.ask_timeout_s,
        )

    done_ = when_free(lambda: attempt(rt, op), f"tool {call.call_id} of {run.id}")
    return "committed" if done_ is not None else "lost"
