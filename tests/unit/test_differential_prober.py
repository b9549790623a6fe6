"""The differential test's prober: which asks may run at once (no namespaces needed)."""

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubeproxy.lab.kube.differential import probes
from kubeproxy.lab.kube.differential.probes import Budget, Origin, Probe, Prober
from kubeproxy.lab.kube.differential.states import PortState, ServiceState, State


class _Executor(ThreadPoolExecutor):
    """A NetnsExecutor's interface, threads in this namespace."""

    def __init__(self, name: str, workers: int = 4) -> None:
        super().__init__(workers)


def test_sticky_asks_of_one_service_port_from_one_origin_never_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its frontends share the affinity memory: two first asks at once (a ClusterIP's and
    # an externalTrafficPolicy: Local load-balancer IP's) put the client in two
    # endpoints' sets, and the ClusterIP's next asks went to the other endpoint.
    events: list[tuple[str, str, Probe]] = []
    lock = threading.Lock()

    def sticky(probe: Probe, budget: Budget) -> Counter[str]:
        with lock:
            events.append(("enter", probe.origin, probe))
        time.sleep(0.01)  # room for another thread to start, were it allowed to
        with lock:
            events.append(("exit", probe.origin, probe))
        return Counter({"distinct=1": 3})

    monkeypatch.setattr(probes, "NetnsExecutor", _Executor)
    monkeypatch.setattr(probes, "sticky_counts", sticky)
    monkeypatch.setattr(probes, "probe_counts", lambda p, b, forget=None: Counter({"a@x": 1}))
    frontends = [("cluster-ip", "10.96.0.10"), ("lb-ip", "198.51.100.1"), ("node-port", "n")]
    asked = [
        Probe(1, "svc", "p", kind, origin, "UDP", ip, 53, affinity=True)
        for kind, ip in frontends
        for origin in ("outside", "node")
    ] + [Probe(1, "other", "p", "cluster-ip", "outside", "TCP", "10.96.0.11", 80)]
    prober = Prober([Origin(o, o, ("", "")) for o in ("outside", "node")], workers=8)
    try:
        record = prober.run(asked, Budget(), lambda: None)
    finally:
        prober.close()
    assert {f"{p.key} sticky" for p in asked if p.affinity} <= set(record)
    for origin in ("outside", "node"):
        mine = [(what, p) for what, o, p in events if o == origin]
        # enter A, exit A, enter B, exit B...: one at a time.
        assert [w for w, _ in mine] == ["enter", "exit"] * 3
        assert all(mine[i][1] == mine[i + 1][1] for i in range(0, len(mine), 2))


def test_a_load_balancer_ingress_by_hostname_only_has_nothing_to_ask() -> None:
    """An ingress with a hostname and no ip (an AWS ELB's) crashed the probe matrix
    (``KeyError: 'ip'``): it is skipped, the ingress IPs beside it are asked."""
    svc = ServiceState(
        "lb", "LoadBalancer", "SingleStack", ("IPv4",), (PortState("http", "TCP", 80, 8080),), {}
    )
    state = State(1, 0, "node-a", (), (svc,))
    ingress = [{"hostname": "lb.example.com"}, {"ip": "198.51.100.7"}]
    live = {
        "lb": {
            "spec": {
                "clusterIPs": ["10.96.0.7"],
                "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
            },
            "status": {"loadBalancer": {"ingress": ingress}},
        }
    }
    geometry = probes.Geometry(("172.31.0.10", "fd00:31::10"), ("10.244.0.1", "fd00:10:244::1"))
    kinds = {(f.kind, f.ip) for f in probes.frontends(state, live, geometry)}
    assert kinds == {("cluster-ip", "10.96.0.7"), ("lb-ip", "198.51.100.7")}


def test_udp_asks_never_reuse_an_earlier_asks_source_port() -> None:
    # A repeated source port would follow the earlier ask's conntrack entry (a NodePort's
    # UDP flows outlive the loss of its last serving endpoint, in both proxies).
    import socket

    seen: list[int] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", 0))
        server.settimeout(5)

        def answer() -> None:
            for _ in range(3):
                _, peer = server.recvfrom(16)
                seen.append(peer[1])
                server.sendto(b"echo", peer)

        thread = threading.Thread(target=answer)
        thread.start()
        port = server.getsockname()[1]
        for _ in range(3):
            assert probes.udp_ask_connected("127.0.0.1", port, 5) == b"echo"
        thread.join()
    assert len(set(seen)) == 3
    assert all(p in probes.UDP_SOURCE_PORTS for p in seen)
