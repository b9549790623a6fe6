"""Differential packet testing against upstream kube-proxy, many states (issue 25).

    python -m bench.differential [--states 200] [--modes nftables,iptables]
                                 [--first-seed 1000 | --seeds S,S...] [--batch 4]
                                 [--budget full|ci] [--out DIR] [--guest] [--pinned]
                                 [--configs defaults,masquerade-all,...|all]

(root; the upstream binaries: ``KUBEPROXY_UPSTREAM_BIN`` or scripts/build-upstream.)
Builds the real-Kubernetes lab (:mod:`kubeproxy.lab.kube`: three nodes in two zones,
no proxy on any), then for seeds ``first-seed ...`` in batches of ``--batch`` states
applied side by side runs :class:`kubeproxy.lab.kube.differential.run.Differential` on
node-a: upstream kube-proxy, then kubeproxy, in each mode, every probe of the matrix.
Writes each batch's result as a JSON line to ``DIR/results.jsonl`` (the states to
``DIR/from-FIRST/states-SEED.json``, the proxies' logs beside them) as it goes, prints one line
per batch and mode, and at the end a summary: states, probes, differences grouped by
kind (known ones by their id in docs/differences-from-upstream.md). A batch the
harness cannot finish (a wait that times out, a proxy that does not start) is written
as ``{"seeds": [...], "error": ...}``, its objects deleted and the node reset, and the
run goes on (three in a row stop it). ``touch DIR/stop`` ends the run before the next
batch; SIGTERM or SIGINT (even in the background) end it at once, the lab torn down.
Exits 1 if a difference is not known, a batch was not finished, or the API objects of
a batch changed during its runs (either compared nothing it can vouch for). CI runs a
few fixed seeds (tests/realk8s/test_differential.py; in ipvs mode, in the guest:
tests/realk8s/test_differential_ipvs.py). ``--pinned`` adds the hand-made states of
:mod:`~kubeproxy.lab.kube.differential.pinned` (each difference found and fixed) to the
first batch: the Services a pinned case has outcomes for in ``--modes`` (the host test,
tests/realk8s/test_differential.py, takes them all).

``--guest`` runs the whole of it (control plane, nodes, proxies, probes) inside the
user-mode-Linux guest (:mod:`bench.guest`): the kernel there has IPVS, which
``--modes ipvs`` needs and the host lacks. The guest's nf_tables has no ip families, so
there ``iptables`` is the legacy variant for both proxies, and nftables mode cannot
run. Session affinity is compared by its sticky asks only in ipvs mode (see
:meth:`~kubeproxy.lab.kube.differential.proxies.Node.affinity_forgetter`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

from bench import guest
from kubeproxy.lab import uml
from kubeproxy.lab.kube.binaries import find
from kubeproxy.lab.kube.cluster import KubeLab, wait_for
from kubeproxy.lab.kube.differential import changes, pinned
from kubeproxy.lab.kube.differential import states as st
from kubeproxy.lab.kube.differential.changerun import run_changes
from kubeproxy.lab.kube.differential.compare import signature
from kubeproxy.lab.kube.differential.configs import CONFIGURATIONS, DEFAULT, named
from kubeproxy.lab.kube.differential.probes import CI_BUDGET
from kubeproxy.lab.kube.differential.run import Differential, ModeResult

ROOT = Path(__file__).resolve().parents[1]
NODES = (("node-a", "zone-a"), ("node-b", "zone-b"), ("node-c", "zone-a"))
# A batch the harness could not finish (a wait timed out, a proxy did not start...) is
# recorded and skipped; this many in a row stop the run (the lab itself is broken).
MAX_FAILED_IN_A_ROW = 3
RECOVER_TIMEOUT = 300.0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=200)
    parser.add_argument("--modes", default="nftables,iptables")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument(
        "--seeds", default=None, help="these seeds (comma-separated) instead of a range"
    )
    parser.add_argument("--batch", type=int, default=4)
    # ci: the CI test's fewer asks and shorter waits (more states in an hour; a
    # disagreement is still asked again, longer).
    parser.add_argument("--budget", choices=("full", "ci"), default="full")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "differential")
    parser.add_argument("--guest", action="store_true", help="inside the UML guest (ipvs)")
    parser.add_argument("--pinned", action="store_true", help="and the pinned states")
    parser.add_argument("--guest-timeout", type=float, default=guest.TIMEOUT, help="seconds")
    parser.add_argument(
        "--changes",
        action="store_true",
        help="change sequences instead of states (kubeproxy.lab.kube.differential.changes): "
        "--states of them, from --first-seed (default 500000)",
    )
    parser.add_argument(
        "--configs",
        default=DEFAULT.name,
        help="configurations, comma-separated, or 'all' "
        "(kubeproxy.lab.kube.differential.configs; each in each mode it applies to)",
    )
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    try:
        configs = CONFIGURATIONS if args.configs == "all" else named(args.configs.split(","))
    except ValueError as err:
        parser.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.guest and not uml.in_guest():
        return guest.rerun("bench.differential", argv, [args.out], timeout=args.guest_timeout)
    guest.inside()
    first = args.first_seed
    if args.changes and first == parser.get_default("first_seed"):
        first = changes.FIRST_SEED
    seeds = (
        [int(s) for s in args.seeds.split(",")]
        if args.seeds
        else list(range(first, first + args.states))
    )
    results: list[ModeResult] = []
    failed: list[list[int]] = []
    started = time.monotonic()
    prefix = f"kpdf{os.getpid() % 10000}"
    # Run in the background (SIGINT ignored), it still tears the lab down when told to stop.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    with tempfile.TemporaryDirectory(prefix="kubeproxy-differential-") as tmp:
        lab = KubeLab(prefix, Path(tmp), find())
        try:
            lab.build(NODES)
            budget = CI_BUDGET if args.budget == "ci" else None
            # The proxies' logs are numbered from 001 in each run: a run resumed with
            # --first-seed into the same DIR must not write over an earlier one's.
            logs = args.out / f"from-{seeds[0]}"
            diff = Differential(lab, "node-a", "df", logs, budget=budget)
            try:
                diff.setup()
                failed_in_a_row = 0
                for i in range(0, len(seeds), args.batch):
                    if (args.out / "stop").exists():
                        print(f"{args.out / 'stop'} found: stopped before seed {seeds[i]}")
                        break
                    batch = seeds[i : i + args.batch]
                    if args.changes:
                        sequences = [
                            changes.generate(seed, diff.slots, "node-a", block)
                            for block, seed in enumerate(batch)
                        ]
                        states = [s.start for s in sequences]
                    else:
                        states = diff.generate(batch)
                    if args.pinned and i == 0 and not args.changes:
                        states += pinned.states(diff.slots, "node-a", len(batch), modes)
                    try:
                        done = (
                            run_changes(diff, sequences, modes, configs)
                            if args.changes
                            else diff.run(states, modes, configs)
                        )
                        for result in done:
                            results.append(result)
                            _report(result, args.out, time.monotonic() - started)
                    except Exception as err:  # the harness's, not a difference: go on
                        failed.append(batch)
                        failed_in_a_row += 1
                        _failed(batch, err, args.out, time.monotonic() - started)
                        if failed_in_a_row >= MAX_FAILED_IN_A_ROW:
                            raise
                        _recover(diff, states)
                    else:
                        failed_in_a_row = 0
            finally:
                diff.close()
        finally:
            lab.close()
    return _summary(results, failed, time.monotonic() - started)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _report(result: ModeResult, out: Path, elapsed: float) -> None:
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(result.to_json()) + "\n")
    unexplained = result.unexplained()
    print(
        f"[{elapsed:6.0f}s] seeds {result.seeds[0]}-{result.seeds[-1]} {result.mode}"
        f"{'' if result.config == DEFAULT.name else f' ({result.config})'}: "
        f"{len(result.upstream)} probes, {result.asked_again} asked again, "
        f"{len(result.differences)} differences ({len(unexplained)} unknown)"
        + (f", UNSTABLE {len(result.unstable)}" if result.unstable else ""),
        flush=True,
    )
    for d in unexplained:
        print("  " + d.line().replace("\n", "\n  "), flush=True)


def _failed(batch: list[int], err: Exception, out: Path, elapsed: float) -> None:
    """A batch the harness did not finish: its seeds and the error, in the results."""
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps({"seeds": batch, "error": text}) + "\n")
    print(f"[{elapsed:6.0f}s] seeds {batch[0]}-{batch[-1]} FAILED (harness): {text}", flush=True)
    traceback.print_exc()


def _recover(diff: Differential, states: list[st.State]) -> None:
    """After a failed batch: its namespaces and ServiceCIDRs deleted and gone (the next
    batch uses the same address blocks), the node reset."""
    api = diff.api
    for state in states:
        ns = diff.namespace(state.seed)
        with contextlib.suppress(Exception):
            diff.delete(state)
        for kind, name in (("Namespace", ns), ("ServiceCIDR", f"{ns}-cidr")):
            with contextlib.suppress(Exception):
                api.delete(kind, name)
        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda ns=ns: (
                    not any(api.list_of(kind, ns) for kind in ("Service", "EndpointSlice", "Pod"))
                ),
                timeout=RECOVER_TIMEOUT,
                what=f"seed {state.seed}'s objects gone",
            )
    diff.node.reset()


def _summary(results: list[ModeResult], failed: list[list[int]], elapsed: float) -> int:
    by_mode: Counter[str] = Counter()
    probes: Counter[str] = Counter()
    kinds: Counter[tuple[str, str, str]] = Counter()
    for r in results:
        mode = r.mode if r.config == DEFAULT.name else f"{r.mode} ({r.config})"
        by_mode[mode] += len(r.seeds)
        probes[mode] += len(r.upstream)
        for d in r.differences:
            kinds[(mode, d.known or "UNKNOWN", signature(d))] += 1
    print(f"\n{elapsed / 60:.1f} min")
    for mode in by_mode:
        print(f"{mode}: {by_mode[mode]} states, {probes[mode]} probes")
    for (mode, known, sig), n in sorted(kinds.items()):
        print(f"  {mode} {known}: {n} x {sig}")
    for batch in failed:
        print(f"seeds {batch[0]}-{batch[-1]}: not finished (the harness failed; see above)")
    unstable = sum(1 for r in results if r.unstable)
    if unstable:
        print(f"{unstable} batches saw the API objects change during the runs")
    # A batch not finished, or whose objects moved under the proxies, compared nothing
    # it can vouch for: the run is not a pass.
    unknown = any(k == "UNKNOWN" for _, k, _ in kinds)
    return 1 if unknown or failed or unstable else 0


if __name__ == "__main__":
    sys.exit(main())
