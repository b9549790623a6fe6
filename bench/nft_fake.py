"""The strict nftables fake's own cost: how long the big syncs of its unit tests take.

``python -m bench.nft_fake [--services 10000] [--rounds 3]`` (no root).

tests/unit/test_nft_fake.py checks that the fake's interval checks stay linear by
counting the comparisons they make; this prints the time, which the tests do not
assert: a full sync of ``--services`` Services (3 ports, 4 endpoints, 2 firewall
intervals each: ~150,000 elements), the same over the flushed table, a partial sync,
and 200 one-element adds to an interval set of 20,000 elements. Each figure is the
best of ``--rounds``.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.nft_fake_cases import big_syncs, firewall_of

from kubeproxy.dataplane.nftables.fake import FakeNftables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    best: dict[str, float] = {}

    def keep(label: str, seconds: float) -> None:
        best[label] = min(best.get(label, seconds), seconds)

    for _ in range(args.rounds):
        _, syncs = big_syncs(args.services)
        fake = FakeNftables()
        for label, tx in zip(("full sync", "full sync again", "partial sync"), syncs, strict=True):
            started = time.perf_counter()
            fake.apply(tx)
            keep(label, time.perf_counter() - started)
        fake, adds = firewall_of(20_000)
        started = time.perf_counter()
        for tx in adds:
            fake.apply(tx)
        keep("200 interval adds", time.perf_counter() - started)
    print(f"| FakeNftables, {args.services} Services | best of {args.rounds} |\n|---|---:|")
    for label, seconds in best.items():
        print(f"| {label} | {seconds:.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
