"""The HTTP face of treadle: FastAPI app, SSE, reaper loop, web console, CLI."""
