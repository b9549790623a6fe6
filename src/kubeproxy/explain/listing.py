"""``kubeproxy list``: every frontend this node programs, one row each (pure).

Like ``cilium service list``: per ServicePort plan and frontend (ClusterIP, external IP,
load-balancer IP, NodePort) its Service, port, protocol, the traffic policy that applies
to it, and the endpoint counts on this node's view: ``ready`` (cluster-wide),
``local`` (ready on this node), ``terminating``; plus, for ``-o wide`` and JSON, what a
new connection gets (DNAT to how many endpoints, or DROP / REJECT), session affinity,
topology, ``loadBalancerSourceRanges`` and every endpoint (:class:`EndpointRow`: address,
node, zone, ready / serving / terminating, on this node or not, used by the frontend's
route or not), one per line under the row in the text form, as cilium prints backends.

:func:`select` keeps the plans of one namespace and/or of some Service names (``-n``,
names); ``list --live`` adds each row's drift (:mod:`kubeproxy.explain.command`), shown
in a ``LIVE`` column and listed below the table.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubeproxy.model.plan import Frontend, FrontendKind, ServicePortPlan
from kubeproxy.model.types import Endpoint, IPFamily, ServicePortName


@dataclass(frozen=True, slots=True)
class EndpointRow:
    """One endpoint of a row's ServicePort (in the row's family)."""

    address: str  # ip:port, [ip]:port
    node: str | None
    zone: str | None
    ready: bool
    serving: bool
    terminating: bool
    local: bool  # on this node
    used: bool  # a new connection to the row's frontend may go to it

    @property
    def state(self) -> str:
        """``ready``, ``serving-terminating``, ``terminating`` or ``not-ready``."""
        if self.ready:
            return "ready"
        if self.terminating:
            return "serving-terminating" if self.serving else "terminating"
        return "not-ready"

    def as_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "node": self.node,
            "zone": self.zone,
            "ready": self.ready,
            "serving": self.serving,
            "terminating": self.terminating,
            "local": self.local,
            "used": self.used,
        }

    def __str__(self) -> str:
        flags = [self.state, *(["local"] if self.local else []), *([] if self.used else ["unused"])]
        return f"{self.address} ({self.node or '-'}, {self.zone or '-'}, {', '.join(flags)})"


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
    endpoint_list: tuple[EndpointRow, ...] = ()
    # list --live: what differs in the kernel (None: not checked).
    drift: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {
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
            "endpointList": [e.as_dict() for e in self.endpoint_list],
        }
        if self.drift is not None:
            out["drift"] = list(self.drift)
        return out


def select(
    plans: Iterable[ServicePortPlan], namespace: str | None, names: Collection[str]
) -> list[ServicePortPlan]:
    """The plans of Services in ``namespace`` (None: every one) named one of ``names``
    (empty: any name)."""
    return [
        p
        for p in plans
        if (namespace is None or p.name.service.namespace == namespace)
        and (not names or p.name.service.name in names)
    ]


def _endpoint_rows(
    eps: Sequence[Endpoint], used: Collection[Endpoint], node_name: str
) -> tuple[EndpointRow, ...]:
    return tuple(
        EndpointRow(
            address=str(ep),
            node=ep.node_name,
            zone=ep.zone,
            ready=ep.ready,
            serving=ep.serving,
            terminating=ep.terminating,
            local=ep.is_local(node_name),
            used=ep in used,
        )
        for ep in eps
    )


def frontend_order(kind: FrontendKind) -> int:
    """ClusterIPs first, then external IPs, load-balancer IPs, NodePorts."""
    return list(FrontendKind).index(kind)


def row(
    plan: ServicePortPlan,
    frontend: Frontend,
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    node_name: str,
    *,
    untouched: bool = False,
) -> Row:
    """The row of one frontend of ``plan``. ``untouched``: the mode programs nothing for
    a frontend without endpoints, so it has no DROP/REJECT and no short-circuit
    (kernelspace: no HNS load balancer, verdict ``NONE``)."""
    want_v6 = plan.family is IPFamily.IPv6
    eps = [ep for ep in endpoints.get(plan.name, ()) if (":" in ep.ip) is want_v6]
    svc = plan.service_port
    internal = frontend.kind is FrontendKind.CLUSTER_IP
    route = plan.internal if internal else plan.external
    assert route is not None
    used = len(route.endpoints)
    verdict = f"DNAT({used})" if used else ("NONE" if untouched else route.verdict.value)
    if not internal and not used and route.short_circuit and not untouched:
        verdict += f", pods/node: DNAT({len(route.short_circuit)})"
    return Row(
        frontend=str(frontend),
        kind=frontend.kind.value,
        service=str(plan.name.service),
        port=plan.name.port,
        protocol=svc.protocol.value,
        policy=route.policy.value,
        ready=sum(ep.ready for ep in eps),
        local=sum(ep.ready and ep.is_local(node_name) for ep in eps),
        terminating=sum(ep.terminating for ep in eps),
        verdict=verdict,
        used=used,
        affinity=svc.affinity_timeout,
        topology=plan.selection.topology_mode.value or None,
        source_ranges=frontend.source_ranges,
        endpoint_list=_endpoint_rows(eps, set(route.endpoints), node_name),
    )


def sort_key(kind: FrontendKind, r: Row) -> tuple[int, str, str, str, str]:
    return (frontend_order(kind), r.service, r.port, r.protocol, r.frontend)


def rows(
    plans: Iterable[ServicePortPlan],
    endpoints: Mapping[ServicePortName, Sequence[Endpoint]],
    node_name: str,
    *,
    untouched: bool = False,
) -> list[Row]:
    """One row per frontend, ClusterIPs of every ServicePort first, then the rest
    (``untouched``: as :func:`row`)."""
    out = [
        (f.kind, row(plan, f, endpoints, node_name, untouched=untouched))
        for plan in plans
        for f in plan.frontends
    ]
    out.sort(key=lambda r: sort_key(*r))
    return [r for _, r in out]


_COLUMNS = ("FRONTEND", "TYPE", "SERVICE", "PORT", "POLICY", "READY", "LOCAL", "TERMINATING")
_WIDE = ("VERDICT", "AFFINITY", "TOPOLOGY", "SOURCE-RANGES", "ENDPOINTS")


def table(listed: Sequence[Row], *, wide: bool = False) -> str:
    """Aligned text columns. ``-o wide`` adds the verdict, affinity, topology, ranges and
    every endpoint, one per line (the first on the row's own line); ``--live`` (rows with
    ``drift``) a ``LIVE`` column, ``ok`` or ``DRIFT(n)``."""
    live = any(r.drift is not None for r in listed)
    header = _COLUMNS + (_WIDE if wide else ()) + (("LIVE",) if live else ())
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
        more: list[str] = []
        if wide:
            first, *more = [str(e) for e in r.endpoint_list] or ["-"]
            cells += (
                r.verdict,
                f"{r.affinity}s" if r.affinity is not None else "-",
                r.topology or "-",
                ",".join(r.source_ranges) or "-",
                first,
            )
        if live:
            cells += (_live(r),)
        lines.append(cells)
        # Further endpoints on lines of their own, in the ENDPOINTS column.
        at = len(_COLUMNS) + len(_WIDE) - 1
        lines.extend(("",) * at + (e,) + ("",) * (len(header) - at - 1) for e in more)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() + "\n"
        for line in lines
    )


def _live(r: Row) -> str:
    if r.drift is None:
        return "-"
    return f"DRIFT({len(r.drift)})" if r.drift else "ok"


def drift_report(listed: Sequence[Row], kernel_only: Sequence[str], mode: str) -> str:
    """Below the ``--live`` table: each row's drift, and what the kernel holds that no
    frontend of the plan explains (``mode``: the proxy mode whose objects were read)."""
    out: list[str] = []
    for r in listed:
        for d in r.drift or ():
            out.append(f"  ! {r.frontend} {r.service}:{r.port or r.protocol}: {d}\n")
    out.extend(f"  ! {k}\n" for k in kernel_only)
    if not out:
        return f"Live ({mode} mode): the kernel holds exactly what the plan says.\n"
    return f"Drift ({mode} mode: the kernel differs from the plan):\n" + "".join(out)
