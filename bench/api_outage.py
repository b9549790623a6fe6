"""The API server away for 10 minutes, then back with a 410 (issue 12 part 5), as root.

    python -m bench.api_outage [--services 1000] [--outage 600] [--quiet-outage 60]

Builds a lab (namespaces created and deleted here), serves ``--services`` Services with
the API stand-in in node-a's namespace, starts ``kubeproxy run --master`` there with
upstream's default timings (syncPeriod 30 s, minSyncPeriod 1 s, API backoff capped at
30 s) and waits until it has programmed them. Then the scenario of :mod:`tests.outage`
twice: ``--outage`` seconds away while three Services change (one's endpoints, one
deleted, one created), then ``--quiet-outage`` seconds away with nothing changed.
Prints, per outage, the kernel checks made while the stand-in was away (all must find
the rules unchanged), the /healthz answers, and after the return the seconds until the
kernel showed the changes, the syncs that carried changes, full syncs, and the Service
and EndpointSlice changes the proxy saw. Exits 1 if a property fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from tests.netns_api import NetnsApi, start_kubeproxy
from tests.outage import LOCAL_1, LOCAL_2, REMOTE_1, OutageResult, answer, objects, outage

from kubeproxy.lab.cluster import NODE, NODE_IP, NODE_IP6, REMOTE_NODE, Lab
from kubeproxy.lab.objects import node

PODS = {
    name: (where, ip)
    for name, ip, where in (LOCAL_1, LOCAL_2, REMOTE_1, ("client", "10.244.1.100", NODE))
}


def report(name: str, result: OutageResult, changes: int) -> bool:
    ok = (
        result.rules_changed == 0
        and result.unhealthy == 0
        and result.last_sync_advanced
        and result.full_syncs == 0
        and result.service_changes <= changes
        and result.endpoint_changes <= changes
    )
    print(f"{name}: {result.seconds:g} s away")
    print(
        f"  kernel rules + a ClusterIP probe checked {result.checks} times while away: "
        f"{result.rules_changed} differed; /healthz not 200: {result.unhealthy}; "
        f"last-sync timestamp advanced: {result.last_sync_advanced}"
    )
    print(
        f"  back: converged {result.converged_after:.1f} s after the stand-in returned; "
        f"full syncs {result.full_syncs:g}; Service changes seen "
        f"{result.service_changes:g}, EndpointSlice changes seen {result.endpoint_changes:g}"
    )
    print(f"  syncs with changes after the return: {len(result.change_syncs)}")
    for line in result.change_syncs:
        print(f"    {line.split('] ', 1)[-1][:220]}")
    print(f"  {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_outage")
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--outage", type=float, default=600.0)
    parser.add_argument("--quiet-outage", type=float, default=60.0)
    parser.add_argument("--log", type=Path, help="keep kubeproxy's log (--v=2) here")
    parser.add_argument("--v", type=int, default=2, help="kubeproxy's log verbosity")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, Lab(f"kpbo{os.getpid() % 100000}") as lab:
        for name, (where, ip) in PODS.items():
            lab.add_pod(name, where, [ip], ports=(8080,))
        api = NetnsApi(lab.node_ns)
        try:
            api.call(api.api.create, node(NODE, [NODE_IP, NODE_IP6], zone="zone-a"))
            api.call(api.api.create, node(REMOTE_NODE, ["192.168.50.2"], zone="zone-a"))
            for obj in objects(args.services):
                api.call(api.api.create, obj)
            log = args.log or Path(tmp) / "kubeproxy.log"
            started = time.monotonic()
            proc = start_kubeproxy(lab, api, log, f"--v={args.v}")
            deadline = started + 120
            while answer(lab, "10.97.0.1") not in ("local-1", "remote-1"):
                if time.monotonic() > deadline or proc.poll() is not None:
                    print(log.read_text(), file=sys.stderr)
                    return 1
                time.sleep(0.2)
            print(f"{args.services} Services programmed in {time.monotonic() - started:.1f} s")
            ok = report(
                "outage with 3 Services changed",
                outage(lab, api, log, args.outage, change=True, probe_every=10.0),
                3,
            )
            ok &= report(
                "outage with nothing changed",
                outage(lab, api, log, args.quiet_outage, change=False, probe_every=5.0),
                0,
            )
            ok &= proc.poll() is None
        except AssertionError as err:
            print(f"FAIL: {err}; kubeproxy's log: {log.read_text()[-4000:]}", file=sys.stderr)
            return 1
        finally:
            api.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
