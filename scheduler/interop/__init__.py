"""Interop facades (issue #16): the LangGraph Server routes (``/langgraph``, what
``langgraph-sdk`` speaks) and the OpenAI Responses background routes (``/openai/v1``) over
treadle's engine.

Each LangGraph run and each OpenAI response is a *segment* of a treadle run: from its start
(or a resume) to the next pause or the end (``segments``). Pauses become LangChain
human-in-the-loop interrupts or ``ask_user`` function calls / MCP approval requests
(``shapes``). Nothing here changes what the engine does; webhooks are reshaped by renderers
(``webhooks``) that the engine calls by name.

Keep this module free of imports: workers import ``scheduler.interop.webhooks``.
"""
