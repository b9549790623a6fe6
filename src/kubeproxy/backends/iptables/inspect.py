"""iptables mode's knowledge for ``explain`` and ``list`` (an
:class:`~kubeproxy.backends.inspection.Inspector`).

* :data:`RULES` -- where iptables mode treats packets unlike the others, as upstream's:
  a connection DNATed back to its client is always masqueraded (every ``KUBE-SEP-``
  chain marks ``-s`` its endpoint), ``KUBE-EXTERNAL-SERVICES`` is not on the node's
  OUTPUT path, healthCheckNodePorts are accepted in filter ``KUBE-NODEPORTS``;
* :func:`kernel_objects` -- upstream's chains of the ServicePort (``KUBE-SVC-``,
  ``KUBE-SVL-``, ``KUBE-EXT-``, ``KUBE-FW-``, one ``KUBE-SEP-`` per candidate endpoint)
  and the frontend's entries in the top-level chains, from
  :func:`kubeproxy.backends.iptables.render.render_service_port`;
* :func:`drift` / :func:`kernel_only` -- against ``iptables-save -t nat`` of the
  iptables the proxy drives: the chains, and the ``--to-destination`` of the
  ``KUBE-SEP-`` chains the route's chain jumps to against the candidates.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence

from kubeproxy.backends.inspection import KernelObject, LiveKernel, PacketRules, RulesInspector
from kubeproxy.backends.iptables import names
from kubeproxy.backends.iptables import render as ipt
from kubeproxy.backends.iptables.names import DISPATCH_PREFIX, ServicePortChains
from kubeproxy.dataplane.iptables.runner import IptablesCommand, detect_flavor
from kubeproxy.model.fate import Explanation, Outcome
from kubeproxy.model.plan import FamilyPlan, Frontend, FrontendKind, ServicePortPlan
from kubeproxy.model.types import IPFamily

RULES = PacketRules(
    "iptables",
    masquerade_every_self_dnat=True,
    external_rejects_off_output=names.KUBE_EXTERNAL_SERVICES,
    health_check_accept_chain=names.KUBE_NODEPORTS,
)


def kernel_objects(
    result: Explanation, fam: FamilyPlan, scheduler: str = "rr"
) -> tuple[KernelObject, ...]:
    plan, frontend = result.plan, result.frontend
    if plan is None or frontend is None:
        return ()
    return _frontend(result, plan, frontend, fam)


def _frontend(
    result: Explanation, plan: ServicePortPlan, frontend: Frontend, fam: FamilyPlan
) -> tuple[KernelObject, ...]:
    rules = ipt.render_service_port(plan, fam, ipt.Settings())
    names = ServicePortChains(plan.name)
    out: list[KernelObject] = []
    for entry in rules.entries:
        tree = ipt.TREES_BY_ID[entry.tree]
        if frontend.kind is FrontendKind.NODE_PORT:
            relevant = tree.ports and f"--dport {frontend.port}" in " ".join(entry.args)
        else:
            relevant = not tree.ports and frontend.ip in entry.args
            relevant = relevant and str(frontend.port) in entry.args
        if relevant:
            out.append(KernelObject("rule", tree.table, tree.parent, shlex.join(entry.args)))
    programmed = {name for name, _ in rules.chains}
    path: list[str] = []
    if result.route == "internal":
        path.append(names.svl if plan.internal.policy.value == "Local" else names.svc)
    elif result.frontend is not None:
        if frontend.kind is FrontendKind.LOAD_BALANCER:
            path.append(names.fw)
        path.append(names.ext)
        ext = plan.external
        local = ext is not None and ext.policy.value == "Local" and result.route != "short-circuit"
        path.append(names.svl if local else names.svc)
    path.extend(names.sep(str(c.endpoint)) for c in result.candidates)
    out.extend(KernelObject("chain", "nat", c) for c in dict.fromkeys(path) if c in programmed)
    return tuple(out)


def parse_save(text: str) -> tuple[set[str], dict[str, list[list[str]]]]:
    """``iptables-save`` of one table: its chains, and each chain's rules as arguments."""
    chains: set[str] = set()
    rules: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        if line.startswith(":"):
            chains.add(line[1:].split()[0])
        elif line.startswith("-A "):
            args = shlex.split(line)
            rules.setdefault(args[1], []).append(args[2:])
    return chains, rules


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def iptables_drift(result: Explanation, objects: Sequence[KernelObject], save: str) -> list[str]:
    chains, rules = parse_save(save)
    drift = [f"missing {o}" for o in objects if o.kind == "chain" and o.name not in chains]
    route = [
        o.name
        for o in objects
        if o.kind == "chain" and o.name.startswith((names.SVC_PREFIX, names.SVL_PREFIX))
    ]
    if result.verdict is not Outcome.DNAT or not route or route[-1] not in chains:
        return drift
    kernel: set[str] = set()
    for args in rules.get(route[-1], []):
        sep = _arg(args, "-j")
        if sep is None or not sep.startswith(names.SEP_PREFIX):
            continue
        for sep_args in rules.get(sep, []):
            to = _arg(sep_args, "--to-destination")
            if to is not None:
                kernel.add(to)
    expected = set(result.endpoints)
    drift.extend(f"missing endpoint {e} in {route[-1]}" for e in sorted(expected - kernel))
    drift.extend(f"extra endpoint {e} in {route[-1]}" for e in sorted(kernel - expected))
    return drift


# Chains of one ServicePort (or endpoint) in upstream's iptables layout.
SERVICE_CHAIN_PREFIXES = (
    names.SVC_PREFIX,
    names.SVL_PREFIX,
    names.EXT_PREFIX,
    names.FW_PREFIX,
    names.SEP_PREFIX,
)


def iptables_kernel_only(save: str, expected_chains: Iterable[str]) -> list[str]:
    """ServicePort and endpoint chains in the nat table that no Service has."""
    chains, _ = parse_save(save)
    want = set(expected_chains)
    return [
        f"nat: chain {chain}: no Service has it (stale)"
        for chain in sorted(chains)
        if chain.startswith(SERVICE_CHAIN_PREFIXES)
        and not chain.startswith(DISPATCH_PREFIX)  # the trees, not a ServicePort's
        and chain not in want
    ]


def nat_save(kernel: LiveKernel, family: IPFamily) -> str:
    """``iptables-save -t nat`` of the iptables the proxy drives (read once)."""

    def fetch() -> str:
        flavor = kernel.iptables_backend
        chosen = (
            detect_flavor() if flavor == "auto" else ("legacy" if flavor == "legacy" else "nft")
        )
        return IptablesCommand(family, chosen).save("nat")

    return kernel.once(("iptables-save", family), fetch)


def drift(
    result: Explanation,
    fam: FamilyPlan,
    objects: Sequence[KernelObject],
    kernel: LiveKernel,
) -> list[str]:
    return iptables_drift(result, objects, nat_save(kernel, fam.family))


def kernel_only(
    families: Sequence[tuple[FamilyPlan, Sequence[ServicePortPlan]]],
    expected: Sequence[KernelObject],
    kernel: LiveKernel,
) -> list[str]:
    """ServicePort chains no plan renders (rendered again here, as a sync would)."""
    out: list[str] = []
    for fam, plans in families:
        chains = {
            name
            for plan in plans
            for name, _ in ipt.render_service_port(plan, fam, ipt.Settings()).chains
        }
        out += iptables_kernel_only(nat_save(kernel, fam.family), chains)
    return out


class IptablesInspector(RulesInspector):
    rules = RULES

    kernel_objects = staticmethod(kernel_objects)
    drift = staticmethod(drift)
    kernel_only = staticmethod(kernel_only)


INSPECTOR = IptablesInspector()
