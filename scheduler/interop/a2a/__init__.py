"""Each named agent as an A2A server (``/a2a/{agent}``; docs/a2a.md): ``server`` (the SDK's
JSON-RPC dispatcher over treadle), ``answers`` (what it does to runs), ``card`` (the agent
card)."""
