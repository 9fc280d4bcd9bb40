"""LangGraph thread ids, one namespace per tenant.

A LangGraph client may name its threads (``POST /threads {"thread_id": "t-1"}``). Stored
as given, those names would be one namespace for every tenant: a tenant would learn another's
thread names (a 409) and could take them first. So a name a client chooses is stored under a
tenant-scoped id, ``<name>~<tenant digest>``, and shown back as the name. Ids the server makes
(UUIDs) are stored as they are: nobody can guess them first.
"""

from __future__ import annotations

import hashlib

SEP = "~"  # never in a client's thread name (``CLIENT_THREAD_ID``)
CLIENT_THREAD_ID = r"^[^~/?#%\s\x00-\x1f\x7f]{1,40}$"  # a client-chosen thread name


def scoped_id(tenant: str, name: str) -> str:
    """The stored id of the thread a tenant's client names ``name``."""
    digest = hashlib.sha256(tenant.encode()).hexdigest()[:12]
    return f"{name}{SEP}{digest}"


def public_id(thread_id: str) -> str:
    """The id a LangGraph client knows the stored thread ``thread_id`` by."""
    return thread_id.split(SEP, 1)[0]
