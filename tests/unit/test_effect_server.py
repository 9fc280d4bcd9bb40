"""The chaos tests' write endpoint (``tests.support.EffectServer``) keeps nothing of a request
whose sender died mid-body: a worker SIGKILLed between sending the headers and the body must
not leave an empty effect that its retry, with the same Idempotency-Key, then replays."""

from __future__ import annotations

import json
import socket

import httpx

from tests.support import EffectServer


def test_a_request_cut_before_its_body_is_not_recorded() -> None:
    with EffectServer() as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(
                b"POST / HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 20\r\n\r\n"
            )
        retry = httpx.post(server.url, json={"item": "x"}, headers={"Idempotency-Key": "k1"})
        assert json.loads(retry.content) == {"recorded": "x"}
        assert server.effects == {"k1": 1}
