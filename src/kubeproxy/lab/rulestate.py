"""What a namespace's kernel holds, in a form two namespaces can be compared by: ``==``.

Two kernels hold "the same rules" when these canonical states are equal, whatever order
the objects were created in: for nftables, every table, chain, set and map with its
elements sorted, rules in their order within each chain, handles and counter values
left out (the JSON listing), and in kubeproxy's backends maps, each destination's
endpoints in any index order (a partial sync keeps an endpoint at its index, a full
sync indexes them afresh; a packet meets ``numgen random mod N`` either way); for
iptables, ``iptables-save`` of both families, chains declared in sorted order, rules
grouped by chain in their order, counters left out.
Used by the partial-sync test and by the crash and soak benchmarks, which compare a
node's kernel with a fresh full sync of the same objects in an empty namespace
(:func:`fresh_sync`).
"""

from __future__ import annotations

import difflib
import json
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from kubeproxy.backends.nftables.inspect import KUBE_PROXY_TABLES, any_index
from kubeproxy.backends.nftables.table import is_backends
from kubeproxy.lab.cluster import lab_env
from kubeproxy.lab.netns import add_netns, delete_netns, ns_exec


def _without_counts(value: Any) -> Any:
    """``value`` with every ``counter`` statement's packet and byte counts zeroed."""
    if isinstance(value, dict):
        return {
            k: ({"packets": 0, "bytes": 0} if k == "counter" else _without_counts(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_without_counts(v) for v in value]
    return value


def nft_state(ns: str, tables: tuple[tuple[str, str], ...] | None = None) -> dict[str, Any]:
    """The namespace's nftables ruleset (only ``tables``, (family, name) pairs, if given)."""
    data = json.loads(ns_exec(ns, "nft", "-j", "list", "ruleset"))["nftables"]
    out: dict[str, Any] = {}
    for item in data:
        for kind, raw in item.items():
            if kind == "metainfo":
                continue
            table = raw.get("table") if kind != "table" else raw.get("name")
            if tables is not None and (raw.get("family"), table) not in tables:
                continue
            obj = {k: v for k, v in raw.items() if k != "handle"}
            if kind == "rule":
                key = f"rules {obj['family']} {obj['table']} {obj['chain']}"
                expr = _without_counts(obj["expr"])
                out.setdefault(key, []).append(json.dumps(expr, sort_keys=True))
            else:
                if "elem" in obj and kind == "map" and is_backends(str(obj.get("name"))):
                    obj["elem"] = any_index(obj["elem"])
                elif "elem" in obj:
                    obj["elem"] = sorted(json.dumps(e, sort_keys=True) for e in obj["elem"])
                out[f"{kind} {obj.get('family')} {table} {obj.get('name')}"] = obj
    return out


_COUNTS = re.compile(r"\s*\[\d+:\d+\]")


def iptables_state(ns: str, flavor: str) -> dict[str, list[str]]:
    """``iptables-save`` of both families (``flavor``: nft or legacy), canonical.

    Keys are ``"<family> <table>"`` (chain declarations, sorted) and ``"<family> <table>
    <chain>"`` (that chain's rules, in order).
    """
    out: dict[str, list[str]] = {}
    for family, binary in (("ipv4", "iptables"), ("ipv6", "ip6tables")):
        text = ns_exec(ns, f"{binary}-{flavor}-save")
        table = ""
        for line in text.splitlines():
            if not line or line.startswith("#") or line == "COMMIT":
                continue
            if line.startswith("*"):
                table = line[1:]
                out.setdefault(f"{family} {table}", [])
            elif line.startswith(":"):
                out[f"{family} {table}"].append(_COUNTS.sub("", line))
            elif line.startswith("-A "):
                chain = line.split()[1]
                out.setdefault(f"{family} {table} {chain}", []).append(_COUNTS.sub("", line))
            else:
                out.setdefault(f"{family} {table} (other)", []).append(line)
        for key, lines in out.items():
            if key.count(" ") == 1:
                lines.sort()
    return out


def rules_state(ns: str, mode: str) -> dict[str, Any]:
    """kubeproxy's rules in ``ns`` for a lab mode (nftables, iptables-nft, iptables-legacy)."""
    if mode == "nftables":
        return nft_state(ns, KUBE_PROXY_TABLES)
    return iptables_state(ns, mode.removeprefix("iptables-"))


# iptables' built-in chains, by table.
BUILTIN_CHAINS = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
}


def empty_rules(ns: str, mode: str) -> None:
    """Remove every rule of ``mode`` (a lab mode) from ``ns``: a node that never had any.

    nftables and iptables-nft: the whole nftables ruleset. iptables-legacy: filter, nat
    and mangle of both families emptied (without --noflush, iptables-restore flushes each
    table it names and deletes its user chains).
    """
    if mode in ("nftables", "iptables-nft"):
        ns_exec(ns, "nft", "flush", "ruleset")
        return
    text = "".join(
        f"*{table}\n" + "".join(f":{c} ACCEPT [0:0]\n" for c in chains) + "COMMIT\n"
        for table, chains in BUILTIN_CHAINS.items()
    )
    for binary in ("iptables-legacy-restore", "ip6tables-legacy-restore"):
        ns_exec(ns, binary, input=text)


def fresh_sync(
    ns: str,
    mode: str,
    args: Sequence[str],
    state: Callable[[str], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """:func:`rules_state` (or ``state(ns)``) after ``kubeproxy run --once ARGS`` in a
    new, empty namespace ``ns`` (deleted afterwards): the reference a node's rules are
    compared with."""
    delete_netns(ns)
    add_netns(ns)
    try:
        command = ["ip", "netns", "exec", ns, sys.executable, "-m", "kubeproxy", "run", *args]
        done = subprocess.run(
            [*command, "--once"], capture_output=True, text=True, check=False, env=lab_env()
        )
        if done.returncode != 0:
            raise RuntimeError(f"the fresh sync failed: {done.stderr[-2000:]}")
        return rules_state(ns, mode) if state is None else state(ns)
    finally:
        delete_netns(ns)


def differences(got: dict[str, Any], want: dict[str, Any], limit: int = 5) -> list[str]:
    """What differs between two states, one line per key (at most ``limit``), with a
    short diff (want to got) of differing lists."""
    lines = []
    for key in sorted(set(got) | set(want)):
        if got.get(key) == want.get(key):
            continue
        if key not in want:
            lines.append(f"extra: {key}")
        elif key not in got:
            lines.append(f"missing: {key}")
        else:
            lines.append(f"differs: {key}")
            got_value, want_value = got[key], want[key]
            if isinstance(got_value, list) and isinstance(want_value, list):
                diff = difflib.unified_diff(
                    [str(v) for v in want_value], [str(v) for v in got_value], lineterm="", n=1
                )
                lines[-1] += "".join(f"\n    {d}" for d in list(diff)[2:12])
    more = len(lines) - limit
    return lines[:limit] + ([f"(+{more} more)"] if more > 0 else [])
