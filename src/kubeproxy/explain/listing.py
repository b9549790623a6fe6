"""``kubeproxy list``: every frontend this node programs, one row each (pure).

Like ``cilium service list``: per ServicePort plan and frontend (ClusterIP, external IP,
load-balancer IP, NodePort) its Service, port, protocol, the traffic policy that applies
to it, and the endpoint counts on this node's view: ``ready`` (cluster-wide),
``local`` (ready on this node), ``terminating``; plus, for ``-o wide`` and JSON, what a
new connection gets (DNAT to how many endpoints, or DROP / REJECT), session affinity,
topology and ``loadBalancerSourceRanges``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeproxy.model.plan import FrontendKind, ServicePortPlan
from kubeproxy.model.types import Endpoint, IPFamily, ServicePortName


@dataclass(frozen=True, slots=True)
class Row:
    frontend: str
    kind: str
    service: str
    port: str
    protocol: str
    policy: str
    ready: int
    local: int
    terminating: int
    verdict: str
    used: int
    affinity: int | None
    topology: str | None
    source_ranges: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "frontend": self.frontend,
            "type": self.kind,
            "service": self.service,
            "port": self.port,
            "protocol": self.protocol,
            "policy": self.policy,
            "endpoints": {
                "ready": self.ready,
                "local": self.local,
                "terminating": self.terminating,
                "used": self.used,
            },
            "verdict": self.verdict,
            "sessionAffinityTimeout": self.affinity,
            "topology": self.topology,
            "sourceRanges": list(self.source_ranges),
        }


def rows(
    plans: Iterable[ServicePortPlan],
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    node_name: str,
) -> list[Row]:
    """One row per frontend, ClusterIPs of every ServicePort first, then the rest."""
    out: list[tuple[int, Row]] = []
    for plan in plans:
        want_v6 = plan.family is IPFamily.IPv6
        eps = [ep for ep in endpoints.get(plan.name, ()) if (":" in ep.ip) is want_v6]
        ready = sum(ep.ready for ep in eps)
        local = sum(ep.ready and ep.is_local(node_name) for ep in eps)
        terminating = sum(ep.terminating for ep in eps)
        svc = plan.service_port
        for frontend in plan.frontends:
            internal = frontend.kind is FrontendKind.CLUSTER_IP
            route = plan.internal if internal else plan.external
            assert route is not None
            used = len(route.endpoints)
            verdict = f"DNAT({used})" if used else route.verdict.value
            if not internal and not used and route.short_circuit:
                verdict += f", pods/node: DNAT({len(route.short_circuit)})"
            order = list(FrontendKind).index(frontend.kind)
            out.append(
                (
                    order,
                    Row(
                        frontend=str(frontend),
                        kind=frontend.kind.value,
                        service=str(plan.name.service),
                        port=plan.name.port,
                        protocol=svc.protocol.value,
                        policy=route.policy.value,
                        ready=ready,
                        local=local,
                        terminating=terminating,
                        verdict=verdict,
                        used=used,
                        affinity=svc.affinity_timeout,
                        topology=plan.selection.topology_mode.value or None,
                        source_ranges=frontend.source_ranges,
                    ),
                )
            )
    out.sort(key=lambda r: (r[0], r[1].service, r[1].port, r[1].protocol, r[1].frontend))
    return [r for _, r in out]


_COLUMNS = ("FRONTEND", "TYPE", "SERVICE", "PORT", "POLICY", "READY", "LOCAL", "TERMINATING")
_WIDE = ("VERDICT", "AFFINITY", "TOPOLOGY", "SOURCE-RANGES")


def table(listed: Sequence[Row], *, wide: bool = False) -> str:
    """Aligned text columns (``-o wide`` adds the verdict, affinity, topology, ranges)."""
    header = _COLUMNS + (_WIDE if wide else ())
    lines: list[tuple[str, ...]] = [header]
    for r in listed:
        port = f"{r.port}/{r.protocol}" if r.port else r.protocol
        cells: tuple[str, ...] = (
            r.frontend,
            r.kind,
            r.service,
            port,
            r.policy,
            str(r.ready),
            str(r.local),
            str(r.terminating),
        )
        if wide:
            cells += (
                r.verdict,
                f"{r.affinity}s" if r.affinity is not None else "-",
                r.topology or "-",
                ",".join(r.source_ranges) or "-",
            )
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )
