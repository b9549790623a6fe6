"""Hand-made states for the differences the differential test found, kept as regressions.

Each :class:`Case` names a probe (a Service of a pinned state, a frontend kind, an
origin, a protocol) and the outcomes upstream kube-proxy gives it; CI runs these states
with the fixed seeds (tests/realk8s/test_differential.py), and kubeproxy must give the
same outcomes. docs/differences-from-upstream.md lists what each one was.

Pinned states use seeds from :data:`FIRST_SEED` on (never generated ones) and the Pods
of the pool by position: ``slots`` are the pool's, grouped by node in name order, the
node under comparison's first.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from kubeproxy.lab.kube.differential.states import (
    PROXY_NAME_LABEL,
    PodState,
    PortState,
    ServiceState,
    SliceEndpointState,
    SliceState,
    Slot,
    State,
    external_ip,
    lb_ip,
)

FIRST_SEED = 900000


@dataclass(frozen=True)
class Case:
    name: str
    seed: int
    service: str
    kind: str
    origin: str
    protocol: str
    family: str  # "IPv4" or "IPv6": of the probe's destination
    # What upstream answers, by mode (outcome words as the probes record them).
    want: dict[str, frozenset[str]]
    # One port of the Service (by name); None: every port.
    port: str | None = None

    def selects(self, key: str) -> bool:
        """Whether a probe key (:attr:`~.probes.Probe.key`) is one of this case's."""
        words = key.split()
        if len(words) != 7 or words[0] != f"s{self.seed}":
            return False
        family = "IPv6" if words[4].count(":") > 1 else "IPv4"
        service, _, port = words[1].partition(":")
        return (
            service == self.service
            and self.port in (None, port)
            and words[2] == self.kind
            and words[3] == self.protocol
            and words[6] == self.origin
            and family == self.family
        )

    def expected(self, mode: str) -> frozenset[str] | None:
        """Upstream's outcomes in ``mode``; None when the case does not say (its probes
        must still agree with upstream's)."""
        return self.want.get(mode)

    def as_said(self, mode: str, outcomes: Collection[str]) -> bool:
        """Whether upstream's ``outcomes`` of a probe are what the case says of ``mode``
        (:data:`SERVED`: Pods answered, whichever; the Pods' names vary by run)."""
        want = self.expected(mode)
        if want is None:
            return True
        if want == SERVED:
            return bool(outcomes) and all("@" in o for o in outcomes)
        return set(outcomes) == want


REFUSED = frozenset({"refused"})
TIMEOUT = frozenset({"timeout"})
SERVED = frozenset({"<Pods answer>"})
BOTH = ("nftables", "iptables")

CASES: tuple[Case, ...] = (
    # The node's own connection to its NodePort of a Service without endpoints: refused
    # on arrival (input), not dropped on its way out (kubeproxy's nftables mode said
    # EPERM: its no-endpoint NodePort check ran on the output path too).
    *(
        Case("node-to-own-nodeport-without-endpoints", FIRST_SEED, "empty", "node-port",
             "node", protocol, family, {"nftables": REFUSED, "iptables": REFUSED})
        for protocol in ("TCP", "UDP")
        for family in ("IPv4", "IPv6")
    ),
    # An IPv6-only Service's health check does not answer on IPv4: upstream runs one
    # health server per family (kubeproxy listened on every family).
    Case("health-check-of-an-ipv6-only-service", FIRST_SEED, "six", "health", "outside",
         "HTTP", "IPv4", {"nftables": REFUSED, "iptables": REFUSED}),
    Case("health-check-of-an-ipv6-only-service", FIRST_SEED, "six", "health", "outside",
         "HTTP", "IPv6", {"nftables": frozenset({"http-200-local=1"}),
                          "iptables": frozenset({"http-200-local=1"})}),
    # internalTrafficPolicy Local, dual-stack, an IPv6-only external IP, and this node's
    # endpoint not ready (differential seed 1095, ipvs): upstream's IPv4 ServicePort is
    # not externally accessible, so ipvs mode has no cluster endpoints to fall back to
    # and refuses. kubeproxy counted the IPv6 external IP in IPv4 too and forwarded the
    # IPv4 ClusterIP's traffic to node-b.
    *(
        Case("internal-local-with-an-external-ip-of-the-other-family", FIRST_SEED, "lsix",
             "cluster-ip", origin, "TCP", "IPv4", {"ipvs": REFUSED})
        for origin in ("pod-local", "outside")
    ),
    # Hand-written EndpointSlices (selector-less Services), shapes the EndpointSlice
    # controller never makes but the API server accepts (issue 42's hand-made states).
    # One Pod IP in two slices, terminating (still serving) in one and not ready in the
    # other (a reused Pod IP): upstream keeps the non-terminating copy and refuses;
    # kubeproxy let the first slice's serving copy take the traffic.
    Case("same-address-in-two-slices", FIRST_SEED, "dup", "cluster-ip", "pod-local", "TCP",
         "IPv4", dict.fromkeys(BOTH, REFUSED)),
    # A slice port 0 beside a good one: upstream skips that port only (kubeproxy dropped
    # the slice): the Service's port it stands for has no endpoints.
    Case("a-slice-port-0-beside-a-good-one", FIRST_SEED, "zero", "cluster-ip", "pod-local",
         "TCP", "IPv4", dict.fromkeys(BOTH, SERVED), port="http"),
    Case("a-slice-port-0-beside-a-good-one", FIRST_SEED, "zero", "cluster-ip", "pod-local",
         "TCP", "IPv4", dict.fromkeys(BOTH, REFUSED), port="other"),
    # An endpoint zone with a space and a slash and a zone hint "": unchecked by the
    # API server (a hint is a label value), only compared by upstream, which serves
    # (kubeproxy refused the slice).
    Case("odd-zones-in-a-slice", FIRST_SEED, "zones", "cluster-ip", "pod-local", "TCP",
         "IPv4", dict.fromkeys(BOTH, SERVED)),
    # The proxy-name label on a slice only: upstream filters slices by the headless label
    # alone, and serves (kubeproxy filtered the slice out).
    Case("proxy-name-on-the-slice-only", FIRST_SEED, "mesh", "cluster-ip", "pod-local",
         "TCP", "IPv4", dict.fromkeys(BOTH, SERVED)),
    # One address as an external IP and the load-balancer IP, with source ranges that
    # leave the outside host out: upstream's nftables mode firewalls it, its iptables
    # mode's external-IP rule serves (kubeproxy's nftables mode lost the firewall).
    *(
        Case("external-ip-that-is-the-load-balancer-ip", FIRST_SEED, "both", kind,
             "outside", "TCP", "IPv4", {"nftables": TIMEOUT, "iptables": SERVED})
        for kind in ("external-ip", "lb-ip")
    ),
)  # fmt: skip


def states(
    slots: Sequence[Slot], node: str, first_block: int, modes: Collection[str] | None = None
) -> list[State]:
    """The pinned states, in address blocks from ``first_block``; with ``modes``, only the
    Services a case says something about in one of them (and the Pods they select): in
    the ipvs guest every Service costs upstream's syncs on one CPU, and the others are
    the generator's kinds anyway."""
    local = [s for s in slots if s.node == node]
    remote = next(s for s in slots if s.node != node)
    full = [
        State(
            seed=FIRST_SEED,
            block=first_block,
            node=node,
            pods=(
                PodState(local[1].name, node, {"six": "y"}, ready=True, terminating=False),
                PodState(local[2].name, node, {"lsix": "y"}, ready=False, terminating=False),
                PodState(remote.name, remote.node, {"lsix": "y"}, ready=True, terminating=False),
            ),
            services=(
                ServiceState(
                    name="empty",
                    type="NodePort",
                    family_policy="RequireDualStack",
                    families=("IPv4", "IPv6"),
                    ports=(PortState("tcp", "TCP", 80, 8080), PortState("udp", "UDP", 80, 8080)),
                    selector={"empty": "y"},
                    external_traffic_policy="Cluster",
                ),
                ServiceState(
                    name="six",
                    type="LoadBalancer",
                    family_policy="SingleStack",
                    families=("IPv6",),
                    ports=(PortState("tcp", "TCP", 80, 8080),),
                    selector={"six": "y"},
                    external_traffic_policy="Local",
                    lb_ips=(lb_ip(first_block, 1, "IPv6"),),
                ),
                ServiceState(
                    name="lsix",
                    type="ClusterIP",
                    family_policy="RequireDualStack",
                    families=("IPv4", "IPv6"),
                    ports=(PortState("tcp", "TCP", 80, 8080),),
                    selector={"lsix": "y"},
                    internal_traffic_policy="Local",
                    external_ips=(external_ip(first_block, 2, "IPv6"),),
                ),
                *_selector_less(first_block),
            ),
            slices=_hand_written(local[1].name, remote.name),
        )
    ]
    if modes is None:
        return full
    return [_only(state, modes) for state in full]


def _selector_less(block: int) -> tuple[ServiceState, ...]:
    """The Services of the hand-written slices (IPv4, no selector)."""
    http = PortState("http", "TCP", 80, 8080)

    def one(name: str, *ports: PortState, **spec: object) -> ServiceState:
        return ServiceState(
            name=name,
            type=str(spec.pop("type", "ClusterIP")),
            family_policy="SingleStack",
            families=("IPv4",),
            ports=ports or (http,),
            selector={},
            **spec,  # type: ignore[arg-type]
        )

    both = external_ip(block, 3, "IPv4")
    return (
        one("dup"),
        one("zero", http, PortState("other", "TCP", 81, 8081)),
        one("zones"),
        one("mesh"),
        one(
            "both",
            type="LoadBalancer",
            external_traffic_policy="Cluster",
            external_ips=(both,),
            lb_ips=(both,),
            source_ranges=("10.244.0.0/16",),
        ),
    )


def _hand_written(local: str, remote: str) -> tuple[SliceState, ...]:
    http = (("http", "TCP", 8080),)
    return (
        SliceState("dup-a", "dup", "IPv4", http, (SliceEndpointState(local, ready=False,
                   serving=True, terminating=True),)),
        SliceState("dup-b", "dup", "IPv4", http, (SliceEndpointState(local, ready=False,
                   serving=False),)),
        SliceState("zero-a", "zero", "IPv4", (("other", "TCP", 0), *http),
                   (SliceEndpointState(remote),)),
        SliceState("zones-a", "zones", "IPv4", http,
                   (SliceEndpointState(remote, zone="zone a/b", zone_hints=("",)),)),
        SliceState("mesh-a", "mesh", "IPv4", http, (SliceEndpointState(remote),),
                   labels={PROXY_NAME_LABEL: "someone-else"}),
        SliceState("both-a", "both", "IPv4", http, (SliceEndpointState(local),)),
    )  # fmt: skip


def _only(state: State, modes: Collection[str]) -> State:
    """``state`` with only the Services a case has an outcome for in one of ``modes``."""
    named = {
        c.service
        for c in CASES
        if c.seed == state.seed and any(c.expected(m) is not None for m in modes)
    }
    services = tuple(s for s in state.services if s.name in named)
    pods = tuple(p for p in state.pods if any(s.selects(p) for s in services))
    slices = tuple(s for s in state.slices if s.service in named)
    return replace(state, services=services, pods=pods, slices=slices)


def rollback(slots: Sequence[Slot], node: str, block: int) -> State:
    """A Service with an endpoint and an external IP: kubeproxy's iptables mode gives
    it nat dispatch chains, which upstream must take over on a rollback."""
    local = [s for s in slots if s.node == node]
    return State(
        seed=FIRST_SEED + 1,
        block=block,
        node=node,
        pods=(PodState(local[1].name, node, {"web": "y"}, ready=True, terminating=False),),
        services=(
            ServiceState(
                name="web",
                type="ClusterIP",
                family_policy="RequireDualStack",
                families=("IPv4", "IPv6"),
                ports=(PortState("http", "TCP", 80, 8080),),
                selector={"web": "y"},
                external_ips=(external_ip(block, 1, "IPv4"), external_ip(block, 1, "IPv6")),
            ),
        ),
    )
