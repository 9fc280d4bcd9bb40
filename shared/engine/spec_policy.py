"""What a submitted agent spec may reach when callers are tenants (auth required).

A spec names environment variables that workers read at call time (a model profile's
``api_key_env``, an HTTP tool's ``headers_env``, a webhook's ``secret_env``). Any name at all
would let a tenant send a worker's secrets (``TREADLE_DATABASE_URL``, the operator's provider
key) to a server of its choosing, so with auth required a submitted spec may only name the
variables ``TREADLE_SPEC_ENV_ALLOW`` lists (names or ``PREFIX*`` globs). An inline model
profile's ``base_url`` goes through the SSRF rules (``TREADLE_ALLOW_HOSTS`` to reach private
hosts), and so does an MCP server's ``url``. Registered agents and profiles come from the
operator and are not checked.

Every timeout, retry count and deadline a spec sets has an operator maximum
(``TREADLE_SPEC_MAX_*``): a value the spec sets above one is refused (422, naming the setting)
rather than quietly clamped, so the tenant learns what it will get; a default above one (a
profile's 600 s ``timeout_total`` under a 300 s maximum) is lowered to it. The spec model
itself refuses negative, non-finite and absurd values.

Test doubles (the ``scripted`` provider, whose replies may sleep or misbehave on request) are
refused in any submitted spec unless the operator turns them on (``TREADLE_ALLOW_TEST_MODELS``;
on by default in embedded mode only), whoever the caller is.

Whatever the auth mode, a submitted spec (a run's, or an agent created over the API) may not
start local processes: MCP servers over stdio (``command``) are for the operator's agents file.

The policy is the one in force when a run starts, not when its spec was saved: a run naming a
tenant's saved agent (or a spec whose tool agents name one) is checked with that agent's spec
(``scheduler.http.agents.resolve``), and a cron's fire checks its stored spec again (``police``;
a cron whose spec the policy now refuses is paused).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator

from shared.agent.spec import AgentSpec, InlineTool, ModelProfile, WebhookSpec
from shared.config import Settings
from shared.errors import Forbidden, SpecError, ToolError
from shared.llm.profiles import DEMO_PROFILE
from shared.tools.netguard import check_url

__all__ = [
    "SCHEMA_MAXIMA",
    "police",
    "check_profile_names",
    "check_spec_maxima",
    "check_submitted_spec",
    "check_test_models",
    "check_webhook_url",
    "nested_specs",
    "refuse_local_processes",
]


def nested_specs(spec: AgentSpec) -> Iterator[AgentSpec]:
    """The spec and every sub-agent spec in its tools, at any depth (registered ones are
    resolved into the spec at submit). Iterative: depth comes from the body, bounded only by
    the body guard."""
    stack = [spec]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(
            t.agent
            for t in reversed(current.tools)
            if isinstance(t, InlineTool) and isinstance(t.agent, AgentSpec)
        )
        stack.extend(h.agent for h in reversed(current.handoffs) if isinstance(h.agent, AgentSpec))


def _profiles(s: AgentSpec) -> Iterator[ModelProfile]:
    """The inline model profiles of one spec: its model's, its guardrails' checks'."""
    if isinstance(s.model, ModelProfile):
        yield s.model
    for g in (*s.input_guardrails, *s.output_guardrails):
        if g.model is not None and isinstance(g.model.model, ModelProfile):
            yield g.model.model


def _env_names(spec: AgentSpec) -> Iterator[str]:
    for s in nested_specs(spec):
        for p in _profiles(s):
            if p.api_key_env:
                yield p.api_key_env
        for tool in s.tools:
            if isinstance(tool, InlineTool) and tool.http is not None:
                yield from tool.http.headers_env.values()
        for server in s.mcp:
            yield from server.headers_env.values()


def _split(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def _check_env(settings: Settings, names: list[str]) -> None:
    allowed = _split(settings.spec_env_allow)
    refused = sorted({n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in allowed)})
    if refused:
        raise Forbidden(
            f"environment variable(s) {', '.join(refused)} may not be named by a "
            "submitted spec (TREADLE_SPEC_ENV_ALLOW)"
        )


def _check_base_urls(settings: Settings, spec: AgentSpec) -> None:
    hosts = _split(settings.allow_hosts)
    for s in nested_specs(spec):
        for profile in _profiles(s):
            if profile.provider != "openai" or not profile.base_url:
                continue
            try:
                check_url(profile.base_url, hosts)
            except ToolError as exc:
                raise Forbidden(f"model.base_url: {exc}") from None
        for server in s.mcp:
            if server.url is None:
                continue
            try:
                check_url(server.url, hosts)
            except ToolError as exc:
                raise Forbidden(f"mcp {server.name!r}: {exc}") from None


def _over(value: float | None, limit: float, where: str, setting: str) -> list[str]:
    if value is None or value <= limit:
        return []
    return [f"{where} = {value:g} is over the limit of {limit:g} ({setting})"]


_PROFILE_MAXIMA = (
    ("timeout_connect", "spec_max_model_timeout_s"),
    ("timeout_read", "spec_max_model_timeout_s"),
    ("timeout_total", "spec_max_model_timeout_s"),
    ("max_retries", "spec_max_model_retries"),
    ("max_continuations", "spec_max_continuations"),
    ("provider_wait_s", "provider_wait_max_s"),
)
SCHEMA_MAXIMA: tuple[tuple[str, str, str], ...] = (
    ("AgentSpec", "ask_timeout_s", "spec_max_ask_timeout_s"),
    ("AgentSpec", "provider_wait_s", "provider_wait_max_s"),
    ("Budget", "deadline_s", "spec_max_deadline_s"),
    ("HttpToolSpec", "timeout_s", "spec_max_tool_timeout_s"),
    *(("ModelProfile", field, setting) for field, setting in _PROFILE_MAXIMA),
)
"""(schema component, field, setting): every operator maximum a submitted spec meets, which
the OpenAPI document states as the field's ``maximum``."""


def _profile_maxima(settings: Settings, p: ModelProfile) -> list[str]:
    """Problems with the values ``p`` sets; defaults over a maximum are lowered to it."""
    out = []
    for field, setting in _PROFILE_MAXIMA:
        limit = getattr(settings, setting)
        if field not in p.model_fields_set:
            value = getattr(p, field)
            if value is not None:  # None: the default, which the engine bounds itself
                setattr(p, field, min(value, limit))
            continue
        out += _over(getattr(p, field), limit, f"model.{field}", f"TREADLE_{setting.upper()}")
    return out


def _spec_maxima(settings: Settings, s: AgentSpec) -> list[str]:
    out = _over(
        s.budget.deadline_s, settings.spec_max_deadline_s, "budget.deadline_s",
        "TREADLE_SPEC_MAX_DEADLINE_S",
    )  # fmt: skip
    out += _over(
        s.ask_timeout_s, settings.spec_max_ask_timeout_s, "ask_timeout_s",
        "TREADLE_SPEC_MAX_ASK_TIMEOUT_S",
    )  # fmt: skip
    out += _over(
        s.provider_wait_s, settings.provider_wait_max_s, "provider_wait_s",
        "TREADLE_PROVIDER_WAIT_MAX_S",
    )  # fmt: skip
    for p in _profiles(s):
        out += _profile_maxima(settings, p)
    for tool in s.tools:
        if isinstance(tool, InlineTool) and tool.http is not None:
            out += _over(
                tool.http.timeout_s, settings.spec_max_tool_timeout_s,
                f"tools[{tool.name}].http.timeout_s", "TREADLE_SPEC_MAX_TOOL_TIMEOUT_S",
            )  # fmt: skip
    return out


def check_spec_maxima(settings: Settings, spec: AgentSpec | str) -> None:
    """SpecError (422) when a submitted spec (sub-agents included) sets a timeout, retry count
    or deadline above the operator's maximum. A registered agent's name is not checked."""
    if not isinstance(spec, AgentSpec):
        return
    problems = [p for s in nested_specs(spec) for p in _spec_maxima(settings, s)]
    if problems:
        raise SpecError("; ".join(problems[:5]))


def check_profile_names(operator_names: Iterable[str], spec: AgentSpec | str) -> None:
    """SpecError (422) when an inline profile takes the name of an operator's profile: fleet
    limits and pauses of an operator's profile are shared by name, and a tenant must not
    reach them (nor look like them in logs and metrics)."""
    if not isinstance(spec, AgentSpec):
        return
    taken = {*operator_names, DEMO_PROFILE.name}
    for s in nested_specs(spec):
        for p in _profiles(s):
            if p.name in taken:
                raise SpecError(
                    f"model.name {p.name!r} is an operator's model profile: name it by "
                    "its name alone, or give the inline profile another name"
                )


def check_test_models(settings: Settings, spec: AgentSpec | str) -> None:
    """SpecError (422) when a submitted spec names a test-double model the operator has not
    allowed. A registered agent's name is the operator's: not checked."""
    if settings.test_models_allowed or not isinstance(spec, AgentSpec):
        return
    for s in nested_specs(spec):
        if any(p.provider == "scripted" for p in _profiles(s)):
            raise SpecError(
                "model.provider 'scripted' is a test double and is not enabled on this "
                "server (TREADLE_ALLOW_TEST_MODELS)"
            )


def check_webhook_url(settings: Settings, url: str) -> None:
    """Forbidden (403) for a tenant's webhook URL that the sender would refuse (SSRF rules,
    a host that does not resolve): better now than 24 hours of failed retries."""
    try:
        check_url(url, _split(settings.allow_hosts))
    except ToolError as exc:
        raise Forbidden(f"webhook.url: {exc}") from None


def refuse_local_processes(spec: AgentSpec | str) -> None:
    """Forbidden (403) for an MCP server with a ``command`` in a submitted spec: the schema
    has it, the policy keeps it for agents the operator registers (a registered agent's name
    is allowed)."""
    if not isinstance(spec, AgentSpec):
        return
    for s in nested_specs(spec):
        for server in s.mcp:
            if server.command is not None:
                raise Forbidden(
                    f"mcp {server.name!r}: stdio servers (`command`) are for agents the "
                    "operator registers (TREADLE_AGENTS_FILE), not for submitted specs"
                )


def check_submitted_spec(
    settings: Settings, spec: AgentSpec | str, webhook: WebhookSpec | None
) -> None:
    """Forbidden (403) when a tenant's spec names env vars it may not, a private model host,
    or a webhook URL the SSRF rules refuse.
    ``spec``: as submitted (a registered agent's name is the operator's: not checked)."""
    names = [webhook.secret_env] if webhook is not None and webhook.secret_env else []
    if webhook is not None:
        check_webhook_url(settings, webhook.url)
    if isinstance(spec, AgentSpec):
        names += list(_env_names(spec))
        _check_base_urls(settings, spec)
    _check_env(settings, names)


def police(
    settings: Settings,
    profiles: Iterable[str],
    submitted: AgentSpec | str,
    webhook: WebhookSpec | None = None,
    *,
    keyed: bool,
) -> None:
    """Every check above on a spec a tenant submitted (or saved): test models, the operator's
    maxima, operator profile names (422), local processes (403); for a tenant's key
    (``keyed``, not the keyless owner) env names, private hosts and webhook URLs (403)."""
    check_test_models(settings, submitted)
    check_spec_maxima(settings, submitted)
    check_profile_names(profiles, submitted)
    refuse_local_processes(submitted)
    if keyed:
        check_submitted_spec(settings, submitted, webhook)
