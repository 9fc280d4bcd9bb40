"""Settings from the environment (``TREADLE_*``), with embedded-mode defaults.

With no variables set, treadle runs embedded: SQLite under ``./.treadle/`` and the in-process
``memory://`` broker.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings", "reset_settings"]


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
    lease_seconds: float = Field(default=30.0, description="Round/tool lease; renewed at 1/3")
    redrive_seconds: float = Field(
        default=15.0, description="An unconsumed outbox message is re-sent after this"
    )
    reaper_interval: float = Field(default=5.0, description="Seconds between reaper scans")
    visibility_timeout: int = Field(
        default=3600, description="Redis broker visibility timeout (the reaper re-drives first)"
    )
    worker_concurrency: int = Field(default=16, description="Threads per worker process")
    db_pool_size: int = Field(
        default=0, description="Database connections per process (0 = worker concurrency + 4)"
    )
    tool_timeout: float = Field(default=120.0, description="Default wall limit of one tool call")
    model_max_retries: int = Field(default=4, description="Transient model errors retried")
    allow_hosts: str = Field(
        default="", description="Comma-separated hosts http tools may reach despite SSRF rules"
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
    # --- security and limits (issue #11) ---------------------------------------------------
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
    submits_per_minute: int = Field(
        default=6000, description="Run submissions per API key per minute (0 = no limit)"
    )
    spec_env_allow: str = Field(
        default="",
        description="With auth required: env var names (or PREFIX* globs) that submitted specs "
        "may name in api_key_env, headers_env and webhook secret_env",
    )
    # --- knowledge base (issue #10) ---------------------------------------------------------
    embeddings_profile: str | None = Field(
        default=None,
        description="A model profile (profiles file) with an OpenAI-compatible /embeddings "
        "endpoint: chunks get vectors and search ranks keyword + vector hits together (RRF)",
    )

    def load_plugins(self) -> None:
        import importlib

        for name in filter(None, (p.strip() for p in self.plugins.split(","))):
            importlib.import_module(name)

    @property
    def embedded(self) -> bool:
        return self.broker_url.startswith("memory://")

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
