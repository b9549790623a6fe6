"""IPVS tests: they run inside a user-mode-linux guest, a real kernel with IPVS.

On the host (``./scripts/test``, CI, ``.venv/bin/pytest tests/ipvs``) nothing here touches
the kernel: the selected tests are handed to ONE guest running one pytest session, and
each is reported on the host with the guest's outcome (:mod:`tests.ipvs.guest_session`).
Inside the guest (:func:`kubeproxy.lab.uml.in_guest`) they run for real, each in fresh
namespaces it deletes by name. The guest's nf_tables has no ip/ip6/inet families, so
nothing here uses ``nft``, and iptables is the legacy variant (:data:`IPTABLES`).
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from kubeproxy.backends.ipvs.proxier import IpvsBackend, sysctls
from kubeproxy.backends.ipvs.proxier import cleanup as ipvs_cleanup
from kubeproxy.config.runtime import IpvsSettings, ProxyConfig
from kubeproxy.dataplane.ipset import IpsetCommand
from kubeproxy.dataplane.iptables.runner import IptablesCommand
from kubeproxy.dataplane.ipvs.netlink import NetlinkIpvs, NetlinkLinks
from kubeproxy.lab import uml
from kubeproxy.lab.cluster import CLUSTER_CIDRS, NODE, NODE_IP, NODE_IP6, Lab
from kubeproxy.lab.echo import tcp_ask
from kubeproxy.lab.netns import list_netns, temporary_netns
from kubeproxy.lab.netns import sysctls as set_sysctls
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.state import NodeState, Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort
from tests.ipvs import guest_session
from tests.unit.conftest import port_name

HERE = Path(__file__).parent
# The guest's kernel has no nf_tables ip/ip6/inet tables: iptables-nft fails there.
IPTABLES = "iptables-legacy"
IP6TABLES = "ip6tables-legacy"

# name -> IPv4 of an echo Pod on node-a (the proxy's node).
BACKENDS = {"backend-1": "10.244.1.10", "backend-2": "10.244.1.11"}
_LABS = itertools.count()


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: only the chosen tests go in
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.ipvs)
    if not uml.in_guest():
        guest_session.replace_items(config, items, HERE)


def pytest_runtestloop(session: pytest.Session) -> None:
    if not uml.in_guest():
        guest_session.start(session.config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if uml.in_guest():
        guest_session.record(report)


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    """node-a, node-b and an outside client, with two echo Pods on node-a."""
    prefix = f"kpv{os.getpid() % 100000}x{next(_LABS)}"
    with Lab(prefix) as built:
        for name, ip in BACKENDS.items():
            built.add_pod(name, NODE, [ip])
        yield built
    leftovers = [ns for ns in list_netns() if ns.startswith(prefix)]
    assert not leftovers, f"namespaces left behind: {leftovers}"


@pytest.fixture
def netns() -> Iterator[str]:
    """One empty namespace (loopback up), deleted by name afterwards."""
    with temporary_netns(f"kpv{os.getpid() % 100000}n{next(_LABS)}") as name:
        yield name


# ---------------------------------------------------- ipvs mode's backend, in node-a

Build = Callable[..., IpvsBackend]
T = TypeVar("T")
WEB = port_name("web")
VIP = "10.96.0.10"
B1, B2 = BACKENDS["backend-1"], BACKENDS["backend-2"]


def config(
    scheduler: str = "rr",
    family: IPFamily = IPFamily.IPv4,
    exclude_cidrs: tuple[str, ...] = (),
    **fields: object,
) -> ProxyConfig:
    """node-a's ipvs mode; ``fields`` override other ProxyConfig fields."""
    settings: dict[str, object] = {
        "hostname": NODE,
        "mode": "ipvs",
        "families": (family,),
        "cluster_cidrs": CLUSTER_CIDRS,
        "nodeport_addresses": NodePortAddresses((), primary=False),
        "ipvs": IpvsSettings(scheduler=scheduler, exclude_cidrs=exclude_cidrs),
    }
    settings.update(fields)
    return ProxyConfig(**settings)  # type: ignore[arg-type]


def snap(*ports: tuple[ServicePort, tuple[Endpoint, ...]], zone: str | None = None) -> Snapshot:
    node = NodeState(NODE, zone, {IPFamily.IPv4: NODE_IP, IPFamily.IPv6: NODE_IP6})
    return Snapshot({p.name: p for p, _ in ports}, {p.name: e for p, e in ports}, node)


def web(**kw: object) -> ServicePort:
    fields: dict[str, object] = {"name": WEB, "cluster_ips": (VIP,), "port": 80}
    fields.update(kw)
    return ServicePort(**fields)  # type: ignore[arg-type]


def eps(*ips: str, port: int = 8080) -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip, port, NODE) for ip in ips)


@pytest.fixture
def make(lab: Lab, tmp_path: Path) -> Iterator[Build]:
    """A factory of backends for node-a; what they programmed is cleaned up after."""
    # The namespace's own sysctls (the backend's /proc is the guest's root namespace).
    set_sysctls(
        lab.node_ns,
        {
            "net.ipv4.vs.conntrack": "1",
            "net.ipv4.vs.expire_nodest_conn": "1",
            "net.ipv4.vs.expire_quiescent_template": "1",
        },
    )
    for path, _ in sysctls(config(), (6, 1)):
        (tmp_path / "sys" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / path).write_text("1\n")
    ns = lab.node_ns
    ipvs = NetlinkIpvs(ns)
    links = NetlinkLinks(ns)
    runners = {f: IptablesCommand(f, "legacy", netns=ns) for f in IPFamily}

    def build(cfg: ProxyConfig, clock: Callable[[], float] = time.monotonic) -> IpvsBackend:
        backend = IpvsBackend(
            cfg,
            open_ipvs=lambda: ipvs,
            links=links,
            ipset=IpsetCommand(ns),
            runners={f: runners[f] for f in cfg.families},
            proc=tmp_path,
            clock=clock,
        )
        backend.start()
        return backend

    yield build
    ipvs_cleanup(ipvs, links, IpsetCommand(ns), list(runners.values()))
    ipvs.close()
    links.close()


def asks(lab: Lab, ns: str, ip: str, port: int, count: int) -> list[str]:
    ex = lab.executor(ns)
    return [ex.call(tcp_ask, ip, port).pod for _ in range(count)]


def until_listening(connect: Callable[[], T], seconds: float = 20) -> T:
    """``connect`` again while the server a Pod thread is starting refuses (the guest
    can take seconds to schedule it when the machine is busy)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return connect()
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def hold(port: int) -> None:
    """In a Pod: accept one connection, answer what it sends, upper-cased."""
    with socket.create_server(("0.0.0.0", port)) as server:
        server.settimeout(30)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(30)
            conn.sendall(conn.recv(16).upper())


def cleanup_ns(ns: str) -> None:
    ipvs = NetlinkIpvs(ns)
    links = NetlinkLinks(ns)
    try:
        # kubeproxy run serves both families here: ip6tables rules use the KUBE-6- sets.
        runners = [IptablesCommand(f, "legacy", netns=ns) for f in IPFamily]
        ipvs_cleanup(ipvs, links, IpsetCommand(ns), list(runners))
    finally:
        ipvs.close()
        links.close()
