"""The ``treadle`` command: the process commands (up, api, worker, beat, flower, migrate,
demo, keys) and a client of the HTTP API (submit, watch, answer, approve, ...)."""
