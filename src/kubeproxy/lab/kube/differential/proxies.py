"""Upstream kube-proxy and kubeproxy, one after the other, on one node of the lab.

Both run in the node's network namespace with the same kubeconfig (deploy/'s
ServiceAccount), node name, mode and cluster CIDRs. Upstream's binary needs one flag
more than on a real node: ``--conntrack-max-per-core=0``. ``nf_conntrack_max`` belongs
to the initial network namespace (read-only in any other), and kube-proxy stops at
start when it must raise it and cannot; the host's value happens to be high enough
today, so the flag only keeps the comparison from depending on it. Both get it. Its
other start-up complaint in a namespace (``oom_score_adj``) is logged and ignored.
Nothing else is needed: each namespace has its own loopback, so the health (10256) and
metrics (10249) ports do not collide with another node's.

A :class:`Node` is the node's kernel state as the comparison sees it:

* :meth:`Node.rules` — every nftables object (iptables-nft's tables included) and the
  legacy iptables tables, counters and the elements of timed sets (session-affinity
  memory) left out: what "the rules did not change" is judged by;
* :meth:`Node.footprint` — the same with the timed sets' elements, plus nfacct objects:
  what a cleanup leaves;
* :meth:`Node.sysctls` — the settings either proxy writes (``route_localnet``, the
  conntrack timeouts...);
* :meth:`Node.health` — the running proxy's ``/healthz`` and ``/livez`` answers, their
  times left out (:func:`health_answer`);
* :meth:`Node.reset` — back to the baseline taken before the first run: no rules, no
  nfacct objects, an empty conntrack table, the baseline's sysctls. Each proxy starts
  from there.

:meth:`ProxyKind.start` runs a proxy and waits until its rules are in and steady;
:meth:`ProxyKind.cleanup` runs its one-shot cleanup. A run's cleanup is the *other*
implementation's first (a drop-in must be able to remove what the other left), then
its own; what the other's left is part of the comparison.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeproxy.dataplane.nftables.runner import LibNftables
from kubeproxy.lab.cluster import lab_env, stop_process
from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, KubeLab, wait_for
from kubeproxy.lab.kube.differential.configs import DEFAULT, Configuration
from kubeproxy.lab.netns import NetnsExecutor, ns_exec, temporary_netns
from kubeproxy.lab.rulestate import empty_rules, iptables_state, nft_state
from kubeproxy.lab.uml import in_guest

UPSTREAM, OURS = "upstream", "kubeproxy"
IMPLEMENTATIONS = (UPSTREAM, OURS)
# The settings a proxy may write at start (conntrack, localhost NodePorts, IPVS's ARP).
SYSCTLS = (
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/ip_forward",
    "net/ipv6/conf/all/forwarding",
    "net/ipv4/conf/all/arp_ignore",
    "net/ipv4/conf/all/arp_announce",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/netfilter/nf_conntrack_tcp_be_liberal",
    "net/netfilter/nf_conntrack_udp_timeout",
    "net/netfilter/nf_conntrack_udp_timeout_stream",
)
# The node's ICMP error rate limits, off while the comparison runs: both proxies REJECT
# with ICMP errors (TCP too), which the kernel sends at most once a second to a peer
# by default, so a probe's asks in a row were refused or timed out by chance, and
# records of the same rules disagreed. Neither proxy writes these.
ICMP_UNLIMITED = {"net/ipv4/icmp_ratelimit": "0", "net/ipv6/icmp/ratelimit": "0"}
# What the lab itself sets on a node (kubeproxy.lab.kube.cluster): kept from the node.
LAB_SYSCTLS = ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding")
START_TIMEOUT = 90.0
STEADY_FOR = 1.0  # the rules must stay the same this long (twice, polled) to be "in"
# In the user-mode-Linux guest a sync takes 10-15 s and changes the rules only near its
# end, and upstream's ipvs mode starts a second one a few seconds after its first.
GUEST_STEADY_FOR = 20.0
# kubeproxy's cleanup also detaches ebpf mode's hooks pinned under this path: the host's
# BPF filesystem is shared by every namespace, so point it where nothing is.
NO_PINS = "/sys/fs/bpf/kubeproxy-differential-none"


def _read_sysctls() -> dict[str, str]:
    out = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            out[key] = Path("/proc/sys", key).read_text().strip()
    return out


def _write_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        with contextlib.suppress(OSError):
            Path("/proc/sys", key).write_text(value)


def _swap_sysctls(values: dict[str, str]) -> dict[str, str]:
    before = {key: Path("/proc/sys", key).read_text().strip() for key in values}
    _write_sysctls(values)
    return before


HEALTH_PORT = 10256  # --healthz-bind-address's default: both proxies serve it
HEALTH_PATHS = ("/healthz", "/livez")
# The fields of upstream's ProxyHealth that hold times: the rest of the answer is compared.
_TIMES = frozenset({"lastUpdated", "currentTime"})


def health_answer(status: int, headers: Any, body: bytes) -> str:
    """One health answer as compared: the status, the two headers upstream sets, and the
    JSON body with sorted keys and every time replaced by ``T``."""

    def timeless(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: "T" if k in _TIMES else timeless(v) for k, v in value.items()}
        return value

    try:
        shown = json.dumps(timeless(json.loads(body)), sort_keys=True, separators=(",", ":"))
    except ValueError:
        shown = repr(body[:200])
    kinds = f"{headers.get('Content-Type')}; {headers.get('X-Content-Type-Options')}"
    return f"{status} ({kinds}) {shown}"


def _health() -> dict[str, str]:
    answers = {}
    for path in HEALTH_PATHS:
        url = f"http://127.0.0.1:{HEALTH_PORT}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                answers[path] = health_answer(response.status, response.headers, response.read())
        except urllib.error.HTTPError as err:
            answers[path] = health_answer(err.code, err.headers, err.read())
        except OSError as err:
            answers[path] = f"no answer ({type(err).__name__})"
    return answers


def _without_timed_elements(state: dict[str, Any]) -> dict[str, Any]:
    """Sets with timeouts (session-affinity memory) without their elements."""
    out = {}
    for key, value in state.items():
        timed = key.startswith("set ") and "timeout" in value.get("flags", ())
        out[key] = {k: v for k, v in value.items() if k != "elem"} if timed else value
    return out


_EXPIRES = re.compile(r'"expires": \d+')


@dataclass
class Node:
    """The node under comparison: its namespace and the baseline it is reset to."""

    lab: KubeLab
    name: str
    baseline_sysctls: dict[str, str] | None = None
    _nft: LibNftables | None = None

    @property
    def netns(self) -> str:
        return self.lab.nodes[self.name].netns

    @property
    def executor(self) -> NetnsExecutor:
        return self.lab.executor(self.netns)

    def footprint(self) -> dict[str, Any]:
        state: dict[str, Any] = dict(nft_state(self.netns))
        for key, value in iptables_state(self.netns, "legacy").items():
            if value:
                state[f"legacy {key}"] = value
        nfacct = ns_exec(self.netns, "nfacct", "list", check=False)
        names = sorted(re.findall(r"= (\S+?);", nfacct))
        if names:
            state["nfacct"] = names
        state.update(ipvs_state(self.netns))
        return state

    def rules(self) -> dict[str, Any]:
        return _without_timed_elements(self.footprint())

    def sysctls(self) -> dict[str, str]:
        return self.executor.call(_read_sysctls)

    def health(self) -> dict[str, str]:
        """The running proxy's /healthz and /livez answers (:func:`health_answer`)."""
        return self.executor.call(_health)

    def swap_sysctls(self, values: dict[str, str]) -> dict[str, str]:
        """Write ``values`` (any sysctls); the values they replaced."""
        return self.executor.call(_swap_sysctls, values)

    def clean(self) -> bool:
        """No rules beyond empty built-in chains (what iptables-nft leaves behind)."""
        return not leftovers(self.footprint())

    def reset(self) -> None:
        """No rules, no nfacct objects, no connections, the baseline's sysctls."""
        ns_exec(self.netns, "nft", "flush", "ruleset")
        if any(k.startswith("legacy ") for k in self.footprint()):
            empty_rules(self.netns, "iptables-legacy")
        ns_exec(self.netns, "nfacct", "flush", check=False)
        # ipvs mode's objects (the IPVS table exists only where the kernel has IPVS: in
        # the user-mode-Linux guest): the virtual servers, then the sets the rules
        # referred to, then the dummy link holding the Service addresses.
        ns_exec(self.netns, "ipvsadm", "--clear", check=False)
        ns_exec(self.netns, "ipset", "destroy", check=False)
        ns_exec(self.netns, "ip", "link", "del", IPVS_LINK, check=False)
        for family in ("ipv4", "ipv6"):
            ns_exec(self.netns, "conntrack", "-F", "-f", family, check=False)
        if self.baseline_sysctls is None:
            self.baseline_sysctls = {**self.sysctls(), **self._fresh_sysctls()}
        self.executor.call(_write_sysctls, self.baseline_sysctls)

    def _fresh_sysctls(self) -> dict[str, str]:
        """A new namespace's values of the settings proxies write (a proxy that ran on
        the node before, the session's kubeproxy, has changed the node's)."""
        with temporary_netns(f"{self.netns}-fresh") as fresh:
            executor = NetnsExecutor(fresh, workers=1)
            try:
                values = executor.call(_read_sysctls)
            finally:
                executor.shutdown()
        return {k: v for k, v in values.items() if k not in LAB_SYSCTLS}

    def affinity_forgetter(self) -> Callable[[], None] | None:
        """A function that empties every proxy's session-affinity memory (the timed
        nftables sets there are now, the xt_recent lists), so that the next connection
        chooses its endpoint afresh. In-process (libnftables from a thread in the node's
        namespace): it runs before every ask of an affinity probe.

        None in ipvs mode: IPVS keeps the memory as persistence templates in its
        connection table, which no interface deletes; there only the sticky asks run."""
        if "ipvs" in ipvs_state(self.netns):
            return None
        script = "".join(
            f"flush set {' '.join(key.split()[1:])}\n"
            for key, value in nft_state(self.netns).items()
            if key.startswith("set ") and "timeout" in value.get("flags", ())
        )
        if self._nft is None:
            self._nft = self.executor.call(LibNftables)
        nft = self._nft
        return lambda: self.executor.call(_forget, nft, script)


def _forget(nft: LibNftables, script: str) -> None:
    nft.apply_script(script)
    # /proc/net is the process's namespace; /proc/thread-self/net this thread's.
    for path in Path("/proc/thread-self/net").glob("xt_recent/*"):
        path.write_text("/\n")


IPVS_LINK = "kube-ipvs0"


def ipvs_state(netns: str) -> dict[str, Any]:
    """ipvs mode's kernel objects in ``netns``, where there are any: the IPVS virtual
    and real servers (``ipvsadm-save -n``), each ipset (``ipset NAME``: its ``ipset
    save`` lines) and the addresses of the ``kube-ipvs0`` link. Empty on a kernel
    without IPVS (the host)."""
    state: dict[str, Any] = {}
    servers = ns_exec(netns, "ipvsadm-save", "-n", check=False)
    if lines := sorted(line for line in servers.splitlines() if line.strip()):
        state["ipvs"] = lines
    for line in ns_exec(netns, "ipset", "save", check=False).splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("create", "add"):
            state.setdefault(f"ipset {words[1]}", []).append(line)
    for key in [k for k in state if k.startswith("ipset ")]:
        state[key] = sorted(state[key])
    link = ns_exec(netns, "ip", "-o", "addr", "show", "dev", IPVS_LINK, check=False)
    if addresses := sorted(re.findall(r"inet6? (\S+)", link)):
        state[f"link {IPVS_LINK}"] = addresses
    return state


def leftovers(footprint: dict[str, Any]) -> list[str]:
    """What is left beyond empty tables and built-in chains with no rules: the names of
    the objects (chains, sets, maps, rules' chains, nfacct), sorted."""
    out = []
    for key, value in footprint.items():
        kind = key.split()[0]
        if kind == "table":
            continue
        if kind == "chain" and value.get("hook") is not None:
            continue  # a base chain; its rules are listed under "rules ..."
        # "legacy FAMILY TABLE": that table's chain declarations, only built-in ones.
        declarations = kind == "legacy" and key.count(" ") == 2
        if declarations and all(line.split()[1] in ("ACCEPT", "DROP") for line in value):
            continue
        out.append(key)
    return sorted(out)


@dataclass(frozen=True)
class ProxyKind:
    """How to run one implementation on a node of the lab."""

    name: str

    def command(
        self, lab: KubeLab, node: str, mode: str, config: Configuration = DEFAULT
    ) -> list[str]:
        # Upstream's ipvs mode says its sync is done only at verbosity 4 (see synced).
        verbosity = "4" if self.name == UPSTREAM and mode == "ipvs" else "2"
        flags = [
            "--proxy-mode", mode, "--conntrack-max-per-core=0", f"--v={verbosity}",
            *config.flags,
        ]  # fmt: skip
        if mode == "ipvs":
            # No periodic resync while the probes run (they take minutes in the guest):
            # upstream's rewrites KUBE-LOAD-BALANCER-SOURCE-CIDR's entries of a /32 source
            # range on every sync (its entry text and the kernel's listing differ), and
            # the rules read before and after the probes must be the same.
            flags.append("--ipvs-sync-period=1h")
        cluster_cidr = ("--cluster-cidr", ",".join(CLUSTER_CIDRS)) if config.cluster_cidr else ()
        if self.name == OURS:
            return lab.kubeproxy_command(node, *flags, cluster_cidr=cluster_cidr)
        return [
            "ip", "netns", "exec", lab.nodes[node].netns, lab.binaries.kube_proxy,
            "--kubeconfig", str(lab.node_kubeconfig(node)),
            "--hostname-override", node,
            *cluster_cidr,
            *flags,
        ]  # fmt: skip

    def cleanup_command(self, lab: KubeLab, netns: str) -> list[str]:
        if self.name == OURS:
            return ["ip", "netns", "exec", netns, sys.executable,
                    "-m", "kubeproxy", "cleanup", "--ebpf-pin-path", NO_PINS]  # fmt: skip
        return ["ip", "netns", "exec", netns, lab.binaries.kube_proxy, "--cleanup"]

    def synced(self, log: str, mode: str = "nftables") -> bool:
        """The first full sync is done (upstream: one per family)."""
        if self.name == OURS:
            return "Synced full rules" in log
        done = "syncProxyRules complete" if mode == "ipvs" else "SyncProxyRules complete"
        return all(f'"{done}" ipFamily="{f}"' in log for f in ("IPv4", "IPv6"))

    @contextlib.contextmanager
    def running(
        self, node: Node, mode: str, log: Path, config: Configuration = DEFAULT
    ) -> Iterator[subprocess.Popen[str]]:
        """The proxy on ``node`` with its first sync done and its rules steady."""
        log.write_text("")
        proc = node.lab.spawn(self.command(node.lab, node.name, mode, config), log)
        try:
            wait_for(
                lambda: (
                    self._alive(proc, log) and self.synced(log.read_text(errors="replace"), mode)
                ),
                timeout=START_TIMEOUT,
                what=f"{self.name}'s first sync on {node.name}",
            )
            steady(node, lambda: self.idle(log.read_text(errors="replace"), mode))
            yield proc
        finally:
            stop_process(proc)

    def syncs(self, log: str) -> int:
        """How many syncs the log shows done (upstream: one per family, at -v=2; its ipvs
        mode's at -v=4)."""
        if self.name == OURS:
            return log.count("Synced ")
        return log.count("SyncProxyRules complete") + log.count("syncProxyRules complete")

    def idle(self, log: str, mode: str) -> bool:
        """No sync in progress, as far as the log tells (upstream's ipvs mode logs each
        sync's start and end at -v=4; the others: assumed)."""
        if self.name == UPSTREAM and mode == "ipvs":
            return log.count('"Syncing ipvs proxier rules"') == log.count(
                '"syncProxyRules complete"'
            )
        return True

    def _alive(self, proc: subprocess.Popen[str], log: Path) -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {log.read_text(errors='replace')[-3000:]}")
        return True

    def cleanup(self, node: Node) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cleanup_command(node.lab, node.netns),
            capture_output=True,
            text=True,
            check=False,
            env=lab_env(),
        )


def steady(
    node: Node, idle: Callable[[], bool] = lambda: True, timeout: float = 120.0
) -> dict[str, Any]:
    """Wait until the node's rules stay the same for :data:`STEADY_FOR` (in the guest
    :data:`GUEST_STEADY_FOR`; a sync that a late watch event starts shows itself) and the
    proxy is ``idle``; the rules."""
    window = GUEST_STEADY_FOR if in_guest() else STEADY_FOR
    deadline = time.monotonic() + timeout
    last = node.rules()
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(min(window, STEADY_FOR) / 2)
        now = node.rules()
        if now != last or not idle():
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= window:
            return now
    raise TimeoutError(f"the rules on {node.name} kept changing for {timeout}s")


def dump(value: Any) -> str:
    return _EXPIRES.sub('"expires": 0', json.dumps(value, sort_keys=True, indent=1))


PROXIES = {name: ProxyKind(name) for name in IMPLEMENTATIONS}
