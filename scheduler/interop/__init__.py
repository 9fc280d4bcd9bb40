"""Interop facades (docs/api.md, Compatibility facades): the LangGraph Server routes
(``/langgraph``, what ``langgraph-sdk`` speaks) and the OpenAI Responses background routes
(``/openai/v1``) over treadle's engine.

Each LangGraph run and each OpenAI response is a *segment* of a treadle run: from its start
(or a resume) to the next pause or the end (``shared.store.segments``). Pauses become LangChain
human-in-the-loop interrupts or ``ask_user`` function calls / MCP approval requests
(``shared.interop.shapes``). Nothing here changes what the engine does; webhooks are
reshaped by renderers (``shared.interop.webhooks``) that the store calls by name on workers.
"""
