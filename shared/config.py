"""Settings from the environment (``TREADLE_*``), with embedded-mode defaults.

With no variables set, treadle runs embedded: SQLite under ``./.treadle/`` and the in-process
``memory://`` broker.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal
from zoneinfo import ZoneInfo

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.agent.spec import MAX_ATTEMPTS_CAP

__all__ = ["DEFAULT_TENANT", "Settings", "get_settings", "reset_settings"]

# The tenant of every request when auth is off: the operator's own, keyless use (embedded
# mode). A reserved name: no API key is made for it, so no tenant's run ever carries it.
DEFAULT_TENANT = "default"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TREADLE_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///./.treadle/treadle.db",
        description="SQLAlchemy URL. PostgreSQL: postgresql+psycopg://user@host/db",
    )
    broker_url: str = Field(
        default="memory://", description="Celery broker. memory:// = embedded (one process)"
    )
    broker_prefix: str = Field(
        default="", description="Key prefix on a shared Redis broker (kombu global_keyprefix)"
    )
    redis_url: str | None = Field(
        default=None,
        description="Redis for live deltas and fleet limits (defaults to the broker if redis)",
    )
    profiles_file: str | None = Field(default=None, description="TOML/YAML model profiles")
    api_host: str = Field(default="127.0.0.1", description="API bind address")
    api_port: int = Field(default=8000, description="API port")
    lease_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A worker holds its rounds and tools while its heartbeat (every third of "
        "this) is fresh; a killed worker's work is taken over this long after its last beat",
    )
    redrive_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A dispatch nobody took is re-sent this long after it went out, once it "
        "is known lost (its queue is empty, or a dispatch sent after it was taken); one still "
        "waiting in its queue is never re-sent (a backlog is not a loss)",
    )
    reaper_interval: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between reaper scans (a few indexed queries and a queue-depth "
        "read, on the reaper's own queue)",
    )
    retention_days: float = Field(
        default=0.0,
        ge=0,
        description="Ended runs older than this are deleted with every row of them by the "
        "reaper, in small batches (0 = keep forever; a run's own ttl_s applies regardless)",
    )
    visibility_timeout: int = Field(
        default=3600, description="Redis broker visibility timeout (the reaper re-drives first)"
    )
    worker_concurrency: int = Field(default=16, description="Threads per worker process")
    worker_in_place_s: float = Field(
        default=0.0,
        ge=0,
        le=3600,
        description="Opt-in. A task whose commit makes its run's next round due at once (quick "
        "tools, a tool batch's join) drives that round itself, without the broker, for this "
        "long. Off (0) by default: every round is its own Celery task, on its queue, retried "
        "by Celery and visible in Flower; on saves one broker hop per such round (~8 % of a "
        "tool round on the HTTP path) at the price of rounds that are never their own task",
    )
    worker_read_tools_in_round: bool = Field(
        default=False,
        description="Opt-in. A round whose reply calls one read-only tool (an HTTP GET, an "
        "MCP read, a search) runs it in the round's own task, under the same timeout, and "
        "commits its result with the round: a tool round is one task, one hop and two "
        "commits instead of a round task and a tool task with four. Off by default: every "
        "external call is its own treadle.tool task (claimed, counted, visible in Flower); "
        "on, such a call's tool.started and tool.finished are written together when it ends, "
        "it is not its own task, and a worker killed during it loses the round's uncommitted "
        "model reply (the round runs again, model call included)",
    )
    worker_engine_slots: int = Field(
        default=4,
        ge=0,
        le=1024,
        description="Threads of a worker process that run engine code at once; the others "
        "wait in line, a round's later stages first (model calls and tools run outside; "
        "0 = no gate). See shared/engine/gate.py",
    )
    db_pool_size: int = Field(
        default=0,
        description="Database connections per process (0 = what the process's threads can use "
        "at once: 2 x worker_engine_slots + 4, at most worker concurrency + 4; with no engine "
        "gate, worker concurrency + 4). Model calls and tools hold no connection",
    )
    db_lock_timeout: float = Field(
        default=5.0,
        ge=0,
        description="PostgreSQL lock_timeout: a statement waits this long for a row lock, "
        "then gives up (the work is re-driven later); 0 = wait forever",
    )
    db_statement_timeout: float = Field(
        default=30.0, ge=0, description="PostgreSQL statement_timeout (0 = none)"
    )
    db_idle_in_transaction_timeout: float = Field(
        default=10.0,
        ge=0,
        description="PostgreSQL idle_in_transaction_session_timeout: a session paused or cut "
        "off inside a transaction is ended and its locks freed (0 = never). treadle holds no "
        "transaction across a model call, a tool or an HTTP request",
    )
    db_keepalives_idle: int = Field(
        default=10,
        ge=0,
        description="TCP keepalives to PostgreSQL: first probe after this many idle seconds "
        "(0 = the kernel's defaults)",
    )
    db_keepalives_interval: int = Field(default=5, ge=1, description="Seconds between probes")
    db_keepalives_count: int = Field(
        default=3, ge=1, description="Unanswered probes before the connection is dropped"
    )
    limiter_on_failure: Literal["open", "closed"] = Field(
        default="open",
        description="The Redis-backed limiters unreachable (submissions per minute, a "
        "profile's fleet-wide limits): open = proceed unlimited (a warning is logged); "
        "closed = submissions get 503 with Retry-After, rounds wait and try again",
    )
    tool_timeout: float = Field(default=120.0, description="Default wall limit of one tool call")
    model_max_retries: int = Field(default=4, description="Transient model errors retried")
    timezone: str = Field(
        default="UTC",
        description="The operator's time zone: the days and calendar months spend envelopes "
        "count in (an IANA name)",
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        le=MAX_ATTEMPTS_CAP,
        description="Attempts of one round or tool call (a crash, an error) before the run "
        "fails with the cause (L-12); an agent's max_attempts overrides it",
    )
    provider_wait_max_s: float = Field(
        default=86400.0,
        ge=0,
        description="The most a run may wait out a provider outage (provider_wait_s): a spec "
        "asking more is refused, a profile's default is cut to it",
    )
    provider_retry_s: float = Field(
        default=5.0,
        gt=0,
        description="A run waiting out a provider outage is tried again after this, doubled "
        "each time up to 60 times it",
    )
    allow_hosts: str = Field(
        default="", description="Comma-separated hosts http tools may reach despite SSRF rules"
    )
    mcp_tools_ttl: float = Field(
        default=300.0, gt=0, description="MCP servers' tool lists are cached this many seconds"
    )
    mcp_max_bytes: int = Field(
        default=1_000_000, ge=1024, description="Largest MCP response (one HTTP body or SSE event)"
    )
    mcp_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Wall limit of one MCP exchange (a listing, a call), whatever a spec's "
        "timeout_s says; the run's deadline shortens it",
    )
    mcp_list_wait_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        description="The longest a round waits for an MCP server's tool list; past it the "
        "round goes on without those tools (the model is told, a tool.unavailable event), the "
        "listing ends in the background",
    )
    mcp_list_max_bytes: int = Field(
        default=256_000,
        ge=1024,
        description="Names, descriptions and schemas kept of one MCP server's tool list (the "
        "rest is left out, with a warning); its tools count against TREADLE_MAX_TOOLS too",
    )
    mcp_cache_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=0,
        description="Per process: MCP tool lists cached, across all servers, at most (an "
        "estimate; the least recently used go first)",
    )
    mcp_tenant_waiters: int = Field(
        default=2,
        ge=0,
        le=1024,
        description="Per process: threads of one tenant that wait for MCP listings at once "
        "(more go on without the tools at once): a slow server holds few of a worker's threads",
    )
    log_level: str = Field(default="INFO", description="Logging level")
    log_format: str = Field(default="text", description="text, or json (one object a line)")
    task_events: bool = Field(
        default=False,
        description="Celery task events from the start (Flower also switches them on itself)",
    )
    worker_metrics_port: int = Field(
        default=0, description="Serve a worker's /metrics on this port (0 = off)"
    )
    webhook_url: str | None = Field(
        default=None, description="Default webhook of runs submitted without one (default tenant)"
    )
    webhook_secret_env: str | None = Field(
        default=None, description="Env var holding the default webhook's secret (whsec_...)"
    )
    webhook_timeout: float = Field(default=10.0, description="Wall limit of one webhook POST")
    webhook_retry_base: float = Field(
        default=5.0, description="First webhook retry delay; x3 each time, at most 4 h apart"
    )
    webhook_retry_for: float = Field(
        default=86400.0, description="A webhook delivery is retried for this long, then failed"
    )
    plugins: str = Field(
        default="", description="Comma-separated modules imported at start (tools, handlers)"
    )
    files_dir: str = Field(
        default="", description="Directory for uploaded files; empty = in the database"
    )
    files_max_bytes: int = Field(default=20 * 1024 * 1024, description="Upload size limit")
    sandbox_timeout: float = Field(
        default=30.0, description="run_python: wall limit (also its CPU-seconds limit)"
    )
    sandbox_memory_mb: int = Field(default=512, description="run_python: address-space limit")
    sandbox_python: str = Field(
        default="", description="run_python: interpreter in the sandbox (default: found in /usr)"
    )
    sandbox_cgroups: Literal["required", "off"] = Field(
        default="required",
        description="run_python: each sandbox in its own cgroup under the worker's group "
        "(required: without cgroups run_python is unavailable, never limited per process "
        "only); off: per-process limits alone (a single-tenant machine)",
    )
    sandbox_cgroup: str = Field(
        default="treadle",
        pattern=r"^[A-Za-z0-9_.-]{1,64}(/[A-Za-z0-9_.-]{1,64}){0,7}$",
        description="The cgroup (under each hierarchy's root) where workers make theirs, "
        "worker-<host>-<pid>, one child group per sandbox or PDF reader in it",
    )
    sandbox_group_memory_mb: int = Field(
        default=2048,
        ge=64,
        description="Per worker process: memory of all its sandboxes and PDF readers together "
        "(its cgroup's limit; past it the kernel kills one of them)",
    )
    sandbox_max_processes: int = Field(
        default=32,
        ge=4,
        le=4096,
        description="run_python: processes of one sandbox, its own four included (pids.max)",
    )
    sandbox_cpus: float = Field(
        default=1.0, ge=0, le=256, description="run_python: CPUs of one sandbox (0 = no quota)"
    )
    sandbox_slots: int = Field(
        default=4,
        ge=0,
        le=1024,
        description="Per worker process: sandboxes and PDF readers running at once; more wait "
        "in line, served tenant by tenant in turn (0 = no limit)",
    )
    extract_cpu_seconds: float = Field(
        default=5.0, gt=0, description="CPU seconds of parsing one document (PDF, a child process)"
    )
    extract_memory_mb: int = Field(default=1024, ge=64, description="Memory of that child")
    extract_max_pages: int = Field(default=1000, ge=1, description="PDF pages read, at most")
    extract_max_chars: int = Field(
        default=1_000_000, ge=1, description="Characters of text taken from one PDF"
    )
    dataset_max_chunks: int = Field(
        default=1000, ge=1, description="Chunks one dataset document may have (else refused)"
    )
    # --- security and limits ------------------------------------------------------------
    auth: Literal["", "required", "off"] = Field(
        default="",
        description="API keys: required | off (every request is tenant 'default', all scopes). "
        "Empty: off only when the broker is memory:// and the API binds to loopback",
    )
    metrics_public: bool = Field(
        default=True, description="/metrics open to scrapers; false: an admin key is required"
    )
    max_input_chars: int = Field(default=200_000, description="Run input length limit")
    max_tools: int = Field(default=64, description="Tools in one agent spec, at most")
    max_runs_in_flight: int = Field(
        default=10_000, description="Per tenant: queued + running + waiting runs (0 = no limit)"
    )
    tenant_active_runs: int = Field(
        default=0,
        ge=0,
        description="Per tenant, a hard cap an operator may set: top-level runs admitted to "
        "the broker at once (queued or running); more wait in the database, admitted as "
        "others end, highest priority first. 0 (the default) = no cap: a lone tenant gets "
        "the whole fleet",
    )
    submits_per_minute: int = Field(
        default=6000,
        description="Run submissions per API key per minute (0 = no limit); a cron's fires "
        "count against its tenant's",
    )
    # quotas on what a tenant stores and schedules (409 quota_exceeded past them; 0 = none)
    max_crons: int = Field(default=100, ge=0, description="Per tenant: crons, at most")
    cron_min_interval_s: float = Field(
        default=60.0,
        ge=60,
        le=31 * 86_400,
        description="The shortest time between two slots of a cron (422 for a schedule "
        "that fires more often)",
    )
    max_agents: int = Field(default=1000, ge=0, description="Per tenant: stored agents, at most")
    max_agent_versions: int = Field(
        default=100, ge=0, description="Per stored agent: versions, at most"
    )
    cron_fires_per_pass: int = Field(
        default=200,
        ge=1,
        le=100_000,
        description="Cron slots a reaper pass fires at most, taken tenant by tenant in turn "
        "(the rest fire on the next pass)",
    )
    spec_env_allow: str = Field(
        default="",
        description="With auth required: env var names (or PREFIX* globs) that submitted specs "
        "may name in api_key_env, headers_env and webhook secret_env",
    )
    allow_test_models: bool | None = Field(
        default=None,
        description="Test doubles (the `scripted` model provider) in submitted specs. "
        "Unset: on in embedded mode only; a tenant's scripted model could sleep a worker away",
    )
    # upper bounds on what a submitted spec may ask for (refused with 422 above them)
    spec_max_deadline_s: float = Field(
        default=86_400.0, gt=0, description="Largest budget.deadline_s of a submitted spec"
    )
    spec_max_model_timeout_s: float = Field(
        default=600.0, gt=0, description="Largest timeout_connect/_read/_total of an inline profile"
    )
    spec_max_model_retries: int = Field(
        default=10, ge=0, description="Largest max_retries of an inline model profile"
    )
    spec_max_continuations: int = Field(
        default=10, ge=0, description="Largest max_continuations of an inline model profile"
    )
    spec_max_tool_timeout_s: float = Field(
        default=120.0, gt=0, description="Largest timeout_s of an inline HTTP tool"
    )
    spec_max_ask_timeout_s: float = Field(
        default=30 * 86_400.0, gt=0, description="Largest ask_timeout_s of a submitted spec"
    )
    tool_mode_ttl_s: float = Field(
        default=600.0,
        ge=0,
        description="How long a tool_mode: auto profile whose endpoint rejected tools stays "
        "in prompt mode before native tools are tried again (per process; 0: never "
        "remembered)",
    )
    retry_after_max_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest pause a provider's Retry-After may put on a profile",
    )
    # --- knowledge base -----------------------------------------------------------------
    embeddings_profile: str | None = Field(
        default=None,
        description="A model profile (profiles file) with an OpenAI-compatible /embeddings "
        "endpoint: chunks get vectors and search ranks keyword + vector hits together (RRF)",
    )
    # --- long-term memory (shared.engine.memory) ----------------------------------------
    memory_max_value_bytes: int = Field(
        default=65_536, ge=64, description="Largest memory item value (its JSON, in bytes)"
    )
    memory_max_key_chars: int = Field(
        default=256, ge=1, le=256, description="Longest memory item key (at most 256)"
    )
    memory_max_namespace_depth: int = Field(
        default=8, ge=1, le=8, description="Most labels in a memory namespace (at most 8)"
    )
    memory_max_items: int = Field(
        default=10_000, ge=0, description="Per tenant: memory items stored at once (0 = no limit)"
    )
    memory_refresh_on_read: bool = Field(
        default=True,
        description="A read (get, search, recall) of an item with a TTL starts its TTL again, "
        "unless the read says otherwise (refresh_ttl)",
    )
    # --- treadle as a server of other protocols (/mcp, /a2a) -----------------------------
    call_wait_s: float = Field(
        default=20.0,
        ge=0,
        le=600,
        description="/mcp tool calls and blocking /a2a message/send: wait this long for the run "
        "to end or pause; a run still going then is answered with its id (MCP: and its "
        "resource; A2A: a working task)",
    )
    mcp_agents: str = Field(
        default="",
        description="/mcp: comma-separated agent names served as tools (empty = every agent)",
    )

    def load_plugins(self) -> None:
        import importlib

        for name in filter(None, (p.strip() for p in self.plugins.split(","))):
            importlib.import_module(name)

    @property
    def embedded(self) -> bool:
        return self.broker_url.startswith("memory://")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except Exception as exc:
            raise ValueError(f"unknown time zone {value!r}") from exc
        return value

    @property
    def test_models_allowed(self) -> bool:
        """Whether a submitted spec may name the ``scripted`` provider (a test double)."""
        if self.allow_test_models is None:
            return self.embedded
        return self.allow_test_models

    @property
    def live_redis_url(self) -> str | None:
        if self.redis_url:
            return self.redis_url
        if self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None

    def ensure_dirs(self) -> None:
        if self.database_url.startswith("sqlite:///"):
            path = self.database_url.removeprefix("sqlite:///")
            if path and path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reset_settings() -> None:
    get_settings.cache_clear()
