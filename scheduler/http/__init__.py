"""The native HTTP API: one module per resource (runs, threads, files, datasets, ops,
console), the caller (auth), the limits, the error body, the response views and the SSE tail."""
