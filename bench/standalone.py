"""The standalone cluster at scale: a manifest directory's worth of raw objects, and one change.

    .venv/bin/python -m bench.standalone              # 10,000 Services x 10 Pods, 1,000 Nodes
    .venv/bin/python -m bench.standalone --services 1000

No root, no files: :class:`~kubeproxy.controlplane.standalone.StandaloneCluster` is pure.
The cluster is :func:`bench.controlplane.make_cluster`'s (fixed seed, 3 zones,
``topology-mode: Auto``) with the Services' ClusterIPs removed, so everything is allocated.
Timed phases:

* ``start``: the first batch (every Node, Service and Pod ADDED): ClusterIPs allocated,
  every Service parsed, slices and hints computed, model events out;
* ``restart``: the same on a new cluster given the first one's saved allocations;
* ``one Pod turned not ready`` / ``one Pod's annotation changed``: a batch of one Pod
  event on the started cluster, the median of ``--changes`` different Pods; the first
  must emit exactly one slice event, the second none.

Prints a Markdown table and, last, one JSON line with the raw numbers.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import resource
import statistics
import time
from typing import Any

from bench.controlplane import cluster_arguments, make_cluster
from kubeproxy.controlplane.standalone import StandaloneCluster
from kubeproxy.model.events import Event, RawObject
from kubeproxy.model.types import NamespacedName

Obj = dict[str, Any]


def raw(kind: str, doc: Obj) -> RawObject:
    meta = doc["metadata"]
    return RawObject(kind, NamespacedName(meta.get("namespace", ""), meta["name"]), doc)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cluster_arguments(parser)
    parser.add_argument("--changes", type=int, default=200)
    args = parser.parse_args(argv)

    nodes, cluster = make_cluster(args.services, args.pods, args.nodes)
    batch = [Event.added(raw("Node", n)) for n in nodes.values()]
    for given, pods in cluster:
        svc = copy.deepcopy(given)
        del svc["spec"]["clusterIP"], svc["spec"]["ipFamilies"], svc["metadata"]["uid"]
        batch.append(Event.added(raw("Service", svc)))
        batch += [Event.added(raw("Pod", p)) for p in pods]
    gc.collect()
    if args.gc_freeze:
        gc.freeze()

    started = time.perf_counter()
    first = StandaloneCluster()
    out = first.apply(batch)
    t_start = time.perf_counter() - started
    saved = first.allocations()

    started = time.perf_counter()
    again = StandaloneCluster(remembered=saved)
    out_again = again.apply(batch)
    t_restart = time.perf_counter() - started
    assert again.allocations() == saved, "a restart must keep every allocation"

    def one_change(edit: str) -> tuple[float, list[int]]:
        times, emitted = [], []
        step = max(1, len(cluster) // args.changes)
        for _, pods in cluster[::step][: args.changes]:
            old = pods[0]
            new = copy.deepcopy(old)
            if edit == "not-ready":
                new["status"]["conditions"][0]["status"] = "False"
            else:
                new["metadata"]["annotations"] = {"touched": "yes"}
            event = [Event.modified(raw("Pod", old), raw("Pod", new))]
            t0 = time.perf_counter()
            events = first.apply(event)
            times.append(time.perf_counter() - t0)
            emitted.append(len(events))
            first.apply([Event.modified(raw("Pod", new), raw("Pod", old))])  # undo
        return statistics.median(times), emitted

    t_ready, ready_events = one_change("not-ready")
    t_noop, noop_events = one_change("annotation")
    assert set(ready_events) == {1}, ready_events
    assert set(noop_events) == {0}, noop_events
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print(
        f"{args.services:,} Services without clusterIP x {args.pods} Pods, {args.nodes:,} "
        f"Nodes in 3 zones, topology-mode Auto; {len(batch):,} raw objects\n"
    )
    print("| phase | time | events out |")
    print("|---|---|---|")
    print(f"| start: allocate, parse, slices + hints | {t_start:.2f} s | {len(out):,} |")
    print(f"| restart with the saved allocations | {t_restart:.2f} s | {len(out_again):,} |")
    print(f"| one Pod turned not ready (median) | {t_ready * 1e6:.0f} us | 1 slice |")
    print(f"| one Pod's annotation changed (median) | {t_noop * 1e6:.0f} us | 0 |")
    print(f"\npeak RSS {peak_mb:.0f} MB")
    print(
        json.dumps(
            {
                "services": args.services,
                "pods": args.pods,
                "nodes": args.nodes,
                "start_s": t_start,
                "restart_s": t_restart,
                "pod_not_ready_s": t_ready,
                "pod_noop_s": t_noop,
                "peak_rss_mb": peak_mb,
            }
        )
    )


if __name__ == "__main__":
    main()
