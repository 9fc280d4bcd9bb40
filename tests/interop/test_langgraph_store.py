"""The real ``langgraph-sdk`` drives treadle's long-term memory through the LangGraph Store
routes of the facade: ``client.store.put_item / get_item / search_items / delete_item /
list_namespaces``, unchanged; a tenant's items stay its own."""

from __future__ import annotations

import asyncio

import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError, UnprocessableEntityError

from tests.interop.conftest import Keyed, Served


def test_the_store_client_works_unchanged(served: Served) -> None:
    async def main() -> None:
        client = get_client(url=f"{served.url}/langgraph", api_key="unused-locally")
        store = client.store
        try:
            await store.put_item(["docs", "u1"], "a", {"title": "Refunds", "body": "30 days"})
            await store.put_item(["docs", "u1"], "b", {"title": "Shipping", "body": "2 days"})
            await store.put_item(["docs", "u2"], "c", {"title": "Refunds", "body": "none"}, ttl=5)
            item = await store.get_item(["docs", "u1"], "a")
            assert item["namespace"] == ["docs", "u1"] and item["key"] == "a"
            assert item["value"] == {"title": "Refunds", "body": "30 days"}
            assert item["created_at"].endswith("Z") and item["updated_at"]
            found = await store.search_items(["docs"], filter={"title": "Refunds"})
            assert sorted(i["key"] for i in found["items"]) == ["a", "c"]
            ranked = await store.search_items(["docs", "u1"], query="shipping days")
            assert ranked["items"][0]["key"] == "b" and ranked["items"][0]["score"] > 0
            paged = await store.search_items(["docs"], limit=1, offset=1)
            assert len(paged["items"]) == 1
            spaces = await store.list_namespaces(prefix=["docs"])
            assert spaces["namespaces"] == [["docs", "u1"], ["docs", "u2"]]
            await store.delete_item(["docs", "u1"], "a")
            with pytest.raises(NotFoundError):
                await store.get_item(["docs", "u1"], "a")
            with pytest.raises(UnprocessableEntityError):  # a namespace too deep
                await store.put_item([str(i) for i in range(20)], "k", {"v": 1})
        finally:
            await client.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_tenants_store_is_its_own(keyed: Keyed) -> None:
    async def main() -> None:
        acme = get_client(url=f"{keyed.url}/langgraph", api_key=keyed.keys["acme"])
        globex = get_client(url=f"{keyed.url}/langgraph", api_key=keyed.keys["globex"])
        try:
            await acme.store.put_item(["secrets"], "plan", {"text": "merge with globex"})
            assert (await acme.store.get_item(["secrets"], "plan"))["value"]["text"]
            with pytest.raises(NotFoundError):
                await globex.store.get_item(["secrets"], "plan")
            assert (await globex.store.search_items(["secrets"]))["items"] == []
            assert (await globex.store.list_namespaces())["namespaces"] == []
        finally:
            await acme.aclose()
            await globex.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))
