"""What the interop facades and the workers both need: pure translations between treadle and
the LangGraph / OpenAI Responses protocols (``shapes``) and the facades' webhook bodies
(``webhooks``), which workers render inside the transaction that writes an event. The HTTP
routes of the facades are ``scheduler.interop``; this package never imports them."""
