"""Engines: PostgreSQL (psycopg 3) or SQLite (WAL, ``BEGIN IMMEDIATE`` writes)."""

from __future__ import annotations

import os
import select
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = [
    "PgLimits",
    "get_engine",
    "is_sqlite",
    "limits_of",
    "lock_busy",
    "make_engine",
    "migrate",
    "ping_on_checkout",
    "reading",
    "reset_engines",
]

if TYPE_CHECKING:
    from shared.config import Settings

_engines: dict[str, Engine] = {}
_lock = threading.Lock()


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


@contextmanager
def reading(engine: Engine) -> Iterator[sa.Connection]:
    """A connection for reads only, outside a transaction (PostgreSQL: autocommit). Under READ
    COMMITTED each statement reads its own snapshot either way; what this saves is the
    ``ROLLBACK`` the pool sends when a connection comes back inside a transaction, which
    psycopg follows with ``DEALLOCATE ALL``: every statement it had prepared on that
    connection is forgotten, and the engine's hot statements (prepared from their 5th run)
    are parsed and planned again. Never write through it: each statement commits alone."""
    with engine.connect() as conn:
        if not is_sqlite(engine):  # SQLite's reads hold no transaction (``isolation_level=None``)
            conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


def _sqlite_engine(url: str, pool_size: int) -> Engine:
    path = url.removeprefix("sqlite:///")
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(
        url,
        connect_args={"timeout": 30, "check_same_thread": False, "isolation_level": None},
        pool_size=pool_size,
        max_overflow=pool_size,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _rec: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # take the write lock up front: no deadlock when a reader upgrades to a writer
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


@dataclass(frozen=True, slots=True)
class PgLimits:
    """Bounded waits of every PostgreSQL session (0 = the server's default, no limit).

    A session that waits on a row lock longer than ``lock_timeout`` gets an error instead of
    parking its thread; ``statement_timeout`` bounds any one statement; the server ends a
    session idle inside a transaction after ``idle_in_transaction`` (a worker paused or cut
    off mid-transaction gives its locks back). TCP keepalives (and ``tcp_user_timeout`` for
    unacknowledged sends) find a dead peer in ``idle + interval x count`` seconds instead of
    the kernel's two hours. Seconds throughout."""

    lock_timeout: float = 5.0
    statement_timeout: float = 30.0
    idle_in_transaction: float = 10.0
    keepalives_idle: int = 10
    keepalives_interval: int = 5
    keepalives_count: int = 3

    def connect_args(self) -> dict[str, Any]:
        """libpq connection parameters (psycopg 3 passes them through)."""
        opts = {
            "lock_timeout": self.lock_timeout,
            "statement_timeout": self.statement_timeout,
            "idle_in_transaction_session_timeout": self.idle_in_transaction,
        }
        args: dict[str, Any] = {
            "options": " ".join(f"-c {k}={int(v * 1000)}" for k, v in opts.items()),
        }
        if self.keepalives_idle > 0:
            args.update(
                keepalives=1,
                keepalives_idle=self.keepalives_idle,
                keepalives_interval=max(1, self.keepalives_interval),
                keepalives_count=max(1, self.keepalives_count),
                tcp_user_timeout=1000
                * (self.keepalives_idle + max(1, self.keepalives_interval) * self.keepalives_count),
            )
        return args


def make_engine(
    url: str,
    pool_size: int = 20,
    max_overflow: int = 5,
    *,
    limits: PgLimits | None = None,
    pre_ping: bool = False,
) -> Engine:
    """Size the pool to the threads that use it: N worker processes × (pool + overflow) must
    stay under the server's max_connections (100 by default on PostgreSQL). ``limits``: the
    bounded waits of a PostgreSQL session (default ``PgLimits()``); SQLite has its own."""
    if url.startswith("sqlite"):
        return _sqlite_engine(url, pool_size)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    connect_args = (limits or PgLimits()).connect_args() if url.startswith("postgresql") else {}
    if url.startswith("postgresql+psycopg"):
        from shared.store.described import DescribedCursor

        connect_args["cursor_factory"] = DescribedCursor  # description once per statement shape
    # workers: no pre-ping (a round trip per checkout, 4 per round): a connection broken by a
    # database restart fails one task, which retries; SQLAlchemy then drops the whole stale
    # pool. The API tests each connection on checkout (``ping_on_checkout``): a request does
    # not fail on a connection the server closed or one idle long enough to be in doubt.
    engine = sa.create_engine(
        url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        pool_timeout=30,
        connect_args=connect_args,
    )
    if url.startswith("postgresql"):
        event.listen(engine, "do_connect", _name_session)
    return engine


def _name_session(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    """``application_name`` = ``treadle/<pid>``: ``pg_stat_activity`` tells which process
    holds a session (and which one sits idle inside a transaction)."""
    cparams.setdefault("application_name", f"treadle/{os.getpid()}")


BUSY_SQLSTATES = frozenset({"55P03", "57014"})  # lock_not_available, query_canceled


def lock_busy(exc: BaseException) -> bool:
    """The database gave up waiting (``lock_timeout`` or ``statement_timeout``): another
    session holds what this one needed. Not an outage: the work is due again later."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in BUSY_SQLSTATES


def ping_on_checkout(engine: Engine) -> None:
    """Test each pooled connection before handing it out (the API: after a database restart
    or a killed session, the next request gets a fresh connection instead of an error).

    On PostgreSQL a connection back in use within ``_Liveness.FRESH_S`` is tested by a look at
    its socket; only one the server wrote to, or one idle longer, costs a ``SELECT 1`` round
    trip (``_Liveness``). Idempotent (the API calls it per request)."""
    if engine in _LIVENESS:  # every request after the first: a set lookup, no lock
        return
    if engine.dialect.name != "postgresql":
        engine.pool._pre_ping = True
        _LIVENESS.add(engine)
        return
    with _LIVENESS_LOCK:
        if engine in _LIVENESS:
            return
        liveness = _Liveness(engine.dialect)
        event.listen(engine.pool, "checkin", liveness.checked_in)
        event.listen(engine.pool, "checkout", liveness.checked_out)
        _LIVENESS.add(engine)  # a disposed pool's successor keeps its listeners


_LIVENESS: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines set up already
_LIVENESS_LOCK = threading.Lock()


class _Liveness:
    """Pool listeners that ping (``SELECT 1``) a connection only when there is a reason to:
    it sat idle longer than ``FRESH_S`` (its server may have gone away without a word: a host
    crash, a failover), or its socket is readable while idle (the server's goodbye after a
    restart or a killed session, then EOF; rarely an unasked notice). One that fails its ping
    is replaced (``DisconnectionError``: the pool reconnects it). A connection back within
    ``FRESH_S`` with a quiet socket is taken as alive, as HTTP clients do with kept-alive
    connections: the ``SELECT 1`` on every checkout cost a round trip to the database, two per
    keyed write request."""

    FRESH_S = 5.0
    _SINCE = "treadle_checked_in"

    def __init__(self, dialect: Any) -> None:
        self._dialect = dialect

    def checked_in(self, dbapi_connection: Any, record: Any) -> None:
        record.info[self._SINCE] = time.monotonic()

    def checked_out(self, dbapi_connection: Any, record: Any, proxy: Any) -> None:
        since = record.info.get(self._SINCE)
        try:
            fd = dbapi_connection.fileno()  # raises once the connection is closed
        except Exception as exc:
            raise sa.exc.DisconnectionError("a pooled connection is closed") from exc
        fresh = since is not None and time.monotonic() - since < self.FRESH_S
        if fresh and not _readable(fd):
            return
        try:
            self._dialect.do_ping(dbapi_connection)
        except Exception as exc:
            raise sa.exc.DisconnectionError("a pooled connection failed its ping") from exc


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def limits_of(settings: Settings) -> PgLimits:
    """The bounded waits the settings ask for (``TREADLE_DB_*``)."""
    return PgLimits(
        lock_timeout=settings.db_lock_timeout,
        statement_timeout=settings.db_statement_timeout,
        idle_in_transaction=settings.db_idle_in_transaction_timeout,
        keepalives_idle=settings.db_keepalives_idle,
        keepalives_interval=settings.db_keepalives_interval,
        keepalives_count=settings.db_keepalives_count,
    )


def default_pool_size(concurrency: int, engine_slots: int) -> int:
    """Connections a worker process's threads can use at once: only threads inside the engine
    gate touch the database (a model call or a tool holds no connection), so 2 x the gate's
    slots + 4 (the heartbeat, the stop backstop, a thread between stages), never more than
    the threads + 4; with no gate, every thread may."""
    if engine_slots <= 0:
        return concurrency + 4
    return min(concurrency, 2 * engine_slots) + 4


def get_engine(url: str | None = None) -> Engine:
    """The process-wide engine for ``url`` (default: the configured database)."""
    from shared.config import get_settings

    settings = get_settings()
    url = url or settings.database_url
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            size = settings.db_pool_size or default_pool_size(
                settings.worker_concurrency, settings.worker_engine_slots
            )
            engine = _engines[url] = make_engine(url, pool_size=size, limits=limits_of(settings))
        return engine


def reset_engines() -> None:
    with _lock:
        for engine in _engines.values():
            engine.dispose()
        _engines.clear()


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision."""
    from alembic import command
    from alembic.config import Config

    here = Path(__file__).parent / "migrations"
    cfg = Config()
    cfg.set_main_option("script_location", str(here))
    cfg.attributes["connection_engine"] = engine
    with _lock:
        command.upgrade(cfg, "head")
