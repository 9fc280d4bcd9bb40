"""The processes people and programs talk to, one room per audience.

* ``scheduler.http``: the native HTTP API (routers, auth, limits, errors, the SSE tail);
* ``scheduler.interop``: the LangGraph and OpenAI Responses facades over the same engine;
* ``scheduler.app``: the one FastAPI app that mounts both, plus the web console (``static/``);
* ``scheduler.cli``: the ``treadle`` command and its HTTP client;
* ``scheduler.embedded``: one process for API, worker threads and reaper (SQLite).

Arrows point down only: cli → app → interop → http → ``shared``. Nothing in ``shared/`` or
``worker/`` imports this package (``tests/unit/test_architecture.py``).
"""
