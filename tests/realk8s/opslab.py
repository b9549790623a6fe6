"""Helpers of the operations tests (test_rbac, test_events, test_faults, test_commands,
test_deploy): what an operator does to a cluster, done to the lab's real one.

* :func:`spare_host` — a network namespace on the lab's bridge that is no node: where a
  second kubeproxy (other credentials) or upstream's kube-proxy may program a firewall
  without touching the session's nodes;
* :func:`service_account_kubeconfig` — a ServiceAccount's token in a kubeconfig, as the
  DaemonSet's Pod would hold it;
* :func:`kubeproxy` (one-shot commands in a namespace) and :func:`start_proxy` (``run``);
* :func:`can_i` — ``kubectl auth can-i --list`` as a set of (resource, verb) pairs;
* :func:`allowed` — one SubjectAccessReview;
* :func:`in_pod` — a command in a node's namespace with a Pod's files mounted where the
  kubelet mounts them (a private mount namespace) and no capability, as the preflight Pod
  of docs/replacing-kube-proxy.md runs it;
* :func:`proxy_pid` — the session's kubeproxy on a node, to freeze it (SIGSTOP) while the
  cluster moves on without it.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubeproxy.lab.cluster import lab_env
from kubeproxy.lab.kube.cluster import CLUSTER_CIDRS, SUBNET4, KubeLab
from kubeproxy.lab.kube.controlplane import kubeconfig
from kubeproxy.lab.netns import add_netns, addr, delete_netns, sh, veth

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@contextlib.contextmanager
def spare_host(kube: KubeLab, name: str, index: int) -> Iterator[str]:
    """Network namespace ``<prefix>-<name>`` on the bridge at 172.31.0.``index`` (no Node
    object, no Pods behind it), deleted by name on exit."""
    ns = f"{kube.prefix}-{name}"
    add_netns(ns)
    try:
        port = f"s{name}"[:15]
        veth(kube.net_ns, port, ns, "eth0")
        sh("ip", "-n", kube.net_ns, "link", "set", port, "master", "br0")
        addr(ns, "eth0", f"{SUBNET4}.{index}/24")
        yield ns
    finally:
        delete_netns(ns)


def service_account_token(kube: KubeLab, name: str, namespace: str, *bound: str) -> str:
    """A token of ServiceAccount ``namespace/name`` (``bound``: kubectl create token's
    --bound-object-* flags, as the kubelet's projected tokens are bound to their Pod)."""
    out = kube.kubectl("create", "token", name, "-n", namespace, "--duration", "1h", *bound)
    return out.stdout.strip()


def service_account_kubeconfig(kube: KubeLab, path: Path, token: str) -> Path:
    return kubeconfig(path, kube.cp.server, kube.cp.certificates().ca.cert, token=token)


def kubeproxy_command(netns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", netns, sys.executable, "-m", "kubeproxy", *args]


def kubeproxy(
    netns: str, *args: str, input: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``kubeproxy ARGS`` (a one-shot: list, render, explain...) inside ``netns``."""
    return subprocess.run(
        kubeproxy_command(netns, *args),
        capture_output=True, text=True, input=input, env=lab_env(), timeout=timeout,
        check=False,
    )  # fmt: skip


def start_proxy(
    kube: KubeLab, netns: str, config: Path, node: str, log: Path, *flags: str
) -> subprocess.Popen[str]:
    """``kubeproxy run`` in ``netns`` with ``config`` as its kubeconfig, as node ``node``,
    logging to ``log`` at --v=2 (stop it with kubeproxy.lab.cluster.stop_process)."""
    command = kubeproxy_command(
        netns, "run", "--kubeconfig", str(config), "--hostname-override", node,
        "--cluster-cidr", ",".join(CLUSTER_CIDRS), "--proxy-mode", "nftables", "--v=2",
        *flags,
    )  # fmt: skip
    return kube.spawn(command, log)


def can_i(kube: KubeLab, user: str) -> set[tuple[str, str]]:
    """``kubectl auth can-i --list --as USER`` (in namespace default) as (resource or
    non-resource URL, verb) pairs. The table has no machine-readable form: its columns are
    cut where the header's titles start."""
    table = kube.kubectl("auth", "can-i", "--list", "--as", user).stdout.splitlines()
    header = table[0]
    starts = [header.index(title) for title in ("Resources", "Non-Resource URLs", "Verbs")]
    pairs = set()
    for line in table[1:]:
        resource = line[starts[0] : starts[1]].strip()
        urls = line[starts[1] :].split("]", 1)[0].strip(" [")
        verbs = line[starts[2] :].strip(" []").split()
        for verb in verbs:
            pairs.add((resource or urls, verb))
    return pairs


def allowed(kube: KubeLab, user: str, group: str, resource: str, verb: str) -> bool:
    """Whether the API server's authorizer lets ``user`` do it now (a SubjectAccessReview:
    RBAC changes reach the authorizer through its informers, a moment after the write)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "resourceAttributes": {
                "verb": verb,
                "group": group,
                "resource": resource,
                "namespace": "default" if resource == "events" else "",
            },
        },
    }
    body = kube.api().request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(body["status"].get("allowed"))


def in_pod(
    netns: str, files: Mapping[str, str], command: list[str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``command`` inside ``netns`` (a node's: hostNetwork) as a container would run it:
    ``files`` (absolute path -> content: a ConfigMap's keys, the projected service-account
    token) where the kubelet mounts them, in a mount namespace of its own over fresh
    tmpfs on /var/lib and /run (the host's stay untouched), the root filesystem read-only
    (readOnlyRootFilesystem) and no capability at all (``capabilities: drop: [ALL]``)."""
    script = ["set -e", "mount -t tmpfs tmpfs /var/lib", "mount -t tmpfs tmpfs /run"]
    for target, content in files.items():
        script.append(f"mkdir -p {shlex.quote(str(Path(target).parent))}")
        script.append(f"printf %s {shlex.quote(content)} > {shlex.quote(target)}")
    script += [
        "mount -o remount,bind,ro /",
        "exec setpriv --bounding-set -all --inh-caps -all --ambient-caps -all -- "
        + shlex.join(command),
    ]
    return subprocess.run(
        ["ip", "netns", "exec", netns, "unshare", "--mount", "--propagation", "private",
         "sh", "-c", "\n".join(script)],
        capture_output=True, text=True, env=lab_env(), timeout=timeout, check=False,
    )  # fmt: skip


def proxy_pid(kube: KubeLab, node: str) -> int:
    """The pid of the session's ``kubeproxy run`` on ``node``."""
    for pid in sh("ip", "netns", "pids", kube.nodes[node].netns).split():
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"kubeproxy" in argv and b"run" in argv:
                return int(pid)
    raise LookupError(f"no kubeproxy runs on {node}")


def events_about(kube: KubeLab, node: str) -> list[dict[str, Any]]:
    """The Starting events about Node ``node``, as ``kubectl get events`` reads them (the
    core/v1 view of events.k8s.io/v1 Events)."""
    out = kube.kubectl(
        "get", "events", "-A", "-o", "json", "--show-managed-fields",
        "--field-selector", f"reason=Starting,involvedObject.kind=Node,involvedObject.name={node}",
    )  # fmt: skip
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items
