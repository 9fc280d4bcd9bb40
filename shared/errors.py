"""One error tree for treadle.

    TreadleError
    ├── ConfigError            bad settings, unknown model profile
    ├── SpecError              an agent spec or request that cannot run
    │   └── TooLarge              a value over a size limit (413)
    ├── NotFound               a run, thread, file... that does not exist (for this tenant)
    ├── Conflict               a state that forbids the operation (409)
    │   └── QuotaExceeded         a tenant's limit on stored things reached (409)
    ├── Unauthorized           missing or invalid credentials (401)
    ├── Forbidden              the caller may not do or reach this (403)
    ├── ModelError             a model call failed
    │   ├── TransientModelError   429, 5xx, timeouts, broken streams: retry with backoff
    │   │   └── BrokenStream          a stream cut after it began (billed: ``usage``)
    │   └── FatalModelError       other 4xx, bad responses: fail the run
    │       └── ToolsRejected     HTTP 400 to a request that carried tools (M-6)
    ├── ToolError              a tool failed (becomes the tool's result, SPEC L-5)
    │   └── BlockedAddress        the SSRF guard refused an address (never worth a retry)
    └── Aborted                a blocking call stopped by its ``Abort`` handle
        ├── DeadlineExceeded      the deadline it was given passed (the run's, a tool's)
        └── CallCancelled         ``cancel()``: the run was cancelled, the tool timed out

Exceptions that cross Celery must pickle: each keeps its constructor arguments in ``args``.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Aborted",
    "BlockedAddress",
    "BrokenStream",
    "CallCancelled",
    "ConfigError",
    "Conflict",
    "DeadlineExceeded",
    "FatalModelError",
    "Forbidden",
    "ModelError",
    "NotFound",
    "QuotaExceeded",
    "SpecError",
    "ToolError",
    "TooLarge",
    "ToolsRejected",
    "TransientModelError",
    "TreadleError",
    "Unauthorized",
]


class TreadleError(Exception):
    """Root of every error treadle raises on purpose."""

    code = "error"

    def __init__(self, message: str = "", *args: object) -> None:
        super().__init__(message, *args)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(TreadleError):
    code = "config_error"


class SpecError(TreadleError):
    code = "invalid_spec"


class TooLarge(SpecError):
    """A value over a size limit (a memory item's value, ...): 413, nothing written."""

    code = "too_large"


class NotFound(TreadleError):
    code = "not_found"


class Conflict(TreadleError):
    code = "conflict"


class QuotaExceeded(Conflict):
    """A tenant has as many of something stored as it may (memory items, crons, agents, an
    agent's versions: an operator setting each, named in the message): 409."""

    code = "quota_exceeded"


class Unauthorized(TreadleError):
    code = "unauthorized"


class Forbidden(TreadleError):
    """Allowed to others, not to this caller: e.g. a tenant's spec naming a secret."""

    code = "forbidden"


class ModelError(TreadleError):
    """A model call failed. ``status`` is the HTTP status when there was one."""

    code = "model_error"

    def __init__(
        self, message: str = "", status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status, retry_after)
        self.status = status
        self.retry_after = retry_after


class TransientModelError(ModelError):
    code = "model_transient"


class BrokenStream(TransientModelError):
    """A stream that began and ended without ``[DONE]`` or a ``finish_reason``: the
    connection closed, or broke, mid-reply (M-2). Never an answer; retried like any transient
    error. ``usage``: the partial call as the provider bills it, estimated (a ``Usage`` as a
    dict: what was sent, what had streamed)."""

    code = "model_broken_stream"

    def __init__(self, message: str = "", usage: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.args = (message, usage)
        self.usage = usage


class FatalModelError(ModelError):
    code = "model_fatal"


class ToolsRejected(FatalModelError):
    """HTTP 400 to a request that carried tools (M-6). ``about_tools``: the 400 says the
    endpoint does not take tools; only then does ``tool_mode: auto`` switch the profile to
    prompt mode (M-7)."""

    code = "tools_rejected"

    def __init__(
        self, message: str = "", status: int | None = None, about_tools: bool = False
    ) -> None:
        super().__init__(message, status)
        self.args = (message, status, about_tools)
        self.about_tools = about_tools


class ToolError(TreadleError):
    code = "tool_error"


class BlockedAddress(ToolError):
    """A URL whose host is (or resolves to) an address the SSRF rules refuse: the same
    request would be refused again, so it is not retried (a webhook fails at once)."""

    code = "blocked_url"


class Aborted(TreadleError):
    """A model call or tool stopped from outside (``shared.llm.abort``): not the provider's or
    the tool's fault, so neither retried nor reported as a model error."""

    code = "aborted"


class DeadlineExceeded(Aborted):
    code = "deadline_exceeded"


class CallCancelled(Aborted):
    code = "cancelled"
