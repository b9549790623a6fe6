"""Which frontends the socket hooks serve, and with which endpoints (pure).

A frontend of a ServicePort is served by the hooks when everything nftables mode would
do for a new connection to it from this node is "DNAT to one of these endpoints":

* TCP or UDP (SCTP sockets are not rewritten);
* the ClusterIP: when the internal route's verdict is DNAT (REJECT and DROP stay with
  the nftables rules, which answer exactly as in nftables mode: an ICMP/TCP refusal, or
  silence), with the internal route's endpoints;
* external IPs and load-balancer IPs (connections from the node and its Pods): the
  external route's endpoints, or with ``externalTrafficPolicy: Local`` its
  short-circuit (cluster-wide) endpoints, as nftables mode gives local clients; not a
  load-balancer IP with ``loadBalancerSourceRanges`` (the client's source address is not
  known at ``connect()``, so nftables decides);
* ClientIP session affinity: the timeout goes into the frontend's slot 0 and the hooks
  keep each client on its endpoint (per frontend, see sock_lb.c).

Everything else has no map entry, so its sockets are left alone and meet the nftables
rules of the same process. Masquerading does not apply: a rewritten socket's packets
leave with the client's own address, as they do after nftables' DNAT from a local Pod.
"""

from __future__ import annotations

from kubeproxy.dataplane.bpf.socklb import Backends, Frontend, Target, supported
from kubeproxy.model.plan import FrontendKind, ServicePortPlan, Verdict
from kubeproxy.model.types import Endpoint, TrafficPolicy

Entries = dict[Frontend, Backends]


def _backends(endpoints: tuple[Endpoint, ...], affinity: int) -> Backends:
    return Backends(tuple(Target(ep.ip, ep.port) for ep in endpoints), affinity)


def socket_entries(plan: ServicePortPlan) -> Entries:
    """The map entries of one ServicePort plan (empty: left to nftables)."""
    svc = plan.service_port
    if not supported(svc.protocol):
        return {}
    affinity = plan.affinity_timeout or 0
    out: Entries = {}
    if plan.internal.verdict is Verdict.DNAT:
        out[Frontend(plan.cluster_ip, svc.port, svc.protocol)] = _backends(
            plan.internal.endpoints, affinity
        )
    route = plan.external
    if route is None:
        return out
    local = route.policy is TrafficPolicy.LOCAL
    endpoints = route.short_circuit if local else route.endpoints
    if not endpoints:
        return out
    for frontend in plan.external_frontends:
        if frontend.kind is FrontendKind.NODE_PORT or frontend.source_ranges:
            continue
        assert frontend.ip is not None
        out[Frontend(frontend.ip, svc.port, svc.protocol)] = _backends(endpoints, affinity)
    return out
