"""ClusterIPs and NodePorts: kubeproxy's allocation against the real kube-apiserver's.

The same Services, in the same order, go to kube-apiserver (created through the API of a
control plane with small ranges, :func:`~kubeproxy.lab.kube.controlplane.lone_control_plane`)
and to kubeproxy's :class:`~kubeproxy.controlplane.standalone.StandaloneCluster` (what
``kubeproxy run --manifests`` allocates with), and their answers are compared step by step.
Dynamic addresses and ports are random on both sides, so for those the *properties* are
compared: the band (static or dynamic, KEP-3070/3668) each side took it from, that it lies
in a ready ServiceCIDR of the right family (or in the port range) and that no other live
Service holds it; everything else must be equal: accepted or refused and the reason's
category (:func:`reason_of`), families and policy, requested addresses and ports honoured,
nodePorts shared between ports of the same number, the count at which a range is full.

Map:

* :mod:`.allocsides` — :class:`~.allocsides.Outcome`, what one create came to, on either
  side; :class:`~.allocsides.RealSide` / :class:`~.allocsides.OurSide`, the two
  allocators behind one small interface: create, delete, and the ServiceCIDR objects
  (ours get them as the API server shows them, status and deletion included).
* :mod:`.allocscenario` — the small ranges (:data:`SERVICE_CIDRS`...), and
  :class:`~.allocscenario.Scenario`: requests, each chosen against both sides' state (an
  explicit address "free in the dynamic band" must be free on *both* sides, whose random
  picks differ): dynamic and explicit ClusterIPs in either band, taken ones, ones
  outside every range, network/broadcast/all-ones addresses, dual-stack with one or two
  explicit addresses, headless Services, family mismatches, NodePorts (dynamic,
  explicit, taken, outside the range, shared by TCP and UDP), healthCheckNodePorts,
  LoadBalancers without nodePorts, deletions. ``Scenario.tour`` asks each kind once,
  ``Scenario.random_step`` one drawn from a seeded generator.

In this module:

* :func:`run` — a scenario against a running control plane: the tour, random steps, each
  range filled until full, then a second ServiceCIDR around the first (its edges become
  ordinary addresses; both fill it) deleted while in use. Dual-stack, or single-stack
  (every IPv6 request must then be refused for the same reason).
* :func:`twin_service_cidrs_deleted` — a difference kept on purpose, shown: two
  ServiceCIDRs of one CIDR, both being deleted, still give addresses upstream.

Where upstream itself is nondeterministic (the order it tries ServiceCIDRs in, and which
family's error it reports when both fail) the scenario avoids asking or the comparison
accepts each possible answer; docs/controlplane.md lists what differs and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kubeproxy.controlplane.ipallocator import parse_cidr
from kubeproxy.lab.kube.allocscenario import (
    NODE_PORT_RANGE,
    SERVICE_CIDRS,
    Scenario,
    cidr_family,
    service,
)
from kubeproxy.lab.kube.allocsides import (
    OurSide,
    Outcome,
    RealSide,
)
from kubeproxy.lab.kube.api import Api, ApiError, Obj
from kubeproxy.lab.kube.cluster import wait_for

#: The ServiceCIDRs the last phase adds (each contains the flag's range of its family).
WIDER_CIDRS = ("10.100.0.0/26", "fd00:100::/122")
#: The flags that give the lone control plane these ranges (besides the ClusterIP ones).
APISERVER_ARGS = {"kube-apiserver": ("--service-node-port-range", NODE_PORT_RANGE)}


def service_cidr_objects(api: Api) -> list[Obj]:
    return [
        {k: v for k, v in o.items() if k in ("apiVersion", "kind", "metadata", "spec", "status")}
        for o in api.list_of("ServiceCIDR")
    ]


def run(
    api: Api,
    seed: int,
    *,
    steps: int = 60,
    namespace: str | None = None,
    service_cidrs: Sequence[str] = SERVICE_CIDRS,
    settle: bool = True,
) -> Scenario:
    """One scenario against the control plane behind ``api``, started with
    ``service_cidrs`` (:data:`SERVICE_CIDRS`, or its IPv4 range alone for a single-stack
    cluster) and :data:`APISERVER_ARGS`; everything it creates is deleted, and (``settle``)
    gone before it returns, as the next scenario needs."""
    namespace = namespace or f"alloc-{seed}"
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    real = RealSide(api, namespace)
    ours = OurSide(service_cidrs, NODE_PORT_RANGE, seed)
    kubernetes = api.get("Service", "kubernetes", "default")
    # The API server's own Service holds the first address of the primary range.
    real.held["kubernetes"] = Outcome.of(kubernetes)
    ours.adopt(kubernetes)
    ours.sync_service_cidrs(service_cidr_objects(api))
    scenario = Scenario(seed, real, ours, service_cidrs=service_cidrs)
    np_families = [scenario.configured[-1]]
    try:
        scenario.tour()
        for _ in range(steps):
            scenario.random_step()
        # Each range until full: IPv4, IPv6, then the nodePorts (on the last family's
        # addresses, free again).
        scenario.fill("fill IPv4", service)
        scenario.fill("fill IPv6", lambda n: service(n, ipFamilies=["IPv6"]))
        scenario.clear()
        scenario.fill(
            "fill nodePorts", lambda n: service(n, type="NodePort", ipFamilies=np_families)
        )
        scenario.clear()
        wider_cidrs(scenario, api)
    finally:
        scenario.clear()
        for name in [n for n in real.held if n != "kubernetes"]:
            real.delete(name)
        cleanup_service_cidrs(api, wait=settle)
        api.delete("Namespace", namespace)
    return scenario


def wider_cidrs(scenario: Scenario, api: Api) -> None:
    """A second ServiceCIDR containing the first: addresses that were its network or
    broadcast address are hosts now; both fill it; then it is deleted while in use."""
    api.create(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "wider"},
            "spec": {"cidrs": [c for c in WIDER_CIDRS if cidr_family(c) in scenario.configured]},
        }
    )
    probe_ip = str(parse_cidr(WIDER_CIDRS[0]).network_address + 40)
    _wait_allocatable(api, scenario.real.namespace, probe_ip, True)
    scenario.ours.sync_service_cidrs(service_cidr_objects(api))
    scenario.multi_cidr = True
    for cidr in WIDER_CIDRS:
        scenario.extra_cidrs[cidr_family(cidr)].append(cidr)
    v4 = parse_cidr(SERVICE_CIDRS[0])
    scenario.ask(
        "explicit: the first range's broadcast address",
        service(scenario._name(), clusterIP=str(v4.broadcast_address)),
    )
    scenario.ask(
        "explicit: only in the wider range",
        service(scenario._name(), clusterIP=str(v4.broadcast_address + 2)),
    )
    scenario.fill("fill IPv4 over both ranges", service)
    # Deleted while in use: it stays (a finalizer) until its addresses are released, and
    # takes no new ones meanwhile.
    api.delete("ServiceCIDR", "wider")
    _wait_allocatable(api, scenario.real.namespace, str(v4.broadcast_address + 20), False)
    scenario.ours.sync_service_cidrs(service_cidr_objects(api))
    scenario.clear()
    scenario.ours.sync_service_cidrs(service_cidr_objects(api))
    scenario.multi_cidr = False
    scenario.ask(
        "explicit: only in the deleted range",
        service(scenario._name(), clusterIP=str(v4.broadcast_address + 3)),
    )


def _wait_allocatable(api: Api, namespace: str, ip: str, want: bool) -> None:
    """Until the API server's allocator does (or no longer does) take ``ip`` (it learns of
    ServiceCIDR changes from a watch); a probe Service that got it is deleted at once."""

    def probe() -> bool:
        name = "probe"
        try:
            api.create(
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": name, "namespace": namespace},
                    "spec": {"clusterIP": ip, "ports": [{"port": 80}]},
                }
            )
        except ApiError:
            return not want
        api.delete("Service", name, namespace)
        return want

    wait_for(probe, timeout=30, what=f"the API server {'taking' if want else 'refusing'} {ip}")


def cleanup_service_cidrs(api: Api, *, wait: bool = True) -> None:
    """Every ServiceCIDR but the API server's own deleted, and (``wait``) gone:
    kube-controller-manager lifts the finalizer of one being deleted some seconds after
    no Service holds its addresses any more."""

    def others() -> list[str]:
        return [
            n for o in api.list_of("ServiceCIDR") if (n := o["metadata"]["name"]) != "kubernetes"
        ]

    for name in others():
        api.delete("ServiceCIDR", name)
    if wait:
        wait_for(lambda: not others(), timeout=60, what="the added ServiceCIDRs gone")


def summarize(scenarios: Iterable[Scenario]) -> str:
    lines = []
    for s in scenarios:
        lines.append(f"seed {s.seed}: {len(s.steps)} requests, {len(s.differences)} differences")
        lines += [f"  {d}" for d in s.differences]
    return "\n".join(lines)


# A difference kept on purpose: two ServiceCIDRs of one CIDR, both being deleted.
TWIN_CIDR = "10.100.1.0/28"
SENTINEL_CIDR = "10.100.2.0/28"


def twin_service_cidrs_deleted(
    api: Api, service_cidrs: Sequence[str] = SERVICE_CIDRS, namespace: str = "twins"
) -> tuple[Outcome, Outcome]:
    """Two ServiceCIDRs naming one CIDR, both deleted while one of its addresses is in
    use; then a request for another address of it: kube-apiserver's answer and ours.

    Upstream's allocator for a CIDR turns not-ready only when the ServiceCIDR being
    deleted is the one ServiceCIDR it knows by name, and forgets a name only when its
    object is gone: with two, the CIDR keeps taking new addresses while both are being
    deleted. Ours stops, as for one (docs/controlplane.md says why).
    """
    twin, sentinel = parse_cidr(TWIN_CIDR), parse_cidr(SENTINEL_CIDR)
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    real = RealSide(api, namespace)
    try:
        for name, cidr in (
            ("twin-a", TWIN_CIDR),
            ("twin-b", TWIN_CIDR),
            ("sentinel", SENTINEL_CIDR),
        ):
            api.create(
                {
                    "apiVersion": "networking.k8s.io/v1",
                    "kind": "ServiceCIDR",
                    "metadata": {"name": name},
                    "spec": {"cidrs": [cidr]},
                }
            )
        for net in (twin, sentinel):
            _wait_allocatable(api, namespace, str(net.network_address + 5), True)
            # Held: the ServiceCIDRs cannot finish deleting.
            real.create(
                service(f"holder-{net.network_address}", clusterIP=str(net.network_address + 2))
            )
        for name in ("twin-a", "twin-b", "sentinel"):
            api.delete("ServiceCIDR", name)
        # The API server learns of ServiceCIDRs from one watch, in order: once it refuses
        # the sentinel's addresses it has seen both twins being deleted too.
        _wait_allocatable(api, namespace, str(sentinel.network_address + 6), False)
        request = service("after", clusterIP=str(twin.network_address + 7))
        ours = OurSide(service_cidrs, NODE_PORT_RANGE, 0)
        ours.sync_service_cidrs(service_cidr_objects(api))
        return real.create(request), ours.create(request)
    finally:
        for name in list(real.held):
            real.delete(name)
        cleanup_service_cidrs(api, wait=False)
        api.delete("Namespace", namespace)


__all__ = [
    "APISERVER_ARGS",
    "SERVICE_CIDRS",  # from .allocscenario: the ranges a control plane for run() is given
    "cleanup_service_cidrs",
    "run",
    "service_cidr_objects",
    "summarize",
    "twin_service_cidrs_deleted",
    "wider_cidrs",
]
