"""kubeproxy's ``Starting`` Event, read back with kubectl, against the one upstream's
kube-proxy posts to the same API server.

The oracle is upstream's kube-proxy v1.37, run on a host of its own (a spare namespace
on the bridge, with a Node object for it) with kube-proxy's identity as kubeadm gives it
(a ServiceAccount bound to ``system:node-proxier``). Both Events are read the way an
operator reads them (``kubectl get events -A --field-selector reason=Starting,...``) and
compared field by field, the node's name and the times aside.

Found here: kubeproxy's ``regarding`` carried ``uid: <node name>`` (kube-proxy's old
nodeRef); v1.37's has none (fixed). The one difference left is on purpose: the field
manager, which the API server takes from the User-Agent (``kubeproxy`` vs
``kube-proxy``), so that audit logs and managed fields tell the two proxies apart.
"""

from __future__ import annotations

import re
from typing import Any

from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.kube.cluster import SUBNET4, KubeLab, wait_for
from tests.realk8s.opslab import (
    events_about,
    service_account_kubeconfig,
    service_account_token,
    spare_host,
)

ORACLE_HOST = 51  # 172.31.0.51


def as_kubectl_shows(event: dict[str, Any], node: str) -> dict[str, Any]:
    """The Event without what differs by nature: its name, times, object metadata, and
    the node's name (replaced by NODE)."""
    shown = {k: v for k, v in event.items() if k not in ("metadata", "eventTime")}
    shown["involvedObject"] = {
        k: ("NODE" if v == node else v) for k, v in event["involvedObject"].items()
    }
    return shown


def test_the_starting_event_reads_as_upstreams(kube: KubeLab, namespace: str) -> None:
    # Ours: the session's kubeproxy on node-a recorded it at start.
    ours = wait_for(lambda: events_about(kube, "node-a"), what="kubeproxy's event")[0]

    node = f"{namespace}-upstream"
    api = kube.api()
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
        }
    )
    binding = f"{namespace}-node-proxier"
    try:
        ip = f"{SUBNET4}.{ORACLE_HOST}"
        # kube-proxy waits for its Node's addresses; no Ready condition, so the
        # EndpointSlice controller's topology logic ignores this Node.
        api.patch_status(
            "Node", node, {"status": {"addresses": [{"type": "InternalIP", "address": ip}]}}
        )
        kube.kubectl("-n", namespace, "create", "serviceaccount", "kube-proxy")
        kube.kubectl(
            "create", "clusterrolebinding", binding, "--clusterrole", "system:node-proxier",
            "--serviceaccount", f"{namespace}:kube-proxy",
        )  # fmt: skip
        token = service_account_token(kube, "kube-proxy", namespace)
        config = service_account_kubeconfig(kube, kube.workdir / f"{node}.kubeconfig", token)
        with spare_host(kube, "events", ORACLE_HOST) as host:
            proc = kube.spawn(
                ["ip", "netns", "exec", host, kube.binaries.kube_proxy,
                 "--kubeconfig", str(config), "--hostname-override", node,
                 "--proxy-mode", "nftables", "--conntrack-max-per-core=0", "--v=2"],
                kube.workdir / f"{node}.log",
            )  # fmt: skip
            try:
                theirs = wait_for(
                    lambda: events_about(kube, node), timeout=60, what="kube-proxy's event"
                )[0]
            finally:
                stop_process(proc)
    finally:
        kube.kubectl("delete", "clusterrolebinding", binding, check=False)
        api.delete("Node", node)

    assert as_kubectl_shows(ours, "node-a") == as_kubectl_shows(theirs, node)
    # What that is, spelled out: a Normal "Starting" event with action StartKubeProxy,
    # regarding the Node, reported by kube-proxy from kube-proxy-<host name>.
    assert ours["reason"] == "Starting" and ours["action"] == "StartKubeProxy"
    assert ours["type"] == "Normal" and ours["reportingComponent"] == "kube-proxy"
    assert ours["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "node-a"}
    assert ours["reportingInstance"].startswith("kube-proxy-")
    for event, name in ((ours, "node-a"), (theirs, node)):
        assert event["metadata"]["namespace"] == "default"
        assert re.fullmatch(rf"{re.escape(name)}\.[0-9a-f]{{16}}", event["metadata"]["name"])
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", event["eventTime"])
    # The same fields set, each by its own manager (named after the User-Agent).
    (mine,) = ours["metadata"]["managedFields"]
    (upstream,) = theirs["metadata"]["managedFields"]
    assert mine["fieldsV1"] == upstream["fieldsV1"]
    assert (mine["manager"], upstream["manager"]) == ("kubeproxy", "kube-proxy")
