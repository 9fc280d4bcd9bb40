"""The LangGraph Server facade (``/langgraph``, what ``langgraph-sdk`` speaks): ``routes`` (the
router, in serving order) over ``assistants``, ``threads``, ``runs``, ``crons`` and the Store
(``store``); ``facade`` is what the run routes do to treadle, ``views`` the LangGraph shapes of
threads, runs and checkpoints, ``stream`` a segment as LangGraph SSE, ``bodies`` the requests."""
