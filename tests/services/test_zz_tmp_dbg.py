import time, logging
import redis
from fastapi.testclient import TestClient
from scheduler.api import create_app

def test_dbg(prod_rt, caplog):
    caplog.set_level(logging.DEBUG)
    sent = []
    real = prod_rt.publish
    prod_rt.publish = lambda items: (sent.append(items), real(items))
    with TestClient(create_app(lambda: prod_rt), raise_server_exceptions=False) as client:
        chat = {"kind": "chat", "model": {"provider": "scripted", "replies": [{"text": "a"}]}}
        r = client.post("/v1/runs", json={"agent": chat, "input": "q"})
        time.sleep(0.5)
    print("SENT", sent)
    for rec in caplog.records:
        if rec.levelno >= logging.INFO: print(rec.name, rec.getMessage(), rec.exc_text)
    assert 0
