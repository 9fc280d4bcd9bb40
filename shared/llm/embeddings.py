"""Embeddings through an OpenAI-compatible ``POST {base_url}/embeddings`` (the profile named by
``TREADLE_EMBEDDINGS_PROFILE``): ``{model, input: [texts]}`` → ``data[i].embedding``.

Used by the knowledge base for hybrid ranking (keyword + vector, fused by reciprocal rank).
Failures raise ``ModelError`` (transient: 429, 5xx, timeouts; fatal: other answers).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import httpx

from shared.agent.spec import ModelProfile
from shared.errors import FatalModelError, TransientModelError
from shared.llm.profiles import http_client

__all__ = ["BATCH", "embed"]

BATCH = 64


def embed(profile: ModelProfile, texts: Sequence[str]) -> list[list[float]]:
    """One vector per text, in order (batches of ``BATCH``)."""
    out: list[list[float]] = []
    for start in range(0, len(texts), BATCH):
        out += _embed_batch(profile, list(texts[start : start + BATCH]))
    return out


def _embed_batch(profile: ModelProfile, texts: list[str]) -> list[list[float]]:
    url = profile.base_url.rstrip("/") + "/embeddings"
    timeout = httpx.Timeout(
        connect=profile.timeout_connect,
        read=profile.timeout_read,
        write=profile.timeout_read,
        pool=profile.timeout_read,
    )
    try:
        response = http_client(profile.base_url).post(
            url,
            json={"model": profile.model, "input": texts},
            headers=_headers(profile),
            timeout=timeout,
        )
    except httpx.HTTPError as exc:
        raise TransientModelError(f"embeddings: {type(exc).__name__}: {exc}") from exc
    if response.status_code == 429 or response.status_code >= 500:
        raise TransientModelError(
            f"embeddings: HTTP {response.status_code}", status=response.status_code
        )
    if response.status_code != 200:
        raise FatalModelError(
            f"embeddings: HTTP {response.status_code}: {response.text[:300]}",
            status=response.status_code,
        )
    return _vectors(response, len(texts))


def _vectors(response: httpx.Response, n: int) -> list[list[float]]:
    try:
        data = sorted(response.json()["data"], key=lambda d: int(d.get("index", 0)))
        vectors = [[float(x) for x in d["embedding"]] for d in data]
    except (ValueError, KeyError, TypeError) as exc:
        raise FatalModelError(f"embeddings: unexpected response: {exc}") from exc
    if len(vectors) != n:
        raise FatalModelError(f"embeddings: {len(vectors)} vectors for {n} texts")
    return vectors


def _headers(profile: ModelProfile) -> dict[str, str]:
    if not profile.api_key_env:
        return {}
    key = os.environ.get(profile.api_key_env)
    if not key:
        raise FatalModelError(
            f"embeddings profile {profile.name!r}: environment variable "
            f"{profile.api_key_env} is not set"
        )
    return {"Authorization": f"Bearer {key}"}
