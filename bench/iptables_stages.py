"""``python -m bench.iptables_stages RENDER.txt --chains 5000 --stages 22`` (root): would a
cold iptables-nft load cost less time and memory split into several restores?

Issue 25 part 3's idea for the restore child's peak at 10,000 x 10 (520 MB of the tree's
~870 MB): load the ServicePorts' own nat chains in restores of ``--chains`` chains, then
the rest. Input: the IPv4 part of ``kubeproxy render --proxy-mode iptables`` output. The
stages go in dependency order: every ``KUBE-SEP-`` chain first (they jump only to
``KUBE-MARK-MASQ``, declared in the first stage), then ``KUBE-SVC-``/``KUBE-SVL-`` (which
jump to the ``KUBE-SEP-`` chains now in the kernel), then ``KUBE-EXT-``/``KUBE-FW-``,
then one restore with the filter table and the rest of nat. Each stage is timed, with
``iptables-nft-restore``'s peak RSS (``/usr/bin/time``); ``--stages N`` stops after N.
Uses one scratch namespace, ``kpstage``, deleted at the end.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import time
from pathlib import Path

from kubeproxy.lab.netns import add_netns, delete_netns

NS = "kpstage"
TOOL = ["/usr/bin/time", "-f", "%M", "iptables-nft-restore", "--noflush"]
OWN = re.compile(r"KUBE-(SEP|SVC|SVL|EXT|FW)-[A-Z0-9]{16}$")


def restore(body: str) -> tuple[float, float]:
    """Seconds, and the tool's peak RSS in MB."""
    started = time.perf_counter()
    done = subprocess.run(
        ["ip", "netns", "exec", NS, *TOOL],
        input=body,
        text=True,
        capture_output=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"restore failed: {done.stderr[-500:]}")
    return time.perf_counter() - started, int(done.stderr.split()[-1]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.iptables_stages", description=__doc__)
    parser.add_argument("render", type=Path)
    parser.add_argument("--chains", type=int, default=5000)
    parser.add_argument("--stages", type=int, default=1_000_000)
    args = parser.parse_args()
    ipv4 = args.render.read_text().split("# ip6tables-restore")[0].splitlines()
    nat_at = ipv4.index("*nat")
    filter_lines = ipv4[ipv4.index("*filter") + 1 : nat_at - 1]  # without COMMIT
    declared: dict[str, str] = {}
    rules: dict[str, list[str]] = {}
    for line in ipv4[nat_at + 1 :]:
        if line.startswith(":"):
            name = line[1:].split()[0]
            declared[name] = line
            rules.setdefault(name, [])
        elif line.startswith("-A "):
            rules.setdefault(line.split()[1], []).append(line)
    own = [c for c in declared if OWN.match(c)]
    rest = [c for c in declared if not OWN.match(c)]
    groups = [
        [c for c in own if c.startswith("KUBE-SEP-")],
        [c for c in own if c.startswith(("KUBE-SVC-", "KUBE-SVL-"))],
        [c for c in own if c.startswith(("KUBE-EXT-", "KUBE-FW-"))],
    ]
    add_netns(NS)
    try:
        stage = 0
        for group in groups:
            for i in range(0, len(group), args.chains):
                chunk = group[i : i + args.chains]
                head = ["*nat", ":KUBE-MARK-MASQ - [0:0]"] if stage == 0 else ["*nat"]
                body = [*head, *(declared[c] for c in chunk)]
                body += [r for c in chunk for r in rules[c]]
                seconds, peak = restore("\n".join([*body, "COMMIT", ""]))
                stage += 1
                kind = chunk[0][:9]
                print(f"stage {stage}: {len(chunk)} {kind} chains, {seconds:.2f} s, {peak:.0f} MB")
                if stage >= args.stages:
                    return 0
        body = ["*filter", *filter_lines, "COMMIT", "*nat", *(declared[c] for c in rest)]
        body += [r for c in rest for r in rules[c]]
        seconds, peak = restore("\n".join([*body, "COMMIT", ""]))
        print(f"final: {len(rest)} chains, {seconds:.2f} s, {peak:.0f} MB")
    finally:
        delete_netns(NS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
