"""ServiceCIDRs (networking.k8s.io/v1) added and removed on the real API server.

What the real server does: a new ServiceCIDR becomes Ready and its addresses can be
given explicitly or picked by the allocator (which walks the ranges in Go map order, so
an allocated address lands in either range: the test creates Services until one lands in
the new one). Deleting a ServiceCIDR whose addresses are in use leaves it in place with a
deletionTimestamp, its finalizer and ``Ready=False`` (reason ``Terminating``), and the
server refuses new addresses from it; it goes once the last Service using it is deleted.

What the proxy does (nftables mode): traffic to an address of a service range that no
Service has is dropped, the ranges of ServiceCIDR objects included, and a terminating
one too (it is still listed). kubeproxy follows a ServiceCIDR added or gone at its next
sync. Upstream kube-proxy follows it at its next *full* sync (at start, hourly, or
after a failed sync): its ``OnServiceCIDRsChanged`` only records the ranges, and the
drop rule is written on full syncs only. So the test restarts upstream to see it drop a
new range, and sees it still drop a range whose object is gone. kubeproxy's promptness
is a deliberate difference: a new range is protected at once, and a removed one (its
addresses now possibly routed elsewhere) is not black-holed for up to an hour.
"""

from __future__ import annotations

import itertools

import pytest

from kubeproxy.lab.kube.api import ApiError, Obj
from kubeproxy.lab.kube.cluster import KubeLab, wait_for
from tests.realk8s.conftest import answers, service_ip
from tests.realk8s.services.conftest import NODE, NodeProxy, attempt, service, settles_on
from tests.realk8s.test_services import web

_RANGES = itertools.count(1)


def condition(obj: Obj, kind: str) -> Obj:
    """The condition ``kind`` of ``obj`` ({} until the controller has written it)."""
    conditions = (obj.get("status") or {}).get("conditions") or ()
    found: Obj = next((c for c in conditions if c["type"] == kind), {})
    return found


def in_range(kube: KubeLab, namespace: str, prefix: str) -> str:
    """A Service whose ClusterIP the allocator picked from the range starting ``prefix``
    (the others made on the way are deleted); its name."""
    for i in range(40):
        name = f"auto-{i}"
        created = service(kube, namespace, name)
        if created["spec"]["clusterIP"].startswith(prefix):
            return name
        kube.api().delete("Service", name, namespace)
    raise AssertionError(f"40 allocations, none from {prefix}*")


def test_a_service_cidr_added_used_and_removed(
    kube: KubeLab, namespace: str, proxy: NodeProxy
) -> None:
    k = next(_RANGES)
    v4, v6 = f"10.97.{k}.", f"fd00:10:97:{k:x}::"
    name = f"{namespace}-extra"
    (pod,) = web(kube, namespace, "node-a")
    client = kube.add_pod(f"{namespace}-client", NODE, namespace=namespace)
    clients = (client.netns, proxy.node.netns)
    node_a = kube.nodes["node-a"].netns
    # Before: nothing handles these addresses; they go the default way and are refused.
    assert attempt(kube, proxy.node.netns, f"{v4}99", 80) == "refused"

    kube.api().create(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": name},
            "spec": {"cidrs": [f"{v4}0/24", f"{v6}/120"]},
        }
    )
    try:
        wait_for(
            lambda: condition(kube.api().get("ServiceCIDR", name), "Ready").get("status") == "True",
            what=f"ServiceCIDR {name} Ready",
        )
        # Unallocated addresses of the new range: dropped, both families; kubeproxy (on
        # node-a, and on node-b) at its next sync, upstream at its next full sync.
        assert settles_on(kube, node_a, f"{v4}99", 80, "timeout") == "timeout"
        if proxy.upstream is not None:
            assert attempt(kube, proxy.node.netns, f"{v4}99", 80) == "refused"
            proxy.upstream.stop()
            proxy.upstream.start()  # its first sync is a full one
        for netns in clients:
            assert settles_on(kube, netns, f"{v4}99", 80, "timeout") == "timeout"
        assert settles_on(kube, proxy.node.netns, f"{v6}99", 80, "timeout") == "timeout"

        service(kube, namespace, "fixed", clusterIP=f"{v4}10")
        auto = in_range(kube, namespace, v4)
        ips = (f"{v4}10", service_ip(kube, namespace, auto))
        for netns in clients:
            for ip in ips:
                assert answers(kube, netns, ip, 80).pod == pod

        # Deleted while in use: it stays, terminating, refusing new addresses.
        kube.api().delete("ServiceCIDR", name)
        terminating = kube.api().get("ServiceCIDR", name)
        assert terminating["metadata"]["deletionTimestamp"]
        assert terminating["metadata"]["finalizers"] == ["networking.k8s.io/service-cidr-finalizer"]
        wait_for(
            lambda: (
                condition(kube.api().get("ServiceCIDR", name), "Ready").get("reason")
                == "Terminating"
            ),
            what=f"ServiceCIDR {name} Terminating",
        )
        with pytest.raises(ApiError, match="does not match the current range"):
            service(kube, namespace, "late", clusterIP=f"{v4}11")
        for netns in clients:
            for ip in ips:
                assert answers(kube, netns, ip, 80).pod == pod
            assert attempt(kube, netns, f"{v4}99", 80) == "timeout"

        # The last Services gone, so is the ServiceCIDR.
        for svc in ("fixed", auto):
            kube.api().delete("Service", svc, namespace)
        wait_for(lambda: not exists(kube, name), what=f"ServiceCIDR {name} gone")
    finally:
        kube.api().delete("ServiceCIDR", name)

    # kubeproxy no longer drops the range: its addresses are refused again.
    assert settles_on(kube, node_a, f"{v4}99", 80, "refused") == "refused"
    if proxy.upstream is not None:
        # Upstream: the drop rule stays until its next full sync.
        assert attempt(kube, proxy.node.netns, f"{v4}99", 80) == "timeout"
        assert attempt(kube, proxy.node.netns, f"{v6}99", 80) == "timeout"
    else:
        assert settles_on(kube, proxy.node.netns, f"{v4}99", 80, "refused") == "refused"
        assert settles_on(kube, proxy.node.netns, f"{v6}99", 80, "refused") == "refused"


def exists(kube: KubeLab, name: str) -> bool:
    try:
        kube.api().get("ServiceCIDR", name)
    except ApiError as err:
        if err.code == 404:
            return False
        raise
    return True
