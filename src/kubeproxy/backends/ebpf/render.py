"""Which frontends the socket hooks serve, and with which endpoints (pure).

A ServicePort's ClusterIP is served by the hooks when everything nftables mode would do
for a new connection from this node is "DNAT to one of these endpoints, at random":

* TCP or UDP (SCTP sockets are not rewritten);
* the internal route's verdict is DNAT (REJECT and DROP stay with the nftables rules,
  which answer exactly as in nftables mode: an ICMP/TCP refusal, or silence);
* no session affinity (nftables keeps the ClientIP affinity memory).

Everything else has no map entry, so its sockets are left alone and meet the nftables
rules of the same process. Masquerading does not apply: a rewritten socket's packets
leave with the client's own address, as they do after nftables' DNAT from a local Pod.
External IPs and load-balancer IPs stay with nftables in this slice.
"""

from __future__ import annotations

from kubeproxy.dataplane.bpf.socklb import Frontend, Target, supported
from kubeproxy.model.plan import ServicePortPlan, Verdict

Entries = dict[Frontend, tuple[Target, ...]]


def socket_entries(plan: ServicePortPlan) -> Entries:
    """The map entries of one ServicePort plan (empty: left to nftables)."""
    svc = plan.service_port
    if (
        not supported(svc.protocol)
        or plan.internal.verdict is not Verdict.DNAT
        or plan.affinity_timeout is not None
    ):
        return {}
    targets = tuple(Target(ep.ip, ep.port) for ep in plan.internal.endpoints)
    return {Frontend(plan.cluster_ip, svc.port, svc.protocol): targets}
