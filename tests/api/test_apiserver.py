"""The API server stand-in itself: it must behave as the API concepts documentation says.

These pin the behaviours the KubeSource tests rely on, checked with a plain HTTP client,
so that a source passing against the stand-in is not passing against a fantasy.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.api.conftest import run
from tests.apiserver import ApiServer, parse_label_selector
from tests.unit.conftest import service_obj

SERVICES = "/api/v1/services"


async def get(api: ApiServer, path: str, **params: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(api.url + path, params=params) as r:
        return r.status, await r.json()


async def watch(api: ApiServer, path: str, count: int, **params: str) -> list[Any]:
    """The first ``count`` events of a watch (fewer if the stream ends)."""
    events = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(api.url + path, params={"watch": "true", **params}) as r,
    ):
        assert r.status == 200
        async for line in r.content:
            events.append(json.loads(line))
            if len(events) == count:
                break
    return events


def names(body: Any) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


def test_pages_are_a_consistent_snapshot_until_compacted() -> None:
    async def scenario() -> None:
        async with ApiServer(watch_cache=False) as api:
            for name in "abcde":
                api.create(service_obj(name))
            status, first = await get(api, SERVICES, limit="2")
            assert (status, names(first)) == (200, ["a", "b"])
            assert first["metadata"]["remainingItemCount"] == 3
            assert "kind" not in first["items"][0]  # List items carry no kind
            api.delete("Service", "c", "default")
            api.create(service_obj("f"))
            token = first["metadata"]["continue"]
            status, second = await get(api, SERVICES, limit="2", **{"continue": token})
            assert names(second) == ["c", "d"]  # as of the first page's version
            assert second["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
            status, _ = await get(
                api, SERVICES, resourceVersion="1", **{"continue": token, "limit": "2"}
            )
            assert status == 400
            api.compact()
            status, body = await get(api, SERVICES, limit="2", **{"continue": token})
            assert (status, body["reason"], body["code"]) == (410, "Expired", 410)

    run(scenario)


def test_resource_version_semantics_of_lists() -> None:
    async def scenario() -> None:
        async with ApiServer(watch_cache=True) as api:
            api.create(service_obj("a"))
            old = api.rv
            api.create(service_obj("b"))
            # "0": any version; the watch cache ignores limit.
            assert names((await get(api, SERVICES, resourceVersion="0", limit="1"))[1]) == [
                "a",
                "b",
            ]
            # N with limit: exactly N. N without limit: not older than N.
            _, exact = await get(api, SERVICES, resourceVersion=str(old), limit="5")
            assert names(exact) == ["a"]
            _, recent = await get(api, SERVICES, resourceVersion=str(old))
            assert names(recent) == ["a", "b"]
            status, body = await get(api, SERVICES, resourceVersion=str(api.rv + 10))
            assert (status, body["details"]["causes"][0]["reason"]) == (
                504,
                "ResourceVersionTooLarge",
            )
            api.compact()
            status, _ = await get(api, SERVICES, resourceVersion=str(old), limit="5")
            assert status == 410

    run(scenario)


def test_selectors() -> None:
    labels = parse_label_selector("!x, app in (web, db), tier notin (cache), env!=dev, team")
    assert labels({"app": "web", "tier": "front", "env": "prod", "team": "a"})
    assert not labels({"app": "web", "team": "a", "x": ""})
    assert not labels({"app": "other", "team": "a"})
    assert not labels({"app": "db", "team": "a", "tier": "cache"})

    async def scenario() -> None:
        async with ApiServer(service_field_selectors=False) as api:
            api.create(service_obj("a"))
            status, body = await get(api, SERVICES, fieldSelector="spec.clusterIP!=None")
            assert (status, body["message"]) == (400, "field label not supported: spec.clusterIP")
            status, _ = await get(api, SERVICES, labelSelector="a in b")
            assert status == 400
            _, body = await get(api, SERVICES, fieldSelector="metadata.name=a")
            assert names(body) == ["a"]

    run(scenario)


def test_watch_semantics() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(service_obj("a"))
            start = api.rv
            api.create(service_obj("b"))
            api.update({**service_obj("a"), "metadata": {"name": "a", "labels": {"x": "1"}}})
            # Replayed history after "start", through a selector: "a" stops matching.
            events = await watch(api, SERVICES, 2, resourceVersion=str(start), labelSelector="!x")
            assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
                ("ADDED", "b"),
                ("DELETED", "a"),
            ]
            assert events[0]["object"]["kind"] == "Service"  # watch objects do
            # Synthetic ADDED for the current state, then a final bookmark at timeout.
            events = await watch(api, SERVICES, 10, timeoutSeconds="1", allowWatchBookmarks="true")
            assert [e["type"] for e in events] == ["ADDED", "ADDED", "BOOKMARK"]
            assert events[-1]["object"]["metadata"] == {"resourceVersion": str(api.rv)}
            api.compact()
            (error,) = await watch(api, SERVICES, 1, resourceVersion=str(start))
            assert (error["type"], error["object"]["code"]) == ("ERROR", 410)

        async with ApiServer(gone_as_status=True) as api:
            api.create(service_obj("a"))
            api.compact()
            status, body = await get(api, SERVICES, watch="true", resourceVersion="1")
            assert (status, body["reason"]) == (410, "Expired")

    run(scenario)


def test_discovery_and_unknown_paths() -> None:
    async def scenario() -> None:
        async with ApiServer(service_cidrs=False) as api:
            _, body = await get(api, "/apis/networking.k8s.io/v1")
            assert "servicecidrs" not in {r["name"] for r in body["resources"]}
            status, _ = await get(api, "/apis/networking.k8s.io/v1/servicecidrs")
            assert status == 404
            _, body = await get(api, "/apis")
            assert {g["name"] for g in body["groups"]} == {"discovery.k8s.io", "networking.k8s.io"}
        async with ApiServer() as api:
            _, body = await get(api, "/apis/networking.k8s.io/v1")
            assert "servicecidrs" in {r["name"] for r in body["resources"]}

    run(scenario)
