"""Interop facades (docs/api.md, Compatibility facades), one package a protocol over treadle's
engine: ``langgraph`` (the LangGraph Server routes and Store, ``/langgraph``, what
``langgraph-sdk`` speaks), ``openai`` (the OpenAI Responses background routes, ``/openai/v1``),
``mcp`` (``/mcp``) and ``a2a`` (``/a2a/{agent}``); ``common`` is what they share.

Each LangGraph run and each OpenAI response is a *segment* of a treadle run: from its start
(or a resume) to the next pause or the end (``shared.store.segments``). Pauses become LangChain
human-in-the-loop interrupts or ``ask_user`` function calls / MCP approval requests
(``shared.interop.shapes``). Nothing here changes what the engine does; webhooks are
reshaped by renderers (``shared.interop.webhooks``) that the store calls by name on workers.
"""
