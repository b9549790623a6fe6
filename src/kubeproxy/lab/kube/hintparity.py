"""EndpointSlices and topology hints: kubeproxy's controller against the real one.

A seeded generator makes a random cluster (:func:`random_cluster`): Nodes in up to four
zones with various allocatable CPU, some not Ready, some control-plane Nodes, now and then
one without a zone or without CPU; Pods on them, ready or not, terminating now and then,
single- or dual-stack; Services with ``topology-mode: Auto``, ``trafficDistribution``
(PreferClose, PreferSameZone, PreferSameNode), both, or neither, single- or dual-stack,
some publishing not-ready addresses. :func:`apply` writes it through the API of a real
control plane (Node and Pod objects with the status a kubelet would write; no kubelet,
no Pod namespaces: only the controller's output matters), Pods first and Services last,
so that kube-controller-manager's first sync of each Service already sees everything.
:func:`expected` gives the objects *as the API server holds them* to
:func:`kubeproxy.controlplane.endpointslice.reconcile` with a
:class:`~kubeproxy.controlplane.topologycache.TopologyCache`, and :func:`compare` checks
the real controller's EndpointSlices and Events against ours:

* endpoints (addresses, ready/serving/terminating, node, zone) and ports, per address
  type: equal;
* ``trafficDistribution`` hints: equal, endpoint by endpoint;
* ``topology-mode: Auto``: hints on every ready endpoint or on none, equal to ours in
  that; the reason when none (the ``TopologyAwareHintsDisabled`` event's message); and
  when hinted, how many endpoints each zone is hinted and how many each zone gave away,
  which must be one of the results kubeproxy's algorithm gives under *some* order of
  zones with equal amounts (upstream takes them in Go map order, :func:`auto_outcomes`).
  Which endpoint of a giving zone is re-hinted is also map order upstream, so it is not
  compared.
* Events: the same ``TopologyAwareHints*`` reasons and messages (the address type of an
  "enabled" event is left out: upstream visits address types in map order).

:func:`run_seed` does all of it for one seed and deletes what it made.
:func:`node_cpu_change` shows a difference kept on purpose: upstream's hints follow a
Node's allocatable CPU only at the next Node event that is not a status update.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.controlplane.endpointslice import hints_enabled, reconcile, select_pods
from kubeproxy.controlplane.standalone import StandaloneCluster
from kubeproxy.controlplane.topologycache import TopologyCache, giving_and_receiving_zones
from kubeproxy.lab.kube.api import Api, Obj
from kubeproxy.lab.kube.cluster import wait_for
from kubeproxy.model.events import Event, RawObject
from kubeproxy.model.types import NamespacedName

ZONES = ("zone-a", "zone-b", "zone-c", "zone-d")
CPUS = ("1", "2", "3", "4", "8", "16", "500m", "1500m", "2500m")
ZONE_LABEL = "topology.kubernetes.io/zone"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
NODE_MARK = "kubeproxy.dev/hint-parity"  # a label on every Node a run makes
FINALIZER = "kubeproxy.dev/hint-parity"  # keeps a terminating Pod terminating
APP = "app"


# ------------------------------------------------------------------------- generation


@dataclass
class RandomCluster:
    seed: int
    namespace: str
    nodes: list[Obj]  # Node objects with the status to write
    pods: list[Obj]  # Pod objects with the status to write; "terminating" in labels
    services: list[Obj]


def random_cluster(seed: int, namespace: str = "") -> RandomCluster:
    rng = random.Random(seed)
    # Mostly clusters where hints can work; now and then one where they cannot.
    zones = list(ZONES[: rng.choices([1, 2, 3, 4], [1, 5, 4, 3])[0]])
    # Now and then one size for every Node, and as many Nodes in each zone: zones then
    # tie, and upstream breaks ties in Go map order.
    uniform = rng.choice(CPUS) if rng.random() < 0.3 else None
    balanced = uniform is not None and rng.random() < 0.6
    nodes = []
    for i in range(rng.randint(3, 8)):
        labels = {"kubernetes.io/hostname": f"h{seed}-n{i}", NODE_MARK: "true"}
        if rng.random() > 0.02:
            labels[ZONE_LABEL] = zones[i % len(zones)] if balanced else rng.choice(zones)
        if rng.random() < 0.08:
            labels["node-role.kubernetes.io/control-plane"] = ""
        cpu = "0" if rng.random() < 0.015 else uniform or rng.choice(CPUS)
        ready = rng.random() > 0.1
        nodes.append(_node(f"h{seed}-n{i}", labels, cpu, ready))
    namespace = namespace or f"hints-{seed}"
    services = []
    for j in range(rng.randint(1, 3)):
        services.append(_random_service(rng, f"svc{j}", namespace))
    dual = rng.random() < 0.5
    pods = []
    for k in range(rng.randint(2, 30)):
        node = rng.choice(nodes)
        index = nodes.index(node)
        ips = [f"10.{200 + seed % 50}.{index}.{k + 10}"]
        if dual and rng.random() < 0.8:
            # As a kubelet may spell it: zero groups, upper case.
            ip6 = f"fd00:{200 + seed % 50:x}:{index:x}::{k + 10:x}"
            ips.append(ip6.upper() if rng.random() < 0.2 else ip6)
        pods.append(
            _pod(
                f"p{k}",
                namespace,
                node["metadata"]["name"],
                {APP: rng.choice(services)["spec"]["selector"][APP]},
                ips,
                ready=rng.random() < 0.85,
                terminating=rng.random() < 0.06,
            )
        )
    return RandomCluster(seed, namespace, nodes, pods, services)


def _random_service(rng: random.Random, name: str, namespace: str) -> Obj:
    annotations: dict[str, str] = {}
    spec: Obj = {
        "selector": {APP: name},
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
    }
    mode = rng.choices(["auto", "distribution", "both", "none"], [45, 30, 10, 15])[0]
    if mode in ("auto", "both"):
        key = rng.choice(
            ["service.kubernetes.io/topology-mode", "service.kubernetes.io/topology-aware-hints"]
        )
        annotations[key] = rng.choice(["Auto", "Auto", "auto"])
    if mode in ("distribution", "both"):
        spec["trafficDistribution"] = rng.choice(
            ["PreferClose", "PreferSameZone", "PreferSameNode"]
        )
    family = rng.choices(["single", "dual", "ipv6"], [60, 30, 10])[0]
    if family == "dual":
        spec["ipFamilyPolicy"] = "RequireDualStack"
    elif family == "ipv6":
        spec["ipFamilies"] = ["IPv6"]
    if rng.random() < 0.1:
        spec["publishNotReadyAddresses"] = True
    meta: Obj = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec}


def _node(name: str, labels: dict[str, str], cpu: str, ready: bool) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeproxyLab",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                }
            ],
        },
    }


def _pod(
    name: str,
    namespace: str,
    node: str,
    labels: dict[str, str],
    ips: list[str],
    *,
    ready: bool,
    terminating: bool,
) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if terminating:
        meta["finalizers"] = [FINALIZER]
    status = "True" if ready else "False"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "kubeproxy-lab/echo",
                    "ports": [{"name": "http", "containerPort": 8080}],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": ips[0],
            "podIPs": [{"ip": ip} for ip in ips],
            "conditions": [
                {"type": t, "status": status, "lastTransitionTime": _now()}
                for t in ("Ready", "ContainersReady")
            ],
        },
    }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ------------------------------------------------------------------------ real cluster


def clear_nodes(api: Api) -> None:
    for node in api.list_of("Node", labelSelector=NODE_MARK):
        api.delete("Node", node["metadata"]["name"])


def apply(api: Api, cluster: RandomCluster) -> None:
    """Write ``cluster`` through the API: Nodes (replacing an earlier run's), Pods, then
    Services."""
    clear_nodes(api)
    for node in cluster.nodes:
        api.create({k: v for k, v in node.items() if k != "status"})
        api.patch_status("Node", node["metadata"]["name"], {"status": node["status"]})
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cluster.namespace}})
    for pod in cluster.pods:
        meta = pod["metadata"]
        api.create({k: v for k, v in pod.items() if k != "status"})
        api.patch_status("Pod", meta["name"], {"status": pod["status"]}, cluster.namespace)
        if meta.get("finalizers"):
            _delete_pod(api, cluster.namespace, meta["name"])  # stays, terminating
    for service in cluster.services:
        api.create(service)


def _delete_pod(api: Api, namespace: str, name: str) -> None:
    api.request(
        "DELETE",
        f"/api/v1/namespaces/{namespace}/pods/{name}",
        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
    )


def remove(api: Api, cluster: RandomCluster) -> None:
    """Delete what :func:`apply` made but the Nodes (the next run replaces them)."""
    for service in cluster.services:
        api.delete("Service", service["metadata"]["name"], cluster.namespace)
    for pod in api.list_of("Pod", cluster.namespace):
        name = pod["metadata"]["name"]
        if pod["metadata"].get("finalizers"):
            api.patch("Pod", name, {"metadata": {"finalizers": None}}, cluster.namespace)
        if not pod["metadata"].get("deletionTimestamp"):
            _delete_pod(api, cluster.namespace, name)
    api.delete("Namespace", cluster.namespace)


@dataclass
class Observed:
    """One side's view of one Service: its slices, and its events' (reason, message)s
    (None: not known, not compared)."""

    slices: list[Obj]
    events: set[tuple[str, str]] | None


def observe(api: Api, cluster: RandomCluster) -> dict[str, Observed]:
    """The real controller's EndpointSlices and Events, by Service name."""
    slices = api.list_of("EndpointSlice", cluster.namespace)
    events = api.list_of("Event", cluster.namespace)
    out = {}
    for service in cluster.services:
        name = service["metadata"]["name"]
        out[name] = Observed(
            [
                s
                for s in slices
                if s["metadata"]["labels"].get("kubernetes.io/service-name") == name
            ],
            {
                _event_key(e["reason"], e["message"])
                for e in events
                if e["involvedObject"].get("kind") == "Service"
                and e["involvedObject"].get("name") == name
                and e["reason"].startswith("TopologyAwareHints")
            },
        )
    return out


def _event_key(reason: str, message: str) -> tuple[str, str]:
    if reason == "TopologyAwareHintsEnabled":
        message = message.split(", addressType:", maxsplit=1)[0]
    return reason, message


# ----------------------------------------------------------------------------- ours


@dataclass
class Inputs:
    """The objects as the API server holds them: what the real controller saw."""

    nodes: list[Obj]
    pods: list[Obj]
    services: list[Obj]


def read_inputs(api: Api, cluster: RandomCluster) -> Inputs:
    def kind(kind: str, items: list[Obj]) -> list[Obj]:
        return [{"apiVersion": "v1", "kind": kind, **item} for item in items]  # lists omit it

    return Inputs(
        kind("Node", api.list_of("Node")),
        kind("Pod", api.list_of("Pod", cluster.namespace)),
        [api.get("Service", s["metadata"]["name"], cluster.namespace) for s in cluster.services],
    )


def expected(inputs: Inputs, cache: TopologyCache | None = None) -> dict[str, Observed]:
    """kubeproxy's controller on the same objects: each Service's first sync."""
    if cache is None:
        cache = TopologyCache()
        cache.set_nodes(inputs.nodes)
    nodes = {n["metadata"]["name"]: n for n in inputs.nodes}
    out = {}
    for service in inputs.services:
        pods = select_pods(service, inputs.pods) or []
        result = reconcile(service, pods, [], nodes, topology_cache=cache)
        out[service["metadata"]["name"]] = Observed(
            result.to_create + result.to_update,
            {_event_key(e["reason"], e["message"]) for e in result.events},
        )
    return out


def standalone_expected(inputs: Inputs) -> dict[str, Observed]:
    """The same objects as a manifest directory: what ``kubeproxy run --manifests``
    computes end to end (ClusterIPs of its own, the families the API server gave)."""
    return _standalone_slices(_standalone(inputs), inputs.services)


def _standalone(inputs: Inputs) -> StandaloneCluster:
    cluster = StandaloneCluster(rng=random.Random(0))
    events = []
    for obj in [*inputs.nodes, *inputs.pods, *inputs.services]:
        doc = obj
        if obj["kind"] == "Service":
            spec = {k: v for k, v in obj["spec"].items() if k not in ("clusterIP", "clusterIPs")}
            doc = {**obj, "spec": spec}
        events.append(Event.added(_raw(doc)))
    cluster.apply(events)
    return cluster


def _raw(doc: Obj) -> RawObject:
    meta = doc["metadata"]
    return RawObject(doc["kind"], NamespacedName(meta.get("namespace", ""), meta["name"]), doc)


def _standalone_slices(cluster: StandaloneCluster, services: list[Obj]) -> dict[str, Observed]:
    slices = [o for o in cluster.objects() if o["kind"] == "EndpointSlice"]
    return {
        name: Observed(
            [s for s in slices if s["metadata"]["labels"].get(SERVICE_NAME_LABEL) == name], None
        )
        for service in services
        for name in [service["metadata"]["name"]]
    }


# ---------------------------------------------------------------------------- compare


def endpoints_view(slices: Iterable[Obj]) -> dict[str, Any]:
    """What must be equal, by address type: ports, and each endpoint (by Pod name)."""
    view: dict[str, Any] = {}
    for s in slices:
        entry = view.setdefault(s["addressType"], {"ports": set(), "endpoints": {}})
        entry["ports"] |= {
            (p.get("name", ""), p.get("port"), p.get("protocol", "TCP"))
            for p in s.get("ports") or ()
        }
        for ep in s.get("endpoints") or ():
            c = ep.get("conditions") or {}
            entry["endpoints"][ep["targetRef"]["name"]] = (
                tuple(sorted(ep["addresses"])),
                bool(c.get("ready")),
                bool(c.get("serving")),
                bool(c.get("terminating")),
                ep.get("nodeName"),
                ep.get("zone"),
            )
    return view


def hints_view(slices: Iterable[Obj]) -> dict[str, dict[str, Any]]:
    """Each endpoint's hints by address type and Pod name (None: no hints)."""
    view: dict[str, dict[str, Any]] = {}
    for s in slices:
        for ep in s.get("endpoints") or ():
            hints = ep.get("hints")
            view.setdefault(s["addressType"], {})[ep["targetRef"]["name"]] = (
                None
                if hints is None
                else (
                    tuple(z["name"] for z in hints.get("forZones") or ()),
                    tuple(n["name"] for n in hints.get("forNodes") or ()),
                )
            )
    return view


@dataclass(frozen=True)
class AutoSummary:
    """What Auto hints come to for one address type, leaving out which endpoint moved."""

    hinted: tuple[tuple[str, int], ...]  # zone -> endpoints hinted for it
    given: tuple[tuple[str, int], ...]  # zone -> its endpoints hinted for another zone


def auto_summary(slices: Iterable[Obj]) -> AutoSummary | None:
    """None when no ready endpoint has hints; else the counts."""
    hinted: dict[str, int] = {}
    given: dict[str, int] = {}
    any_hint = False
    for s in slices:
        for ep in s.get("endpoints") or ():
            if not (ep.get("conditions") or {}).get("ready"):
                continue
            zones = [z["name"] for z in (ep.get("hints") or {}).get("forZones") or ()]
            for zone in zones:
                any_hint = True
                hinted[zone] = hinted.get(zone, 0) + 1
                if zone != ep.get("zone"):
                    given[ep.get("zone") or ""] = given.get(ep.get("zone") or "", 0) + 1
    if not any_hint:
        return None
    return AutoSummary(tuple(sorted(hinted.items())), tuple(sorted(given.items())))


def auto_outcomes(cache: TopologyCache, slices: Sequence[Obj]) -> set[AutoSummary]:
    """Every :class:`AutoSummary` kubeproxy's algorithm gives for these freshly created
    slices under some order of zones with equal amounts (upstream: Go map order)."""
    ready = [
        ep
        for s in slices
        for ep in s.get("endpoints") or ()
        if (ep.get("conditions") or {}).get("ready")
    ]
    allocations, _ = cache.get_allocations(len(ready))
    if allocations is None:
        return set()
    own: dict[str, int] = {}
    for ep in ready:
        own[ep.get("zone") or ""] = own.get(ep.get("zone") or "", 0) + 1
    results: set[AutoSummary] = set()
    pending: list[tuple[int, ...]] = [()]
    while pending:
        prefix = pending.pop()
        taken: list[int] = []

        def tie_break(
            zones: Sequence[str], prefix: tuple[int, ...] = prefix, taken: list[int] = taken
        ) -> str:
            if len(taken) < len(prefix):
                choice = prefix[len(taken)]
            else:
                choice = 0
                pending.extend((*taken, alt) for alt in range(1, len(zones)))
            taken.append(choice)
            return zones[choice]

        giving, receiving = giving_and_receiving_zones(allocations, own, tie_break)
        hinted = dict(own)
        for zone, n in giving.items():
            hinted[zone] -= n
        for zone, n in receiving.items():
            hinted[zone] = hinted.get(zone, 0) + n
        results.add(
            AutoSummary(
                tuple(sorted((z, n) for z, n in hinted.items() if n)),
                tuple(sorted(giving.items())),
            )
        )
    return results


def compare_service(
    service: Obj, real: Observed, ours: Observed, cache: TopologyCache
) -> list[str]:
    """The differences between the real controller's result and ours for one Service."""
    out: list[str] = []
    real_view, our_view = endpoints_view(real.slices), endpoints_view(ours.slices)
    if real_view != our_view:
        out.append(f"endpoints: real {real_view}, ours {our_view}")
    if ours.events is not None and real.events != ours.events:
        out.append(f"events: real {sorted(real.events or ())}, ours {sorted(ours.events)}")
    auto = hints_enabled(service["metadata"].get("annotations") or {})
    for address_type in sorted(set(real_view) | set(our_view)):
        real_slices = [s for s in real.slices if s["addressType"] == address_type]
        our_slices = [s for s in ours.slices if s["addressType"] == address_type]
        if not auto:
            real_hints = hints_view(real_slices).get(address_type, {})
            our_hints = hints_view(our_slices).get(address_type, {})
            if real_hints != our_hints:
                out.append(f"{address_type} hints: real {real_hints}, ours {our_hints}")
            continue
        real_summary, our_summary = auto_summary(real_slices), auto_summary(our_slices)
        if (real_summary is None) != (our_summary is None):
            out.append(f"{address_type} Auto hints: real {real_summary}, ours {our_summary}")
            continue
        if real_summary is None:
            continue
        possible = auto_outcomes(cache, our_slices)
        if our_summary not in possible:
            out.append(f"{address_type} ours {our_summary} is none of {possible}")
        if real_summary not in possible:
            out.append(f"{address_type} Auto hints: real {real_summary}, possible {possible}")
        if not _one_hint_each(real_slices):
            out.append(f"{address_type} real: not exactly one zone hint per ready endpoint")
    return out


def _one_hint_each(slices: Iterable[Obj]) -> bool:
    for s in slices:
        for ep in s.get("endpoints") or ():
            zones = (ep.get("hints") or {}).get("forZones") or ()
            ready = (ep.get("conditions") or {}).get("ready")
            if (len(zones) != 1) if ready else bool(zones):
                return False
    return True


# -------------------------------------------------------------------------------- run


@dataclass
class SeedResult:
    seed: int
    cluster: RandomCluster
    differences: dict[str, list[str]] = field(default_factory=dict)
    summary: list[str] = field(default_factory=list)
    #: Services where upstream broke a tie between zones otherwise than kubeproxy did.
    ties_broken_otherwise: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(self.differences.values())


def run_seed(api: Api, seed: int, *, namespace: str = "", timeout: float = 30.0) -> SeedResult:
    """One random cluster through the real controller and ours (the library's reconcile,
    and a whole standalone cluster); the differences, once there are none or when
    ``timeout`` has passed (the real controller works asynchronously)."""
    cluster = random_cluster(seed, namespace)
    result = SeedResult(seed, cluster)
    apply(api, cluster)
    try:
        inputs = read_inputs(api, cluster)
        cache = TopologyCache()
        cache.set_nodes(inputs.nodes)
        ours = expected(inputs, cache)
        standalone = standalone_expected(inputs)
        deadline = time.monotonic() + timeout
        while True:
            real = observe(api, cluster)
            result.differences = {
                name: compare_service(service, real[name], ours[name], cache)
                + [
                    f"standalone: {d}"
                    for d in compare_service(service, real[name], standalone[name], cache)
                ]
                for service in inputs.services
                for name in [service["metadata"]["name"]]
            }
            if result.ok or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        result.summary = [category(s, ours[s["metadata"]["name"]], cache) for s in inputs.services]
        for service in inputs.services:
            name = service["metadata"]["name"]
            for address_type in ("IPv4", "IPv6"):
                mine = [s for s in ours[name].slices if s["addressType"] == address_type]
                theirs = [s for s in real[name].slices if s["addressType"] == address_type]
                if auto_summary(mine) != auto_summary(theirs):
                    result.ties_broken_otherwise.append(f"{name} {address_type}")
    finally:
        remove(api, cluster)
    return result


def category(service: Obj, ours: Observed, cache: TopologyCache) -> str:
    """What kind of case a Service was, for a run's tally: its hint mode and outcome."""
    meta, spec = service["metadata"], service["spec"]
    families = "/".join(spec.get("ipFamilies") or ())
    if hints_enabled(meta.get("annotations") or {}):
        disabled = sorted(
            m.split(" (")[0].split(",")[0] for r, m in ours.events or () if r.endswith("Disabled")
        )
        summaries = [
            auto_summary([s for s in ours.slices if s["addressType"] == t])
            for t in ("IPv4", "IPv6")
        ]
        moved = sum(n for summary in summaries if summary for _, n in summary.given)
        ties = max(
            len(auto_outcomes(cache, [s for s in ours.slices if s["addressType"] == t]))
            for t in ("IPv4", "IPv6")
        )
        if any(summaries):
            outcome = "hinted" + (", endpoints moved between zones" if moved else "")
            outcome += f" (ties: {ties} possible outcomes)" if ties > 1 else ""
        else:
            outcome = "no hints: " + "; ".join(dict.fromkeys(disabled))
        return f"Auto {families}: {outcome}"
    if spec.get("trafficDistribution"):
        return f"{spec['trafficDistribution']} {families}"
    return f"no hints {families}"


def describe_cluster(cluster: RandomCluster) -> str:
    nodes = []
    for n in cluster.nodes:
        labels = n["metadata"]["labels"]
        ready = n["status"]["conditions"][0]["status"] == "True"
        role = " control-plane" if "node-role.kubernetes.io/control-plane" in labels else ""
        nodes.append(
            f"{n['metadata']['name']}({labels.get(ZONE_LABEL, 'no zone')}, "
            f"cpu {n['status']['allocatable']['cpu']}{'' if ready else ', not ready'}{role})"
        )
    return f"seed {cluster.seed}: {len(cluster.pods)} Pods; " + " ".join(nodes)


# ------------------------------------------------------------ a Node's CPU, changed


BEFORE_CPU_CHANGE = {"zone-a": 2, "zone-b": 2}
AFTER_CPU_CHANGE = {"zone-a": 3, "zone-b": 1}  # 12 and 4 CPUs: desired 3 and 1


@dataclass
class CpuChange:
    """Auto hints of one Service (zone -> endpoints hinted) at each stage."""

    real_before: dict[str, int]
    real_after_cpu: dict[str, int]  # after a Service change made the controller resync
    real_after_node_event: dict[str, int]  # after a Node was added
    ours_after_cpu: dict[str, int]  # a standalone cluster given the same Node change


def node_cpu_change(api: Api, namespace: str = "cpu-change") -> CpuChange:
    """Two zones of 4 CPUs, 2 ready endpoints in each; then zone-a's Node grows to 12
    CPUs, which makes 3 + 1 the right split. Upstream's TopologyCache re-reads the Nodes
    only when one is added or deleted or changes readiness or zone (the controller's
    updateNode), so its hints follow only then; a standalone cluster recomputes on any
    Node change."""
    nodes = [
        _node(f"cpu-{z}", {ZONE_LABEL: f"zone-{z}", NODE_MARK: "true"}, "4", True) for z in "ab"
    ]
    pods = [
        _pod(
            f"p{i}",
            namespace,
            f"cpu-{z}",
            {APP: "web"},
            [f"10.250.0.{i + 10}"],
            ready=True,
            terminating=False,
        )
        for i, z in enumerate("aabb")
    ]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": namespace,
            "annotations": {"service.kubernetes.io/topology-mode": "Auto"},
        },
        "spec": {"selector": {APP: "web"}, "ports": [{"name": "http", "port": 80}]},
    }
    cluster = RandomCluster(0, namespace, nodes, pods, [service])
    apply(api, cluster)
    try:
        before = _wait_hints(api, namespace, lambda h: h == BEFORE_CPU_CHANGE)
        inputs = read_inputs(api, cluster)
        ours = _standalone(inputs)
        old_node = next(n for n in inputs.nodes if n["metadata"]["name"] == "cpu-a")
        bigger = {"allocatable": {"cpu": "12"}, "capacity": {"cpu": "12"}}
        new_node = api.patch_status("Node", "cpu-a", {"status": bigger})
        ours.apply([Event.modified(_raw(old_node), _raw({"kind": "Node", **new_node}))])
        ours_after = _zone_counts(_standalone_slices(ours, [service])["web"].slices)
        # A label on the Service is copied to its slices: once it is there, the
        # controller has resynced the Service (and recomputed its hints).
        api.patch("Service", "web", {"metadata": {"labels": {"resynced": "1"}}}, namespace)
        after_cpu = _wait_hints(api, namespace, lambda h: True, label="resynced")
        # A Node added (not Ready: it counts for nothing) makes the cache read the Nodes.
        meta = {"name": "cpu-c", "labels": {NODE_MARK: "true"}}
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": meta})
        after_event = _wait_hints(api, namespace, lambda h: h == AFTER_CPU_CHANGE)
        return CpuChange(before, after_cpu, after_event, ours_after)
    finally:
        remove(api, cluster)
        clear_nodes(api)


def _zone_counts(slices: Iterable[Obj]) -> dict[str, int]:
    summary = auto_summary(slices)
    return dict(summary.hinted) if summary else {}


def _wait_hints(
    api: Api, namespace: str, want: Callable[[dict[str, int]], bool], *, label: str = ""
) -> dict[str, int]:
    def hints() -> dict[str, int] | None:
        slices = api.list_of("EndpointSlice", namespace)
        if label and not all(label in s["metadata"].get("labels", {}) for s in slices):
            return None
        counts = _zone_counts(slices)
        return counts if slices and want(counts) else None

    found: dict[str, int] = wait_for(hints, timeout=30, what="the real controller's hints")
    return found
