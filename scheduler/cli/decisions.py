"""``treadle approve`` flags as per-item decisions (the API's ``decisions[]``).

``--approve ID`` / ``--all`` approve, ``--reject ID`` or ``--reject ID=MESSAGE`` reject (the
model reads ``Declined by user: MESSAGE``), ``--edit ID=JSON`` approves with other arguments
(the server checks them against the tool's schema). An edit counts as an ``--approve``: with
``--approve`` or ``--edit`` and no ``--all``, the items not named are rejected; otherwise they
are approved. Pure: no I/O, raises ``FlagError`` with the message to print.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

__all__ = ["FlagError", "flag_decisions", "split_flag"]


class FlagError(ValueError):
    """A flag that does not fit the pending approval (the CLI exits 2, sends nothing)."""


def split_flag(value: str, ids: Sequence[str], flag: str) -> tuple[str, str | None]:
    """``ID`` or ``ID=REST`` with ID one of the pending call ids (an id may contain ``=``: the
    longest pending id that prefixes the value wins)."""
    if value in ids:
        return value, None
    for call_id in sorted(ids, key=len, reverse=True):
        if value.startswith(f"{call_id}="):
            return call_id, value[len(call_id) + 1 :]
    name = value.split("=", 1)[0]
    raise FlagError(f"{flag}: unknown call id {name!r} (pending: {', '.join(ids)})")


def _edit(value: str, ids: Sequence[str]) -> tuple[str, dict[str, Any]]:
    call_id, text = split_flag(value, ids, "--edit")
    if text is None:
        raise FlagError(f"--edit {call_id}: give the arguments as {call_id}='{{...}}'")
    try:
        arguments = json.loads(text)
    except ValueError as exc:
        raise FlagError(f"--edit {call_id}: the arguments are not JSON ({exc})") from None
    if not isinstance(arguments, dict):
        raise FlagError(f"--edit {call_id}: the arguments must be a JSON object")
    return call_id, arguments


def flag_decisions(
    ids: Sequence[str],
    every: bool,
    approve: Sequence[str],
    reject: Sequence[str],
    edit: Sequence[str],
) -> list[dict[str, Any]]:
    """One decision per pending item, in the items' order."""
    yes = {split_flag(v, ids, "--approve")[0] for v in approve}
    if any(split_flag(v, ids, "--approve")[1] is not None for v in approve):
        raise FlagError("--approve takes a call id only (use --edit ID=JSON to change arguments)")
    no = dict(split_flag(v, ids, "--reject") for v in reject)
    edits = dict(_edit(v, ids) for v in edit)
    named: dict[str, list[str]] = {}
    for flag, chosen in (("--approve", yes), ("--reject", set(no)), ("--edit", set(edits))):
        for call_id in chosen:
            named.setdefault(call_id, []).append(flag)
    twice = sorted(f"{i} ({' and '.join(f)})" for i, f in named.items() if len(f) > 1)
    if twice:
        raise FlagError(f"one decision per call: {', '.join(twice)}")
    rest = "approve" if every or not (yes or edits) else "reject"
    out: list[dict[str, Any]] = []
    for call_id in ids:
        if call_id in edits:
            out.append({"call_id": call_id, "action": "edit", "arguments": edits[call_id]})
        elif call_id in no or (call_id not in yes and rest == "reject"):
            message = no.get(call_id)
            item: dict[str, Any] = {"call_id": call_id, "action": "reject"}
            if message:
                item["message"] = message
            out.append(item)
        else:
            out.append({"call_id": call_id, "action": "approve"})
    return out
