"""Faults of the real control plane, with kubeproxy on every node and traffic flowing.

One restart of kube-apiserver (SIGTERM, as a static Pod's restart; the lab kills it after
10 s when open watches keep it up, as upstream's client-go watches do too) serves two
checks, since each restart costs about 20 s:

* **restarted under traffic**: a Pod on node-a connects to a Service every 20 ms
  throughout; kubeproxy keeps its rules (not one connect fails), reconnects, and a change
  made after the restart is programmed;
* **a watch resumed past compaction** gets 410 Gone and kubeproxy relists: node-c's
  kubeproxy is frozen (SIGSTOP) with its watches cut, a Service is deleted and another
  created, etcd is compacted, the API server restarts, then kubeproxy thaws. Its watches
  resume at a resourceVersion the server no longer has; only a relist can tell it that
  the first Service is gone, and its log at --v=2 says it relisted, and why. The
  restart is what makes the 410 here: with the API server's watch cache (the default),
  compaction alone does not fail a resumed watch (tried: etcd compacted after writes,
  kubeproxy's connections cut with ``ss -K``: the watches resumed from the cache, 200).
  A new API server's cache starts at the current revision and etcd's history below it
  is compacted, so the server answers 410 either way; that is when real clusters see it.

* **kube-controller-manager stopped**: the last EndpointSlices keep serving (a Pod made
  meanwhile gets no endpoint and no traffic, every connect still answered); started
  again, it publishes the Pod and kubeproxy sends traffic to it.

Each fault is undone by the test that made it (the session's cluster is shared).
"""

from __future__ import annotations

import os
import signal
import time

from kubeproxy.lab.connects import ConnectProbe
from kubeproxy.lab.kube.cluster import API_PORT, CP_IP, KubeLab, wait_for
from kubeproxy.lab.netns import ns_exec
from tests.realk8s.conftest import answers, ask, proxy_log, service_ip, settle
from tests.realk8s.opslab import proxy_pid


def service(kube: KubeLab, namespace: str, name: str, app: str = "web") -> str:
    """A ClusterIP Service ``name`` selecting Pods app=``app``, port 80 -> 8080; its IP."""
    kube.api().create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"app": app}, "ports": [{"port": 80, "targetPort": 8080}]},
        }
    )
    return service_ip(kube, namespace, name)


def silent(kube: KubeLab, netns: str, ip: str) -> bool:
    """Nothing answers ``ip``:80 from ``netns`` (refused, dropped or unreachable)."""
    try:
        ask(kube, netns, ip, 80)
    except OSError:
        return True
    return False


def test_api_server_restart_under_traffic_and_a_watch_resumed_past_compaction(
    kube: KubeLab, namespace: str
) -> None:
    """One restart of the API server for two things (it costs ~20 s): node-a's kubeproxy
    rides it out under traffic; node-c's, frozen through it, comes back to a compacted
    history and relists."""
    web = kube.add_pod(f"{namespace}-web-0", "node-b", namespace=namespace, labels={"app": "web"})
    ip = service(kube, namespace, "web")
    old = service(kube, namespace, "old")
    client = kube.add_pod(f"{namespace}-client", "node-a", namespace=namespace)
    assert answers(kube, client.netns, ip, 80).pod == web.name
    node_c = kube.nodes["node-c"].netns
    assert answers(kube, node_c, old, 80).pod == web.name
    log_a, log_c = len(proxy_log(kube, "node-a")), len(proxy_log(kube, "node-c"))
    frozen = proxy_pid(kube, "node-c")
    with ConnectProbe(client.netns, ip, 80, interval=0.02) as probe:
        os.kill(frozen, signal.SIGSTOP)
        try:
            # node-c's watches cut while it cannot notice: it misses what follows.
            ns_exec(node_c, "ss", "-K", "dst", CP_IP, "dport", "=", str(API_PORT))
            kube.api().delete("Service", "old", namespace)
            new = service(kube, namespace, "new")
            wait_for(
                lambda: kube.api().list_of(
                    "EndpointSlice", namespace, labelSelector="kubernetes.io/service-name=new"
                ),
                what="the new Service's EndpointSlice",
            )
            kube.cp.compact()
            down = time.monotonic()
            kube.cp.stop("kube-apiserver")
            kube.cp.start("kube-apiserver")
            kube.cp.wait_ready()
            up = time.monotonic()
        finally:
            os.kill(frozen, signal.SIGCONT)
        # A change after the restart reaches node-a's rules: an endpoint on node-c.
        late = kube.add_pod(
            f"{namespace}-web-1", "node-c", namespace=namespace, labels={"app": "web"}
        )
        wait_for(
            lambda: any(a.outcome == late.name for a in probe.attempts if a.at > up),
            timeout=60,
            what="the Pod made after the restart answering",
        )
    # node-a: its rules served throughout; it lost the API server and found it again.
    assert probe.failures() == []
    assert sum(1 for a in probe.attempts if down <= a.at <= up and a.ok) > 0
    assert "Reconnected to the API server" in proxy_log(kube, "node-a")[log_a:]
    # node-c: only a relist can tell it "old" is gone; it says why it relisted.
    wait_for(lambda: silent(kube, node_c, old), timeout=60, what="the deleted Service gone")
    assert answers(kube, node_c, new, 80, timeout=60).pod in (web.name, late.name)
    relists = [
        line
        for line in proxy_log(kube, "node-c")[log_c:].splitlines()
        if " services at resourceVersion " in line and " again (" in line
    ]
    assert relists and all("HTTP 410" in line for line in relists), relists


def test_controller_manager_stopped_then_started(kube: KubeLab, namespace: str) -> None:
    first = kube.add_pod(f"{namespace}-web-0", "node-b", namespace=namespace, labels={"app": "web"})
    ip = service(kube, namespace, "web")
    client = kube.add_pod(f"{namespace}-client", "node-a", namespace=namespace)
    assert answers(kube, client.netns, ip, 80).pod == first.name
    with ConnectProbe(client.netns, ip, 80, interval=0.02) as probe:
        kube.cp.stop("kube-controller-manager")
        try:
            # No controller: the Pod gets no endpoint, the last EndpointSlice serves on.
            second = kube.add_pod(
                f"{namespace}-web-1", "node-c", namespace=namespace, labels={"app": "web"}
            )
            stopped = time.monotonic()
            settle(2.0)
            (only,) = kube.api().list_of("EndpointSlice", namespace)
            assert [e["addresses"] for e in only["endpoints"]] == [[first.ips[0]]]
            seen = {a.outcome for a in probe.attempts if a.at >= stopped}
            assert seen == {first.name}
        finally:
            kube.cp.start("kube-controller-manager")
        back = time.monotonic()
        wait_for(
            lambda: any(a.outcome == second.name for a in probe.attempts if a.at > back),
            timeout=60,
            what="the Pod published once the controller is back",
        )
    assert probe.failures() == []
