"""Model profiles: load them from a file, resolve a spec's ``model``, build the ``ChatModel``.

A profile file is TOML (``[profiles.NAME]`` tables) or YAML/JSON (``profiles: {NAME: {...}}``);
each entry becomes ``ModelProfile(name=NAME, ...)``, marked as the operator's. ``demo`` is
built in. HTTP clients are shared per base URL and per process (a forked worker never reuses
its parent's sockets), spread over pools of about ``POOL_SHARD`` connections; their
connections obey the caller's ``Abort`` (``shared.llm.abort``).
A profile that came inline in a tenant's spec gets a client whose connections go through the
SSRF guard and are pinned to the address it checked (``shared.tools.netguard``), so DNS
rebinding after the check at submit cannot turn it to a private address; an operator's
profile, and any profile of the keyless operator's own runs (tenant ``default``, auth off),
is trusted. Proxies from the environment are not used.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from shared.agent.spec import ModelProfile
from shared.config import DEFAULT_TENANT, get_settings
from shared.errors import ConfigError, FatalModelError
from shared.llm.abort import abortable_transport
from shared.llm.base import ChatModel
from shared.llm.openai_compat import OpenAICompatModel
from shared.llm.scripted import DemoModel, ScriptedModel
from shared.llm.tool_modes import ToolModes
from shared.tracing import traced_model

__all__ = [
    "DEMO_PROFILE",
    "close_http_clients",
    "http_client",
    "load_profiles",
    "make_model",
    "parse_profiles",
    "resolve_profile",
]

DEMO_PROFILE = ModelProfile(name="demo", provider="demo").as_operator()

# httpcore's pool scans all of its connections on every request and every response's end
# (and polls each idle one's socket): with hundreds of calls in flight through one pool that
# scan was two thirds of a worker's CPU (py-spy, 1,000 runs in flight). A process therefore
# spreads a base URL's calls over pools of about this many connections each.
POOL_SHARD = 32

_clients: dict[tuple[int, str, tuple[str, ...] | None], list[httpx.Client]] = {}
_clients_lock = threading.Lock()
_turns = itertools.count()


def _shards() -> int:
    """Pools per base URL: enough that each holds about ``POOL_SHARD`` of the worker's
    concurrent calls."""
    return max(1, math.ceil(get_settings().worker_concurrency / POOL_SHARD))


# No cap on connections (the worker's threads bound the calls in flight, so a pool never holds
# a model call back below ``-c``); each pool keeps twice its share of the calls alive.
_LIMITS = httpx.Limits(
    max_connections=None, max_keepalive_connections=2 * POOL_SHARD, keepalive_expiry=30.0
)


def _read_document(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read model profiles file {path}: {exc}") from exc
    try:
        if path.suffix.lower() == ".toml":
            return tomllib.loads(text)
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"model profiles file {path} is not valid: {exc}") from exc


def parse_profiles(document: Any, source: str = "profiles") -> dict[str, ModelProfile]:
    """``{"profiles": {NAME: {...}}}`` → ``{NAME: ModelProfile}`` (``ConfigError`` if bad)."""
    table = document.get("profiles") if isinstance(document, Mapping) else None
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: expected a `profiles` table of NAME → profile")
    profiles: dict[str, ModelProfile] = {}
    for name, fields in table.items():
        if not isinstance(fields, Mapping):
            raise ConfigError(f"{source}: profile {name!r} must be a table")
        try:
            profile = ModelProfile.model_validate({**fields, "name": str(name)})
            profiles[str(name)] = profile.as_operator()
        except ValidationError as exc:
            raise ConfigError(f"{source}: profile {name!r} is invalid: {exc}") from exc
    return profiles


def load_profiles(path: str | os.PathLike[str]) -> dict[str, ModelProfile]:
    """Load the model profiles in a TOML, YAML or JSON file."""
    file = Path(path)
    return parse_profiles(_read_document(file), str(file))


def resolve_profile(
    model: str | ModelProfile, profiles: Mapping[str, ModelProfile]
) -> ModelProfile:
    """A spec's ``model`` (a profile name, or an inline profile) → the profile to use."""
    if isinstance(model, ModelProfile):
        return model
    if model in profiles:
        return profiles[model]
    if model == DEMO_PROFILE.name:
        return DEMO_PROFILE
    known = ", ".join(sorted({*profiles, DEMO_PROFILE.name}))
    raise ConfigError(f"unknown model profile {model!r}; known profiles: {known}")


def http_client(base_url: str, guard: tuple[str, ...] | None = None) -> httpx.Client:
    """A shared, thread-safe ``httpx.Client`` for a base URL in this process: one of its
    ``_shards()`` pools, in turn. ``guard``: the SSRF allow-list for a tenant's endpoint
    (connections checked and pinned); None: trusted."""
    key = (os.getpid(), base_url.rstrip("/"), guard)
    with _clients_lock:
        shards = _clients.get(key)
        if shards is None or shards[0].is_closed:
            shards = _clients[key] = [_new_client(guard) for _ in range(_shards())]
        return shards[next(_turns) % len(shards)]


def _new_client(guard: tuple[str, ...] | None) -> httpx.Client:
    from shared.tools.netguard import GuardedBackend

    backend = None if guard is None else GuardedBackend(guard, refuse=FatalModelError)
    return httpx.Client(transport=abortable_transport(backend, limits=_LIMITS))


def _guard(profile: ModelProfile, tenant: str, allow_hosts: str | None) -> tuple[str, ...] | None:
    """The SSRF allow-list for a tenant's own endpoint; None for a trusted one."""
    if profile.operator or tenant == DEFAULT_TENANT:
        return None
    if allow_hosts is None:
        allow_hosts = get_settings().allow_hosts
    return tuple(h.strip() for h in allow_hosts.split(",") if h.strip())


def close_http_clients() -> None:
    """Close every shared client (worker shutdown, tests)."""
    with _clients_lock:
        clients = [c for shards in _clients.values() for c in shards]
        _clients.clear()
    for client in clients:
        client.close()


def make_model(
    profile: ModelProfile,
    tenant: str = DEFAULT_TENANT,
    allow_hosts: str | None = None,
    tool_modes: ToolModes | None = None,
) -> ChatModel:
    """The ``ChatModel`` for a profile: demo, scripted, or an OpenAI-compatible endpoint
    (each call a span when tracing is on). ``tenant``: whose run calls it (a tenant's inline
    endpoint is guarded and pinned); ``allow_hosts``: the SSRF allow-list setting (default:
    ``TREADLE_ALLOW_HOSTS``); ``tool_modes``: what ``tool_mode: auto`` learnt in this
    process (the runtime's; None: only this model remembers)."""
    return traced_model(_model(profile, tenant, allow_hosts, tool_modes), profile)


def _model(
    profile: ModelProfile, tenant: str, allow_hosts: str | None, tool_modes: ToolModes | None
) -> ChatModel:
    if profile.provider == "demo":
        return DemoModel()
    if profile.provider == "scripted":
        if not profile.replies:
            raise ConfigError(f"scripted model profile {profile.name!r} has no replies")
        return ScriptedModel(profile.replies, name=profile.name)
    if not profile.base_url:
        raise ConfigError(f"model profile {profile.name!r} has no base_url")
    guard = _guard(profile, tenant, allow_hosts)
    client = http_client(profile.base_url, guard)
    return OpenAICompatModel(
        profile, client=client, retry_after_cap=_retry_after_cap(), tool_modes=tool_modes
    )


def _retry_after_cap() -> float:
    return get_settings().retry_after_max_s
