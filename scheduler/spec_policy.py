"""What a submitted agent spec may reach when callers are tenants (auth required; issue #11).

A spec names environment variables that workers read at call time (a model profile's
``api_key_env``, an HTTP tool's ``headers_env``, a webhook's ``secret_env``). Any name at all
would let a tenant send a worker's secrets (``TREADLE_DATABASE_URL``, the operator's provider
key) to a server of its choosing, so with auth required a submitted spec may only name the
variables ``TREADLE_SPEC_ENV_ALLOW`` lists (names or ``PREFIX*`` globs). An inline model
profile's ``base_url`` goes through the SSRF rules (``TREADLE_ALLOW_HOSTS`` to reach private
hosts). Registered agents and profiles come from the operator and are not checked.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator

from shared.agent.spec import AgentSpec, InlineTool, ModelProfile, WebhookSpec
from shared.config import Settings
from shared.errors import SpecError, ToolError
from shared.tools.netguard import check_url

__all__ = ["check_submitted_spec"]


def _specs(spec: AgentSpec) -> Iterator[AgentSpec]:
    """The spec and every inline sub-agent spec in its tools (named ones are registered)."""
    yield spec
    for tool in spec.tools:
        if isinstance(tool, InlineTool) and isinstance(tool.agent, AgentSpec):
            yield from _specs(tool.agent)


def _env_names(spec: AgentSpec) -> Iterator[str]:
    for s in _specs(spec):
        if isinstance(s.model, ModelProfile) and s.model.api_key_env:
            yield s.model.api_key_env
        for tool in s.tools:
            if isinstance(tool, InlineTool) and tool.http is not None:
                yield from tool.http.headers_env.values()


def _split(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def _check_env(settings: Settings, names: list[str]) -> None:
    allowed = _split(settings.spec_env_allow)
    refused = sorted({n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in allowed)})
    if refused:
        raise SpecError(f"environment variable(s) {', '.join(refused)} may not be named by a "
                        "submitted spec (TREADLE_SPEC_ENV_ALLOW)")


def _check_base_urls(settings: Settings, spec: AgentSpec) -> None:
    hosts = _split(settings.allow_hosts)
    for s in _specs(spec):
        profile = s.model
        if isinstance(profile, ModelProfile) and profile.provider == "openai" and profile.base_url:
            try:
                check_url(profile.base_url, hosts)
            except ToolError as exc:
                raise SpecError(f"model.base_url: {exc}") from None


def check_submitted_spec(
    settings: Settings, spec: AgentSpec | str, webhook: WebhookSpec | None
) -> None:
    """SpecError (422) when a tenant's spec names env vars it may not, or a private model host.
    ``spec``: as submitted (a registered agent's name is the operator's: not checked)."""
    names = [webhook.secret_env] if webhook is not None and webhook.secret_env else []
    if isinstance(spec, AgentSpec):
        names += list(_env_names(spec))
        _check_base_urls(settings, spec)
    _check_env(settings, names)
