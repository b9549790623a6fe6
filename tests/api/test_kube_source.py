"""kubeproxy.sources.kube.KubeSource against the API server stand-in, over real HTTP.

The source must behave like upstream kube-proxy's informers: one complete initial batch,
then only real changes; relists after 410 that emit exactly the differences; resuming
watches from the last seen resourceVersion (events and bookmarks); keeping its state
through outages; and ignoring what upstream ignores, with the same selectors.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import pytest

from kubeproxy.logs import V2
from kubeproxy.model.events import EventType
from kubeproxy.model.types import LABEL_HEADLESS, LABEL_SERVICE_PROXY_NAME, Service
from kubeproxy.sources import initial_state
from tests.api.conftest import FAST, NODE, Consumer, eventually, run, source_for, summary
from tests.apiserver import ApiServer, RequestRecord, service_cidr_object
from tests.unit.conftest import node_obj, service_obj, slice_obj

SERVICES = "/api/v1/services"
SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
NODES = "/api/v1/nodes"
CIDRS = "/apis/networking.k8s.io/v1/servicecidrs"


def svc(name: str, ip: str, namespace: str = "default", **labels: str) -> dict[str, Any]:
    obj = service_obj(name, namespace, clusterIP=ip)
    if labels:
        obj["metadata"]["labels"] = labels
    return obj


def eps(
    name: str, service: str, ip: str, namespace: str = "default", **labels: str
) -> dict[str, Any]:
    obj = slice_obj(name, service, namespace, endpoints=[{"addresses": [ip]}])
    obj["metadata"]["labels"].update(labels)
    return obj


def populate(api: ApiServer) -> None:
    api.create(svc("web", "10.96.0.10"))
    api.create(svc("db", "10.96.0.11", "prod"))
    api.create(eps("web-1", "web", "10.1.0.1"))
    api.create(eps("db-1", "db", "10.1.0.2", "prod"))
    api.create(node_obj(NODE, addresses=[{"type": "InternalIP", "address": "192.168.0.1"}]))
    api.create(node_obj("node-b"))
    api.create(service_cidr_object("kubernetes", "10.96.0.0/16"))


def lists(api: ApiServer, path: str) -> list[RequestRecord]:
    return [r for r in api.requests if r.path == path and not r.watch]


def watches(api: ApiServer, path: str) -> list[RequestRecord]:
    return [r for r in api.requests if r.path == path and r.watch]


# ============================================================================ initial sync


def test_initial_state_is_one_batch_after_every_informer_listed() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            node_list = api.hold(lambda r: r.path == NODES and not r.watch)
            async with Consumer(source_for(api)) as consumer:
                await node_list.arrived.wait()
                # Services and slices are listed (and watched); the Node list is pending.
                assert await consumer.quiet(0.2) == []
                node_list.released.set()
                first = await consumer.next_batch()
                assert sorted(summary(first)) == [
                    ("ADDED", "EndpointSlice", "default/web-1"),
                    ("ADDED", "EndpointSlice", "prod/db-1"),
                    ("ADDED", "Node", NODE),  # only ours: fieldSelector metadata.name
                    ("ADDED", "Service", "default/web"),
                    ("ADDED", "Service", "prod/db"),
                    ("ADDED", "ServiceCIDR", "kubernetes"),
                ]
                assert await consumer.quiet() == []
            # Upstream's requests: all namespaces, RV "0" first, then watch from the list.
            for path in (SERVICES, SLICES, NODES, CIDRS):
                (listed,) = lists(api, path)
                assert listed.params["resourceVersion"] == "0"
                watch = watches(api, path)[0]
                assert watch.params["allowWatchBookmarks"] == "true"
                assert 300 <= int(watch.params["timeoutSeconds"]) < 600
                assert watch.params["resourceVersion"] == str(api.rv)
            assert lists(api, NODES)[0].params["fieldSelector"] == f"metadata.name={NODE}"

    run(scenario)


def test_initial_state_alone_for_run_once_leaves_nothing_running() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            events = await initial_state(source_for(api))
            assert len(events) == 6
            # The informers are gone (the server's handlers wind down on their own).
            assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("watch-")]
            await eventually(lambda: api.watch_count == 0)

    run(scenario)


def test_empty_cluster_still_yields_an_initial_batch() -> None:
    async def scenario() -> None:
        async with ApiServer() as api, Consumer(source_for(api)) as consumer:
            assert await consumer.next_batch() == []

    run(scenario)


def test_stop_before_the_initial_sync_yields_nothing() -> None:
    async def scenario() -> None:
        api = ApiServer()
        await api.start()
        await api.stop()  # never reachable
        async with Consumer(source_for(api)) as consumer:
            assert await consumer.quiet(0.2) == []
        assert consumer.batches == []

    run(scenario)


def test_service_cidrs_are_skipped_when_the_api_does_not_serve_them() -> None:
    async def scenario() -> None:
        async with ApiServer(service_cidrs=False) as api:
            api.create(svc("web", "10.96.0.10"))
            async with Consumer(source_for(api)) as consumer:
                first = await consumer.next_batch()
                assert summary(first) == [("ADDED", "Service", "default/web")]
            assert not [r for r in api.requests if r.path == CIDRS]

    run(scenario)


# ================================================================================ changes


def test_add_update_delete_become_events() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                api.create(svc("cache", "10.96.0.12"))
                assert summary(await consumer.next_batch()) == [
                    ("ADDED", "Service", "default/cache")
                ]
                api.update(svc("cache", "10.96.0.13"))
                (event,) = await consumer.next_batch()
                assert event.type is EventType.MODIFIED
                assert isinstance(event.old, Service) and isinstance(event.new, Service)
                assert event.old.ports[0].cluster_ips == ("10.96.0.12",)
                assert event.new.ports[0].cluster_ips == ("10.96.0.13",)
                api.delete("EndpointSlice", "web-1", "default")
                api.delete("Node", NODE)
                assert summary(await consumer.next_batch()) == [
                    ("DELETED", "EndpointSlice", "default/web-1"),
                    ("DELETED", "Node", NODE),
                ]

    run(scenario)


def test_changes_that_do_not_matter_to_the_proxy_emit_nothing() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                annotated = svc("web", "10.96.0.10")
                annotated["metadata"]["annotations"] = {"owner": "team-a"}
                api.update(annotated)
                heartbeat = node_obj(
                    NODE, addresses=[{"type": "InternalIP", "address": "192.168.0.1"}]
                )
                heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
                api.update(heartbeat)
                assert await consumer.quiet() == []

    run(scenario)


def test_an_invalid_object_is_logged_once_and_treated_as_absent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                broken = svc("web", "10.96.0.10")
                broken["spec"]["ports"] = [{"port": 70000}]
                api.update(broken)
                assert summary(await consumer.next_batch()) == [
                    ("DELETED", "Service", "default/web")
                ]
                api.update(svc("web", "10.96.0.10"))
                assert summary(await consumer.next_batch()) == [("ADDED", "Service", "default/web")]

    with caplog.at_level(logging.ERROR, logger="kubeproxy.sources"):
        run(scenario)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        "Skipping invalid Service default/web: spec.ports[0].port: "
        "must be between 1 and 65535, got 70000"
    ]


# ======================================================================= 410 and relists


@pytest.mark.parametrize("gone_as_status", [False, True], ids=["error-event", "http-410"])
def test_gone_after_a_disconnection_relists_and_emits_only_the_differences(
    gone_as_status: bool,
) -> None:
    async def scenario() -> None:
        async with ApiServer(gone_as_status=gone_as_status) as api:
            populate(api)
            api.create(svc("cache", "10.96.0.12"))
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                await api.stop()
                # While we are disconnected: one delete, one update, one add, and the
                # history of it all compacted away.
                api.delete("Service", "db", "prod")
                api.update(svc("cache", "10.96.0.99"))
                api.create(eps("cache-1", "cache", "10.1.0.9"))
                api.compact()
                await api.start()
                await consumer.until(
                    lambda: (
                        consumer.names("Service") == {"default/web", "default/cache"}
                        and "default/cache-1" in consumer.names("EndpointSlice")
                    )
                )
                events = [e for batch in consumer.batches[1:] for e in batch]
                assert sorted(summary(events)) == [
                    ("ADDED", "EndpointSlice", "default/cache-1"),
                    ("DELETED", "Service", "prod/db"),
                    ("MODIFIED", "Service", "default/cache"),
                ]
                assert await consumer.quiet() == []
            # The relists asked for the last seen version (served from the watch cache:
            # not paginated), as client-go does after a 410.
            services = lists(api, SERVICES)
            assert len(services) == 2
            assert "limit" not in services[1].params
            assert services[1].params["resourceVersion"] not in ("", "0")

    run(scenario)


def test_gone_mid_stream_relists_without_events_for_unchanged_objects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                await consumer.until(lambda: api.watch_count == 4)
                api.expire_watches()  # every watch ends with an ERROR 410 event
                await consumer.until(lambda: len(lists(api, SLICES)) == 2)
                assert await consumer.quiet() == []
                api.create(svc("late", "10.96.0.20"))
                assert summary(await consumer.next_batch()) == [
                    ("ADDED", "Service", "default/late")
                ]

    with caplog.at_level(V2, logger="kubeproxy.sources.kube_informer"):
        run(scenario)
    # Every list at --v=2, a relist with its reason, as upstream's reflector logs
    # "Caches populated" at V2 for every list (tests/realk8s/test_faults.py sees one
    # after a real API server forgot the history).
    lines = [r.getMessage() for r in caplog.records if r.levelno == V2]
    first = [line for line in lines if line.startswith("Listed ") and " again " not in line]
    again = [line for line in lines if " again (" in line]
    assert sorted(line.split()[2] for line in first) == [
        "endpointslices", "nodes", "servicecidrs", "services"
    ]  # fmt: skip
    assert any(line.startswith("Listed 2 endpointslices at resourceVersion") for line in again)
    assert all("HTTP 410 (Expired): too old resource version" in line for line in again), again


async def cut_off_after_watching(api: ApiServer, consumer: Consumer) -> None:
    """The initial state read and every informer watching, then the stand-in stopped."""
    await consumer.next_batch()
    await consumer.until(lambda: api.watch_count == 4)
    await api.stop()


def test_a_410_after_an_outage_relists_at_once_even_right_after_a_list() -> None:
    """Found by the API outage test: a watch cut within a second of the list, without an
    event, left the informer thinking it had "just listed", so the 410 that greeted its
    return was taken for a server contradicting itself and the relist waited one more
    backoff (up to 30 s with the defaults)."""
    slow = replace(FAST, backoff_initial=2.0, backoff_max=8.0)

    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api, tuning=slow)) as consumer:
                await cut_off_after_watching(api, consumer)
                api.create(svc("late", "10.96.0.20"))
                api.compact()
                await api.start()
                watches = len([r for r in api.requests if r.watch and r.path == SERVICES])
                await eventually(
                    lambda: (
                        len([r for r in api.requests if r.watch and r.path == SERVICES]) > watches
                    ),
                    10.0,
                )
                gone = asyncio.get_running_loop().time()
                # The next backoff step would be 2-4 s; the relist must not wait for it.
                await consumer.until(lambda: "default/late" in consumer.names("Service"), 1.5)
                assert asyncio.get_running_loop().time() - gone < 1.5

    run(scenario)


def test_when_one_informer_reconnects_the_others_stop_waiting_out_their_backoff() -> None:
    """Found by the API outage benchmark: after 10 minutes away, each informer came back
    on its own jittered 15-30 s backoff, so a Service change and its EndpointSlice
    change were programmed seconds apart. The first reconnection now wakes the rest."""
    slow = replace(FAST, backoff_initial=1.0, backoff_max=8.0)

    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api, tuning=slow)) as consumer:
                await cut_off_after_watching(api, consumer)
                await asyncio.sleep(3.5)  # the backoffs grow to 2-8 s, each its own
                await api.start()
                await eventually(lambda: api.watch_count >= 1, 10.0)
                first = asyncio.get_running_loop().time()
                await eventually(lambda: api.watch_count == 4, 10.0)
                assert asyncio.get_running_loop().time() - first < 1.0

    run(scenario)


def test_a_different_cluster_behind_the_same_address_is_relisted_consistently() -> None:
    async def scenario() -> None:
        first = ApiServer(too_large_wait=0.05)
        await first.start()
        populate(first)
        for i in range(20):  # move the first cluster's resourceVersion well ahead
            first.apply(svc("web", f"10.96.0.{10 + i}"))
        async with Consumer(source_for(first)) as consumer:
            await consumer.next_batch()
            await first.stop()
            # etcd restored from an old backup: versions we have seen do not exist yet.
            async with ApiServer(port=first.port, too_large_wait=0.05) as second:
                second.create(svc("web", "10.96.0.10"))
                second.create(svc("other", "10.96.0.30"))
                # Each kind relists on its own (as client-go's informers do): wait for both.
                await consumer.until(
                    lambda: (
                        "default/other" in consumer.names("Service")
                        and not consumer.names("EndpointSlice")
                    )
                )
                assert consumer.names("Service") == {"default/web", "default/other"}
                # After "too large resource version", a consistent read: RV "".
                assert any(r.params.get("resourceVersion") == "" for r in lists(second, SERVICES))

    run(scenario)


# ===================================================================== pagination


def test_lists_are_paginated_with_limit_and_continue() -> None:
    async def scenario() -> None:
        async with ApiServer(watch_cache=False) as api:
            for i in range(250):
                api.create(svc(f"s{i}", f"10.96.{i // 200}.{i % 200 + 1}", f"ns{i % 7}"))
            tuning = replace(FAST, page_size=100)
            async with Consumer(source_for(api, tuning=tuning)) as consumer:
                first = await consumer.next_batch()
                assert len(first) == 250
            pages = lists(api, SERVICES)
            assert [p.params.get("limit") for p in pages] == ["100", "100", "100"]
            assert "continue" not in pages[0].params
            assert all("continue" in p.params for p in pages[1:])

    run(scenario)


def test_an_expired_continue_token_lists_again_from_scratch() -> None:
    async def scenario() -> None:
        async with ApiServer(watch_cache=False) as api:
            for i in range(30):
                api.create(svc(f"s{i}", f"10.96.0.{i + 1}"))
            second_page = api.hold(lambda r: r.path == SERVICES and "continue" in r.params)
            tuning = replace(FAST, page_size=10)
            async with Consumer(source_for(api, tuning=tuning)) as consumer:
                await second_page.arrived.wait()
                # Between two pages: a change, and the snapshot compacted away.
                api.delete("Service", "s0", "default")
                api.create(svc("s30", "10.96.0.31"))
                api.compact()
                second_page.released.set()
                first = await consumer.next_batch()
                names = {n for _, _, n in summary(first)}
                assert names == {f"default/s{i}" for i in range(1, 31)}
            retry = lists(api, SERVICES)[-1]
            assert "limit" not in retry.params and "continue" not in retry.params

    run(scenario)


# ====================================================================== selectors


def test_objects_for_other_proxies_and_headless_ones_are_filtered_by_the_server() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(svc("web", "10.96.0.10"))
            api.create(svc("mesh", "10.96.0.11", **{LABEL_SERVICE_PROXY_NAME: "other"}))
            api.create(svc("headless", "None"))
            api.create(eps("web-1", "web", "10.1.0.1"))
            api.create(eps("mesh-1", "mesh", "10.1.0.2", **{LABEL_SERVICE_PROXY_NAME: "other"}))
            api.create(eps("headless-1", "headless", "10.1.0.3", **{LABEL_HEADLESS: ""}))
            async with Consumer(source_for(api)) as consumer:
                first = await consumer.next_batch()
                # A slice's proxy-name label is not looked at (upstream's selector):
                # the Service's decides.
                assert sorted(summary(first)) == [
                    ("ADDED", "EndpointSlice", "default/mesh-1"),
                    ("ADDED", "EndpointSlice", "default/web-1"),
                    ("ADDED", "Service", "default/web"),
                ]
                # A Service handed over to another proxy is gone for us (the watch
                # cache sends DELETED when an object stops matching the selector).
                api.update(svc("web", "10.96.0.10", **{LABEL_SERVICE_PROXY_NAME: "other"}))
                assert summary(await consumer.next_batch()) == [
                    ("DELETED", "Service", "default/web")
                ]
            (listed,) = lists(api, SERVICES)
            assert listed.params["labelSelector"] == f"!{LABEL_SERVICE_PROXY_NAME}"
            assert listed.params["fieldSelector"] == "spec.clusterIP!=None"
            (listed,) = lists(api, SLICES)
            assert listed.params["labelSelector"] == f"!{LABEL_HEADLESS}"

    run(scenario)


def test_a_configured_proxy_name_takes_its_own_objects_too() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(svc("web", "10.96.0.10"))
            api.create(svc("ours", "10.96.0.11", **{LABEL_SERVICE_PROXY_NAME: "kubeproxy"}))
            api.create(svc("theirs", "10.96.0.12", **{LABEL_SERVICE_PROXY_NAME: "other"}))
            api.create(eps("ours-1", "ours", "10.1.0.2", **{LABEL_SERVICE_PROXY_NAME: "kubeproxy"}))
            api.create(eps("theirs-1", "theirs", "10.1.0.3", **{LABEL_SERVICE_PROXY_NAME: "other"}))
            source = source_for(api, proxy_name="kubeproxy")
            async with Consumer(source) as consumer:
                first = await consumer.next_batch()
                assert sorted(summary(first)) == [
                    ("ADDED", "EndpointSlice", "default/ours-1"),
                    ("ADDED", "EndpointSlice", "default/theirs-1"),
                    ("ADDED", "Service", "default/ours"),
                    ("ADDED", "Service", "default/web"),
                ]
                api.update(svc("ours", "10.96.0.11", **{LABEL_SERVICE_PROXY_NAME: "other"}))
                assert summary(await consumer.next_batch()) == [
                    ("DELETED", "Service", "default/ours")
                ]

    run(scenario)


def test_api_servers_without_the_cluster_ip_field_selector_still_work(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with ApiServer(service_field_selectors=False) as api:
            api.create(svc("web", "10.96.0.10"))
            api.create(svc("headless", "None"))
            async with Consumer(source_for(api)) as consumer:
                first = await consumer.next_batch()
                # Headless Services come through, as Services without ports.
                by_name = {e.new.name: e.new for e in first if isinstance(e.new, Service)}
                assert set(by_name) == {"web", "headless"}
                assert by_name["headless"].ports == ()
            assert "fieldSelector" not in lists(api, SERVICES)[-1].params

    with caplog.at_level(logging.INFO, logger="kubeproxy.sources"):
        run(scenario)
    assert [r for r in caplog.records if "does not support fieldSelector" in r.getMessage()]


# ======================================================================= resilience


def test_an_outage_keeps_the_state_logs_once_and_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                await consumer.until(lambda: api.watch_count == 4)
                await api.stop()
                # Many retries (backoff is 10-50 ms here), not a single event.
                assert await consumer.quiet(0.5) == []
                api.create(svc("late", "10.96.0.20"))
                await api.start()
                assert summary(await consumer.next_batch()) == [
                    ("ADDED", "Service", "default/late")
                ]
                await consumer.until(lambda: api.watch_count == 4)
            # The watches resumed from where they were: no relist.
            assert len(lists(api, SERVICES)) == 1

    with caplog.at_level(logging.DEBUG, logger="kubeproxy.sources"):
        run(scenario)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    failed = [line for line in lines if line.startswith("Cannot ")]
    recovered = [line for line in lines if line.startswith("Reconnected ")]
    assert sorted(line.split(":")[0] for line in failed) == [
        "Cannot watch endpointslices",
        "Cannot watch nodes",
        "Cannot watch servicecidrs",
        "Cannot watch services",
    ]
    assert len(recovered) == 4
    retries = [r for r in caplog.records if r.getMessage().startswith("Still cannot")]
    assert retries, "the outage should have lasted several retries"


def test_errors_from_the_server_are_retried_with_backoff() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            api.fail_with(503, "ServiceUnavailable")
            async with Consumer(source_for(api)) as consumer:
                assert await consumer.quiet(0.2) == []
                api.fail_with(None)
                assert len(await consumer.next_batch()) == 6

    run(scenario)


@pytest.mark.parametrize("mid_line", [False, True], ids=["between-events", "mid-line"])
def test_a_dropped_watch_resumes_from_the_last_version(mid_line: bool) -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                api.create(svc("late", "10.96.0.20"))
                await consumer.next_batch()
                seen = api.rv
                api.drop_watches(mid_line=mid_line)
                await consumer.until(lambda: len(watches(api, SERVICES)) == 2)
                assert await consumer.quiet(0.1) == []
                assert watches(api, SERVICES)[1].params["resourceVersion"] == str(seen)
                api.delete("Service", "late", "default")
                assert summary(await consumer.next_batch()) == [
                    ("DELETED", "Service", "default/late")
                ]
            assert len(lists(api, SERVICES)) == 1

    run(scenario)


def test_bookmarks_advance_the_version_a_watch_resumes_from() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            async with Consumer(source_for(api)) as consumer:
                await consumer.next_batch()
                listed = api.rv
                for i in range(20):  # other resources move the global version on
                    api.create(eps(f"web-{i + 2}", "web", f"10.1.1.{i + 1}"))
                await consumer.until(lambda: len(consumer.names("EndpointSlice")) == 22)
                api.bookmark()
                bookmark = api.rv
                await consumer.quiet(0.05)
                api.compact()  # the services watch's last event is now too old
                api.drop_watches()
                await consumer.until(lambda: len(watches(api, SERVICES)) == 2)
                resumed = watches(api, SERVICES)[1].params["resourceVersion"]
                assert (int(resumed), listed) == (bookmark, bookmark - 20)
                assert await consumer.quiet(0.1) == []
            assert len(lists(api, SERVICES)) == 1  # thanks to the bookmark: no relist

    run(scenario)


def test_a_watch_that_times_out_resumes_after_its_final_bookmark() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            populate(api)
            tuning = replace(FAST, min_watch_timeout=1.0)
            async with Consumer(source_for(api, tuning=tuning)) as consumer:
                await consumer.next_batch()
                api.create(eps("web-2", "web", "10.1.0.5"))
                await consumer.next_batch()
                await consumer.until(lambda: len(watches(api, SERVICES)) == 2, timeout=5)
                resumed = watches(api, SERVICES)[1]
                # The server's final bookmark carried the latest version.
                assert resumed.params["resourceVersion"] == str(api.rv)
                assert resumed.params["timeoutSeconds"] == "1"
            assert len(lists(api, SERVICES)) == 1

    run(scenario)


# ======================================================================== batching


def test_a_flood_of_endpoint_slice_events_is_coalesced_into_few_batches() -> None:
    async def scenario() -> None:
        async with ApiServer() as api:
            api.create(svc("web", "10.96.0.10"))
            # A batch closes after 0.25 s without events, or 2 s after it opened. One
            # per event would be 10,000; a loaded machine stalls the stream now and then
            # (each stall over 0.25 s closes a batch), so the bound leaves room for a
            # dozen stalls rather than asserting this machine's speed.
            tuning = replace(FAST, batch_quiet=0.25, batch_max_delay=2.0)
            async with Consumer(source_for(api, tuning=tuning)) as consumer:
                await consumer.next_batch()
                for i in range(10_000):
                    api.create(eps(f"web-{i}", "web", f"10.2.{i // 250}.{i % 250 + 1}"))
                await consumer.until(
                    lambda: len(consumer.names("EndpointSlice")) == 10_000, timeout=20
                )
                batches = consumer.batches[1:]
                assert sum(len(b) for b in batches) == 10_000
                assert len(batches) <= 20, [len(b) for b in batches]

    run(scenario, timeout=60)
