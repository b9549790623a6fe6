"""How ``kubeproxy explain`` prints an :class:`~kubeproxy.explain.packet.Explanation` (pure).

:func:`as_dict` is the ``-o json`` object (``verdict``, ``endpoints`` as ``ip:port`` /
``[ip]:port``, ``masquerade``, ``reasons``, then the details); :func:`as_text` the
human form. Both take the kernel objects and, with ``--live``, the drift found.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubeproxy.backends.inspection import KernelObject
from kubeproxy.model.fate import Explanation


def as_dict(
    result: Explanation,
    objects: Sequence[KernelObject],
    drift: Sequence[str] | None = None,
) -> dict[str, Any]:
    p = result.packet
    out: dict[str, Any] = {
        "verdict": result.verdict.value,
        "endpoints": list(result.endpoints),
        "masquerade": result.masquerade,
        "reasons": list(result.reasons),
        "packet": {
            "src": p.src,
            "dst": p.dst,
            "port": p.port,
            "protocol": p.protocol.value,
            "inInterface": p.in_interface,
        },
        "mode": result.mode,
        "family": p.family.value,
        "origin": result.origin.value,
        "servicePort": str(result.service_port) if result.service_port else None,
        "frontend": (
            {"kind": result.frontend.kind.value, "address": str(result.frontend)}
            if result.frontend is not None
            else None
        ),
        "route": result.route,
        "sessionAffinityTimeout": (
            result.plan.affinity_timeout if result.plan is not None else None
        ),
        "candidates": [
            {
                "address": str(c.endpoint),
                "probability": round(c.probability, 6),
                "masquerade": c.masquerade,
                "node": c.endpoint.node_name,
                "zone": c.endpoint.zone,
                "ready": c.endpoint.ready,
                "terminating": c.endpoint.terminating,
            }
            for c in result.candidates
        ],
        "excluded": [{"address": str(e.endpoint), "why": e.why} for e in result.excluded],
        "kernelObjects": [str(o) for o in objects],
    }
    if drift is not None:
        out["drift"] = list(drift)
    return out


def _endpoint_line(address: str, detail: str) -> str:
    return f"  {address:<28} {detail}\n"


def as_text(
    result: Explanation,
    objects: Sequence[KernelObject],
    drift: Sequence[str] | None = None,
) -> str:
    lines = [f"Packet:      {result.packet} (origin: {result.origin.value})\n"]
    if result.service_port is not None and result.frontend is not None:
        lines.append(
            f"Service:     {result.service_port} via {result.frontend.kind.value} "
            f"{result.frontend}\n"
        )
    else:
        lines.append("Service:     none\n")
    masq = "yes" if result.masquerade else "no"
    lines.append(f"Verdict:     {result.verdict.value} (masquerade: {masq})\n")
    lines.append("Why:\n")
    lines.extend(f"  - {r}\n" for r in result.reasons)
    if result.candidates:
        lines.append("Endpoints:\n")
        for c in result.candidates:
            ep = c.endpoint
            where = f"node {ep.node_name or '-'}, zone {ep.zone or '-'}"
            state = "terminating" if ep.terminating else "ready"
            m = ", masquerade" if c.masquerade and not result.masquerade else ""
            lines.append(_endpoint_line(str(ep), f"p={c.probability:.3f}  {where}, {state}{m}"))
    if result.excluded:
        lines.append("Not used:\n")
        lines.extend(_endpoint_line(str(e.endpoint), e.why) for e in result.excluded)
    if objects:
        lines.append(f"Kernel objects ({result.mode}):\n")
        lines.extend(f"  {o}\n" for o in objects)
    if drift is not None:
        if drift:
            lines.append("Drift (kernel differs from the plan):\n")
            lines.extend(f"  ! {d}\n" for d in drift)
        else:
            lines.append("Live: the kernel has exactly these objects and endpoints.\n")
    return "".join(lines)
