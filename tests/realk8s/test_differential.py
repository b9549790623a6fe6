"""Same packets as upstream: kube-proxy v1.37 and kubeproxy on node-a, probe by probe.

:mod:`kubeproxy.lab.kube.differential` applies seeded cluster states through the real
API server, runs upstream kube-proxy and then kubeproxy on node-a (from a node without
proxy rules each time) in nftables and iptables modes, sends the same probes through
both (Pods on this node and another, the node, the outside host; every ClusterIP,
NodePort, external IP, load-balancer IP and health check; TCP and UDP) and compares
which Pods answer, the source address they see, and DROP against REJECT. Upstream is
the oracle: any difference not listed in docs/differences-from-upstream.md fails.

CI runs the fixed seeds below (together they cover every feature the generator has,
:data:`~kubeproxy.lab.kube.differential.states.FEATURES`) and the pinned states of
:mod:`~kubeproxy.lab.kube.differential.pinned` (each difference found and fixed, kept
as a regression test against upstream), with fewer asks per probe than the bench
(``python -m bench.differential`` runs hundreds of seeds).

node-a's session kubeproxy stops for this module and is started again afterwards, on a
node cleaned of everything the comparison ran.
"""

from __future__ import annotations

import json

import pytest

from kubeproxy.backends.iptables.names import DISPATCH_PREFIX
from kubeproxy.lab.kube.cluster import wait_for
from kubeproxy.lab.kube.differential import pinned
from kubeproxy.lab.kube.differential.configs import CI_CONFIGURATIONS, DEFAULT
from kubeproxy.lab.kube.differential.proxies import OURS, PROXIES, UPSTREAM
from kubeproxy.lab.kube.differential.run import Differential, ModeResult, results_json
from kubeproxy.lab.kube.differential.states import FEATURES, features
from tests.realk8s.conftest import DIFFERENTIAL_NODE

# The comparison runs once for the module, in the first test that needs it: several
# minutes on a busy machine (bench/RESULTS.md has the times).
pytestmark = pytest.mark.timeout(1200)

NODE = DIFFERENTIAL_NODE
# Two states with every feature between them (the ipvs test's seeds too; 24, 389 and 395
# before 2026-11-29: one state less is about a minute less of CI).
SEEDS = (593, 1550)
MODES = ("nftables", "iptables")


@pytest.fixture(scope="module")
def results(differential: Differential) -> dict[str, ModeResult]:
    states = differential.generate(SEEDS) + pinned.states(
        differential.slots, NODE, first_block=len(SEEDS)
    )
    # Besides the defaults, CI's configuration over the pinned state only (a minute).
    done = differential.run(
        states, MODES, (DEFAULT, *CI_CONFIGURATIONS), config_seeds={pinned.FIRST_SEED}
    )
    # For a failure's reader: every record, and where each run's time went.
    (differential.workdir / "results.json").write_text(results_json(done))
    (differential.workdir / "seconds.json").write_text(json.dumps(differential.seconds, indent=1))
    return {r.mode if r.config == DEFAULT.name else f"{r.mode} {r.config}": r for r in done}


def test_the_fixed_seeds_cover_every_feature_of_the_generator(differential: Differential) -> None:
    covered = set().union(*(features(s) for s in differential.generate(SEEDS)))
    assert covered == FEATURES, f"not covered: {sorted(FEATURES - covered)}"


@pytest.mark.parametrize(
    "mode", [*MODES, *(f"{m} {c.name}" for c in CI_CONFIGURATIONS for m in MODES)]
)
def test_every_probe_goes_where_upstream_sends_it(
    results: dict[str, ModeResult], mode: str
) -> None:
    result = results[mode]
    # Both proxies saw the same objects (no resourceVersion moved between the runs).
    assert result.unstable == []
    assert len(result.upstream) > (100 if mode in MODES else 30)
    unexplained = result.unexplained()
    assert unexplained == [], "\n".join(d.line() for d in unexplained)
    # The node ended clean after each run's two cleanups, whatever they left.
    for implementation, facts in result.facts.items():
        assert facts["both cleanups"].startswith("exit 0"), implementation


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", pinned.CASES, ids=lambda c: c.name)
def test_a_difference_found_once_stays_fixed(
    results: dict[str, ModeResult], mode: str, case: pinned.Case
) -> None:
    """Each pinned case's probes answer as upstream's do, and as the case says."""
    result = results[mode]
    keys = [k for k in result.upstream if case.selects(k)]
    assert keys, f"no probe of {case.name}"
    for key in keys:
        assert set(result.ours[key]) == set(result.upstream[key]), key
        assert case.as_said(mode, result.upstream[key]), (key, result.upstream[key])


def test_upstream_started_where_kubeproxy_ran_takes_its_iptables_chains_over(
    differential: Differential, results: dict[str, ModeResult]
) -> None:
    """A rollback without ``kubeproxy cleanup``: upstream kube-proxy's first sync deletes
    kubeproxy's nat dispatch chains with its own stale ones, and a Service going away
    later does not fail its syncs (with dispatch chains it cannot delete, every restore
    deleting a chain they jump to failed)."""
    assert results  # the comparison ran first (the fixtures share node-a)
    node, workdir = differential.node, differential.workdir
    state = pinned.rollback(differential.slots, NODE, block=len(SEEDS) + 1)
    ours_log, upstream_log = workdir / "rollback-ours.log", workdir / "rollback-upstream.log"
    with differential.applied([state]):
        node.reset()
        with PROXIES[OURS].running(node, "iptables", ours_log):
            pass  # stopped: its rules stay, as when a DaemonSet's Pod is replaced
        assert nat_dispatch_chains(node.rules())
        with PROXIES[UPSTREAM].running(node, "iptables", upstream_log):
            assert nat_dispatch_chains(node.rules()) == []
            synced = upstream_log.read_text().count("SyncProxyRules complete")
            differential.api.delete("Service", "web", differential.namespace(state.seed))
            wait_for(
                lambda: upstream_log.read_text().count("SyncProxyRules complete") >= synced + 2,
                what="upstream's syncs after the Service went",
            )
            assert "Failed to execute iptables-restore" not in upstream_log.read_text()
    node.reset()


def nat_dispatch_chains(rules: dict[str, object]) -> list[str]:
    return [
        k
        for k in rules
        if k.startswith(("chain ip nat ", "chain ip6 nat "))
        and k.split()[-1].startswith(DISPATCH_PREFIX)
    ]
