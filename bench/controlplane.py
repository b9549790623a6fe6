"""The EndpointSlice controller at scale: slices and topology hints for a whole cluster.

    .venv/bin/python -m bench.controlplane            # 10,000 Services x 10 Pods, 1,000 Nodes
    .venv/bin/python -m bench.controlplane --services 1000 --repeats 1

No root, no kernel: :mod:`kubeproxy.controlplane` is pure. The cluster is made here with a
fixed seed: 1,000 Ready Nodes spread over 3 zones (allocatable CPU 4, 8 or 16), 10,000
Services with ``service.kubernetes.io/topology-mode: Auto``, each selecting 10 ready
Pods on random Nodes. Timed phases (best of ``--repeats``):

* ``set_nodes``: zone CPU ratios from the 1,000 Nodes;
* ``first sync``: every Service reconciled from no slices (slices computed, hints added,
  the Enabled event);
* ``resync, nothing changed``: every Service again against the slices the first sync
  produced (what a controller restart or periodic resync costs: nothing to write);
* ``resync, 1 Pod changed per Service``: one Pod per Service turned not ready (one slice
  update each, hints recomputed).

Prints a Markdown table and, last, one JSON line with the raw numbers.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import resource
import time
from collections.abc import Callable
from typing import Any

from kubeproxy.controlplane.endpointslice import ReconcileResult, reconcile
from kubeproxy.controlplane.topologycache import TopologyCache

Obj = dict[str, Any]
ZONES = ("zone-a", "zone-b", "zone-c")


def make_cluster(
    services: int, pods_per_service: int, nodes: int, seed: int = 1
) -> tuple[dict[str, Obj], list[tuple[Obj, list[Obj]]]]:
    rng = random.Random(seed)
    node_objs = {}
    for i in range(nodes):
        name = f"node-{i}"
        node_objs[name] = {
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": ZONES[i % 3]}},
            "status": {
                "allocatable": {"cpu": rng.choice(("4", "8", "16"))},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    names = list(node_objs)
    cluster = []
    for s in range(services):
        svc_name = f"svc-{s}"
        svc = {
            "metadata": {
                "name": svc_name,
                "namespace": "default",
                "uid": f"uid-{svc_name}",
                "annotations": {"service.kubernetes.io/topology-mode": "Auto"},
            },
            "spec": {
                "selector": {"app": svc_name},
                "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}],
                "ipFamilies": ["IPv4"],
                "clusterIP": f"10.96.{s // 250}.{s % 250 + 1}",
            },
        }
        pods = []
        for p in range(pods_per_service):
            index = s * pods_per_service + p
            pods.append(
                {
                    "metadata": {
                        "name": f"{svc_name}-{p}",
                        "namespace": "default",
                        "uid": f"pod-uid-{index}",
                        "labels": {"app": svc_name},
                    },
                    "spec": {"nodeName": rng.choice(names)},
                    "status": {
                        "phase": "Running",
                        "podIPs": [{"ip": f"10.{index >> 16}.{(index >> 8) & 255}.{index & 255}"}],
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
        cluster.append((svc, pods))
    return node_objs, cluster


def apply(slices: list[Obj], result: ReconcileResult, counter: list[int]) -> list[Obj]:
    """The slices after an API server carried out ``result`` (names for created ones)."""
    by_name = {s["metadata"]["name"]: s for s in slices}
    for doomed in result.to_delete:
        by_name.pop(doomed["metadata"]["name"], None)
    for updated in result.to_update:
        by_name[updated["metadata"]["name"]] = updated
    for created in result.to_create:
        counter[0] += 1
        named = dict(created)
        named["metadata"] = {**created["metadata"], "name": f"slice-{counter[0]}"}
        by_name[named["metadata"]["name"]] = named
    return list(by_name.values())


def best_of(repeats: int, run: Callable[[], Any]) -> tuple[float, Any]:
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = run()
        best = min(best, time.perf_counter() - start)
    return best, value


def cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster's size (:func:`make_cluster`) and ``--gc-freeze``, for every bench of it."""
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="move the input objects out of the garbage collector's sight (gc.freeze)",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cluster_arguments(parser)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    nodes, cluster = make_cluster(args.services, args.pods, args.nodes)
    if args.gc_freeze:
        # What a controller holding a large informer cache can do: the cyclic collector
        # otherwise rescans the 100,000 input Pods on every full collection.
        gc.freeze()
    t_nodes, _ = best_of(args.repeats, lambda: TopologyCache().set_nodes(nodes.values()))

    def first_sync() -> tuple[TopologyCache, list[list[Obj]], int, int]:
        fresh = TopologyCache()  # a new controller: every Service gets its Enabled event
        fresh.set_nodes(nodes.values())
        all_slices, events, hinted = [], 0, 0
        counter = [0]
        for svc, pods in cluster:
            result = reconcile(svc, pods, [], nodes, topology_cache=fresh)
            events += len(result.events)
            hinted += sum(1 for s in result.to_create for ep in s["endpoints"] if "hints" in ep)
            all_slices.append(apply([], result, counter))
        return fresh, all_slices, events, hinted

    t_first, (warm, slices, events, hinted) = best_of(args.repeats, first_sync)

    def resync(pod_sets: list[list[Obj]]) -> int:
        writes = 0
        for (svc, _), pods, existing in zip(cluster, pod_sets, slices, strict=True):
            result = reconcile(svc, pods, existing, nodes, topology_cache=warm)
            writes += len(result.to_create) + len(result.to_update) + len(result.to_delete)
        return writes

    unchanged_pods = [pods for _, pods in cluster]
    t_noop, noop_writes = best_of(args.repeats, lambda: resync(unchanged_pods))
    changed_pods = []
    for _, pods in cluster:
        edited = list(pods)
        edited[0] = copy.deepcopy(pods[0])
        edited[0]["status"]["conditions"][0]["status"] = "False"
        changed_pods.append(edited)
    t_change, change_writes = best_of(args.repeats, lambda: resync(changed_pods))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    endpoints = args.services * args.pods
    print(
        f"{args.services:,} Services x {args.pods} Pods ({endpoints:,} endpoints), "
        f"{args.nodes:,} Nodes in 3 zones, topology-mode Auto; best of {args.repeats}"
        f"{'; gc.freeze() after building the inputs' if args.gc_freeze else ''}\n"
    )
    print("| phase | time | per Service | slice writes |")
    print("|---|---|---|---|")
    for label, seconds, writes in (
        (f"set_nodes ({args.nodes:,} Nodes)", t_nodes, None),
        ("first sync: slices + hints from nothing", t_first, sum(len(s) for s in slices)),
        ("resync, nothing changed", t_noop, noop_writes),
        ("resync, 1 Pod per Service turned not ready", t_change, change_writes),
    ):
        per = "" if writes is None else f"{seconds / args.services * 1e6:.0f} us"
        shown = "" if writes is None else f"{writes:,}"
        print(f"| {label} | {seconds * 1000:.0f} ms | {per} | {shown} |")
    print(
        f"\nendpoints hinted: {hinted:,} of {endpoints:,}; events: {events:,}; "
        f"peak RSS {peak_mb:.0f} MB"
    )
    print(
        json.dumps(
            {
                "services": args.services,
                "pods": args.pods,
                "nodes": args.nodes,
                "set_nodes_s": t_nodes,
                "first_sync_s": t_first,
                "resync_noop_s": t_noop,
                "resync_change_s": t_change,
                "slices": sum(len(s) for s in slices),
                "noop_writes": noop_writes,
                "change_writes": change_writes,
                "hinted": hinted,
                "gc_freeze": args.gc_freeze,
                "events": events,
                "peak_rss_mb": peak_mb,
            }
        )
    )


if __name__ == "__main__":
    main()
