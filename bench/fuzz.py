"""The fuzzing properties of issue 12 part 1, run long (CI runs a few hundred examples).

    python -m bench.fuzz [--examples 10000] [--kernel-examples 1000] [--seed 0]

``--properties`` picks some of parse, mixed, config, standalone, kernel (default: all).
Runs, with ``--examples`` examples each (Hypothesis, no example database, fixed seed), the
properties of :mod:`tests.fuzz_objects`: parsing a mutated object raises only
InvalidObjectError; good and mutated objects through the manifest source cost one log
line per rejected object and leave both renders byte-identical; a mutated config file
fails only with ConfigError. As root, ``--kernel-examples`` renders of mixed states are
also checked by the kernel (``nft -c``, iptables-restore, both flavours and families) in
a scratch namespace created and deleted here, and so are the largest objects (1,000
ports, 10,000 endpoints). Prints what it tried; exits 1 on the first falsified property
(Hypothesis prints the minimal example).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from tests.fuzz_objects import (
    Doc,
    big_objects,
    check_config,
    check_mixed,
    check_parse,
    check_standalone,
    config_document,
    kernel_refusals,
    load,
    mixed_objects,
    mixed_snapshot,
    one_mutated,
    renders,
    standalone_objects,
)

from kubeproxy.lab.netns import add_netns, delete_netns


def run(
    name: str,
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], Counter[str] | str],
    examples: int,
    random_seed: int,
) -> Counter[str]:
    """Run one property; returns what it tried (and "examples")."""
    tally: Counter[str] = Counter()

    @seed(random_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def prop(value: Any) -> None:
        outcome = check(value)
        tally["examples"] += 1
        if isinstance(outcome, str):
            tally[outcome] += 1
        else:
            tally.update(outcome)

    start = time.perf_counter()
    prop()
    elapsed = time.perf_counter() - start
    # Hypothesis also runs (and counts) the examples it shrinks; only a pass gets here.
    counts = ", ".join(f"{k} {v:,}" for k, v in sorted(tally.items()))
    print(f"{name}: passed in {elapsed:.0f} s ({counts})", flush=True)
    return tally


PROPERTIES: dict[str, tuple[str, st.SearchStrategy[Any], Callable[[Any], Any]]] = {
    "parse": ("parse: only InvalidObjectError, API path agrees", one_mutated(), check_parse),
    "mixed": (
        "mixed: one line per bad object, renders unchanged",
        mixed_objects(),
        lambda objects: check_mixed(*objects),
    ),
    "config": ("config: only ConfigError", config_document(), check_config),
    "standalone": (
        "standalone: control plane survives hostile Pods/Services/Nodes",
        standalone_objects(),
        check_standalone,
    ),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--kernel-examples", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--properties",
        default=",".join([*PROPERTIES, "kernel"]),
        help=f"comma-separated, from {','.join(PROPERTIES)},kernel (default: all)",
    )
    args = parser.parse_args()
    # The rejected objects' log lines are the subject, not the output.
    logging.getLogger("kubeproxy").addHandler(logging.NullHandler())
    logging.getLogger("kubeproxy").propagate = False

    print(
        f"python -m bench.fuzz --examples {args.examples} "
        f"--kernel-examples {args.kernel_examples} --seed {args.seed} "
        f"--properties {args.properties}",
        flush=True,
    )
    chosen = args.properties.split(",")
    for name in chosen:
        if name in PROPERTIES:
            title, strategy, check = PROPERTIES[name]
            run(title, strategy, check, args.examples, args.seed)
    if "kernel" in chosen and args.kernel_examples and os.geteuid() == 0:
        netns = f"kpfuzzb{os.getpid() % 100000}"
        add_netns(netns)
        try:

            def kernel(objects: tuple[list[Doc], list[Doc]]) -> str:
                assert kernel_refusals(netns, renders(mixed_snapshot(*objects))) == []
                return "accepted"

            run(
                "kernel: every render accepted",
                mixed_objects(),
                kernel,
                args.kernel_examples,
                args.seed,
            )
            start = time.perf_counter()
            snapshot, _ = load(big_objects())
            assert kernel_refusals(netns, renders(snapshot)) == []
            print(
                f"kernel: 1,000-port Service and 10,000-endpoint slice accepted "
                f"({time.perf_counter() - start:.1f} s)"
            )
        finally:
            delete_netns(netns)
    elif "kernel" in chosen and args.kernel_examples:
        print("kernel: skipped (needs root)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
