"""An OpenAI-compatible ``/embeddings`` endpoint for tests (moved here from
tests/engine/test_knowledge.py, where the knowledge base's hybrid search first used it): a bag of
topic words as the vector, so texts about the same topic are similar without sharing a word."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.loopback import LoopbackServer

__all__ = ["Embeddings"]


class Embeddings:
    """An OpenAI-compatible /embeddings endpoint: a bag of topic words as the vector."""

    TOPICS = ("refund", "money", "ship", "deliver", "password", "gift")

    def __init__(self) -> None:
        outer = self
        self.calls = 0

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.calls += 1
                data = [
                    {"index": i, "embedding": outer.vector(t)} for i, t in enumerate(body["input"])
                ]
                payload = json.dumps({"data": data, "model": body["model"]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = LoopbackServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def vector(self, text: str) -> list[float]:
        low = text.lower()
        synonyms = {"money back": "refund", "reimburse": "refund", "parcel": "ship"}
        for word, topic in synonyms.items():
            low = low.replace(word, topic)
        return [float(low.count(t)) + 0.01 for t in self.TOPICS]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"
