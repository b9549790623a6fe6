"""``python -m bench.iptables_restore``: what iptables-restore costs in each flavour (root;
uses a scratch network namespace per flavour, deleted by name at the end).

Two shapes of 100,000 simple rules (``-s ADDRESS/32 -j RETURN``) in the filter table: one
chain of 100,000 rules, and 10,000 chains of 10. For each, through
:class:`~kubeproxy.dataplane.iptables.runner.IptablesCommand`, from an empty table:
printing the input (``str``), the first restore, the same restore again (every chain
flushed and refilled: a full sync), a small restore into the big table (one chain of 10
rules rewritten: a partial sync), and the reads a backend makes between syncs: the
canary check (``chain_exists``), ``chains()`` and ``save()``. Median of ``--rounds``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.iptables.runner import FLAVORS, Flavor, IptablesCommand
from kubeproxy.lab.netns import add_netns, delete_netns, ns_exec
from kubeproxy.model.types import IPFamily


def _ip(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def one_chain(rules: int = 100_000) -> Restore:
    data = Restore()
    data.chain("filter", "KUBE-BIG")
    data.rules("filter", "KUBE-BIG", (("-s", f"{_ip(i)}/32", "-j", "RETURN") for i in range(rules)))
    return data


def many_chains(chains: int = 10_000, per_chain: int = 10) -> Restore:
    data = Restore()
    for c in range(chains):
        name = f"KUBE-C{c:05d}"
        data.chain("filter", name)
        data.rules(
            "filter",
            name,
            (("-s", f"{_ip(c * per_chain + r)}/32", "-j", "RETURN") for r in range(per_chain)),
        )
    return data


def small() -> Restore:
    data = Restore()
    data.chain("filter", "KUBE-SMALL")
    data.rules("filter", "KUBE-SMALL", (("-s", f"{_ip(r)}/32", "-j", "RETURN") for r in range(10)))
    return data


def _reset(ns: str, flavor: Flavor) -> None:
    if flavor == "nft":
        ns_exec(ns, "nft", "flush", "ruleset")
    else:
        builtins = "".join(f":{c} ACCEPT [0:0]\n" for c in ("INPUT", "FORWARD", "OUTPUT"))
        ns_exec(ns, "iptables-legacy-restore", input=f"*filter\n{builtins}COMMIT\n")


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(flavor: Flavor, shape: str, data: Restore, rounds: int) -> dict[str, float]:
    ns = f"kpbipt{os.getpid() % 100000}{flavor[0]}"
    add_netns(ns)
    try:
        ipt = IptablesCommand(IPFamily.IPv4, flavor, netns=ns, timeout=600)
        samples: dict[str, list[float]] = {}

        def sample(name: str, fn: Callable[[], object]) -> None:
            samples.setdefault(name, []).append(_time(fn))

        for _ in range(rounds):
            _reset(ns, flavor)
            sample("print", lambda: str(data))
            sample("first", lambda: ipt.restore(data))
            sample("again", lambda: ipt.restore(data))
            sample("small", lambda: ipt.restore(small()))
            sample("canary", lambda: ipt.chain_exists("filter", "KUBE-SMALL"))
            sample("chains", lambda: ipt.chains("filter"))
            sample("save", lambda: ipt.save("filter"))
        return {name: statistics.median(values) for name, values in samples.items()}
    finally:
        delete_netns(ns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shapes = {"1 chain x 100,000 rules": one_chain(), "10,000 chains x 10 rules": many_chains()}
    print(
        "| flavour | shape | print input | first restore | same again | small into it "
        "| canary | chains() | save() |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for flavor in FLAVORS:
        for shape, data in shapes.items():
            r = measure(flavor, shape, data, args.rounds)
            cells = [f"{r[k]:.2f} s" if r[k] >= 0.1 else f"{r[k] * 1000:.0f} ms" for k in r]
            print(f"| {flavor} | {shape} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
