"""The OpenAI Responses facade (``/openai/v1``, background responses): ``responses`` (the
routes and what they do to treadle), ``bodies`` (the request), ``stream`` (a segment's events
as a Response object and its stream events)."""
