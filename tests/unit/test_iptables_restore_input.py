"""What iptables mode hands iptables-restore: chain lines largest name first (the order
both flavours create chains fastest in), meaning exactly what the unordered input meant;
``last_restore`` keeps small restores verbatim but does not print big ones twice; the
ServicePorts' own rules are rendered as the input is printed, never all held."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kubeproxy.backends.iptables.proxier import (
    LAST_RESTORE_RULES,
    IptablesBackend,
    declare_largest_first,
)
from kubeproxy.config.modes import ProxyMode
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.iptables.restore import Restore, RestoreError
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import Endpoint, IPFamily, ServicePort
from tests.conftest import NO_PROC
from tests.partial_sync_machine import CONFIG, NODE, port_name

V4 = replace(CONFIG, mode=ProxyMode.IPTABLES, families=(IPFamily.IPv4,))


def snapshot(services: int, endpoints: int) -> Snapshot:
    ports, eps = {}, {}
    for i in range(services):
        name = port_name(i)
        ports[name] = ServicePort(
            name=name, cluster_ips=(f"10.96.{i // 256}.{i % 256}",), port=80, node_port=30000 + i
        )
        eps[name] = tuple(
            Endpoint(f"10.244.{1 + j % 2}.{(i * endpoints + j) % 250 + 1}", 8080, NODE.name)
            for j in range(endpoints)
        )
    return Snapshot(ports, eps, NODE)


def backend() -> IptablesBackend:
    return IptablesBackend(V4, {IPFamily.IPv4: FakeIptables(IPFamily.IPv4)}, proc=NO_PROC)


def chain_lines(text: str) -> list[list[str]]:
    """The chain lines of each table part, in order."""
    parts: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("*"):
            parts.append([])
        elif line.startswith(":"):
            parts[-1].append(line[1:].split()[0])
    return parts


def test_chain_lines_are_declared_largest_first() -> None:
    text = backend().render(snapshot(40, 3))
    parts = chain_lines(text)
    assert [len(p) > 5 for p in parts] == [True, True]  # filter, nat
    for names in parts:
        assert names == sorted(names, reverse=True)


def test_the_ordered_input_means_what_the_unordered_one_did() -> None:
    snap = snapshot(40, 3)
    ordered = backend()
    ordered.sync(snap, None)
    # The same full sync, its input applied as built (chain lines in build order).
    unordered = backend()
    runner = unordered.runners[IPFamily.IPv4]
    fam = unordered._fams(unordered.plan(snap))[0]
    _, desired = unordered._build(unordered.plan(snap), fam)
    restore = desired.restore()
    unordered._ensure_jumps(runner, fam)
    built = [list(part.chains) for _, part in restore]
    assert built != [sorted(p, reverse=True) for p in built]  # the test means something
    runner.restore(restore)
    assert isinstance(runner, FakeIptables)
    assert ordered.runners[IPFamily.IPv4].dump() == runner.dump()  # type: ignore[attr-defined]


def test_declare_largest_first_keeps_rules_and_deletions_in_place() -> None:
    restore = Restore()
    restore.chain("nat", "KUBE-A")
    restore.chain("nat", "KUBE-C")
    restore.rule("nat", "KUBE-C", "-j", "KUBE-A")
    restore.rule("nat", "KUBE-A", "-j", "RETURN")
    restore.delete("nat", "KUBE-B")
    declare_largest_first(restore)
    assert str(restore).splitlines() == [
        "*nat",
        ":KUBE-C - [0:0]",
        ":KUBE-B - [0:0]",
        ":KUBE-A - [0:0]",
        "-A KUBE-C -j KUBE-A",
        "-A KUBE-A -j RETURN",
        "-X KUBE-B",
        "COMMIT",
    ]


def test_last_restore_keeps_small_restores_and_counts_big_ones() -> None:
    small = backend()
    small.sync(snapshot(3, 2), None)
    assert small.last_restore.startswith("*filter\n") and "COMMIT" in small.last_restore
    big = backend()
    result = big.sync(snapshot(200, 10), None)
    rules = sum(result.table_rules_written.values())
    assert rules > LAST_RESTORE_RULES
    assert big.last_restore == f"# a restore of {rules} rules (filter, nat)\n"


def test_rules_from_a_source_follow_the_plain_ones_and_are_checked() -> None:
    restore = Restore()
    restore.chain("nat", "KUBE-A")
    restore.rule("nat", "KUBE-A", "-j", "RETURN")
    restore.lazy_rules("nat", 2, lambda: [("KUBE-A", ("-s", "10.0.0.1")), ("KUBE-A", ())])
    assert restore.rule_count == 3
    text = "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j RETURN\n-A KUBE-A -s 10.0.0.1\n-A KUBE-A\nCOMMIT\n"
    assert str(restore) == text
    # Chunks are whole lines, however small.
    chunks = list(restore.chunks(size=1))
    assert "".join(chunks) == text
    assert all(c.endswith("\n") for c in chunks)
    bad = Restore()
    bad.lazy_rules("nat", 1, lambda: [("KUBE-A; rm", ())])
    with pytest.raises(RestoreError, match="invalid iptables chain name"):
        str(bad)


def test_a_full_sync_holds_no_rules_and_renders_them_as_it_prints() -> None:
    ipt = backend()
    snap = snapshot(40, 3)
    ipt.sync(snap, None)
    state = ipt._families[IPFamily.IPv4]
    # Per ServicePort: its chains as (name, rule count, hash), not the rules.
    held = next(iter(state.rules.values()))
    assert all(isinstance(n, int) and isinstance(h, int) for _, n, h in held.chains)
    fam = ipt._fams(ipt.plan(snap))[0]
    _, desired = ipt._build(ipt.plan(snap), fam)
    assert not any(c.startswith("KUBE-SEP-") for c in desired.chains["nat"])
    restore = desired.restore()
    (nat,) = [part for table, part in restore if table == "nat"]
    assert nat.sources and nat.rule_count == len(nat.rules) + sum(desired.own_counts.values())
    # Printed twice, the same rules.
    first = str(restore)
    assert "-A KUBE-SEP-" in first
    assert str(restore) == first


def test_kubelets_firewall_chain_and_its_jumps_are_ensured_in_every_family() -> None:
    """As upstream's sync (iptablesJumpChains with iptablesKubeletJumpChains): KUBE-FIREWALL
    and its jumps from INPUT and OUTPUT exist in both families, although its rule is only
    written for IPv4 with localhost NodePorts (here: neither). Upstream's cleanup then
    finds the node as it leaves it (tests/realk8s/test_differential.py's "both cleanups")."""
    config = replace(
        CONFIG,
        mode=ProxyMode.IPTABLES,
        families=(IPFamily.IPv4, IPFamily.IPv6),
        localhost_nodeports=False,
    )
    runners = {f: FakeIptables(f) for f in config.families}
    IptablesBackend(config, dict(runners), proc=NO_PROC).sync(Snapshot({}, {}, NODE), None)
    jumping = {
        (family, builtin)
        for family, runner in runners.items()
        for builtin in ("INPUT", "OUTPUT")
        if ("-j", "KUBE-FIREWALL") in runner.tables["filter"].chains[builtin].rules
        and "KUBE-FIREWALL" in runner.tables["filter"].chains
    }
    assert jumping == {(f, b) for f in config.families for b in ("INPUT", "OUTPUT")}
