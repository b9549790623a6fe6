"""bench.differential's verdict: a pass only when every batch finished, saw stable API
objects, and found no unknown difference."""

from __future__ import annotations

from bench.differential import _summary

from kubeproxy.lab.kube.differential.compare import Difference
from kubeproxy.lab.kube.differential.run import ModeResult


def result(*, unstable: bool = False, unknown: bool = False) -> ModeResult:
    differences = [Difference("nftables", "s1 web:http cluster-ip TCP x from node", "a", "b")]
    return ModeResult(
        mode="nftables",
        seeds=[1],
        upstream={},
        ours={},
        facts={},
        differences=differences if unknown else [],
        unstable=["Service ns/web"] if unstable else [],
    )


def test_a_run_passes_only_when_every_batch_finished_stable_and_explained() -> None:
    assert _summary([result()], [], 1.0) == 0
    assert _summary([result(unknown=True)], [], 1.0) == 1
    assert _summary([result()], [[2, 3]], 1.0) == 1  # a batch the harness did not finish
    assert _summary([result(unstable=True)], [], 1.0) == 1
