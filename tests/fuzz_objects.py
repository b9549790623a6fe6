"""Hostile input for the fuzzing properties (issue 12 part 1): strategies and checks.

Map of the module:

* :func:`good_cluster` — a small valid cluster as v1 dicts (Services of every type and
  both families, their EndpointSlices, this node's Node, a ServiceCIDR), named ``good-*``.
* :func:`mutated` — a copy of one of those objects renamed ``bad-*`` (so it never shares
  a key with a good one) and then mutated 1-3 times: any field replaced by a wrong type,
  a huge or negative number, a hostile string, name or address, deleted, an unknown
  field added, or a list item duplicated (duplicate ports).
* :func:`config_document` — a mutated KubeProxyConfiguration document.
* :func:`check_parse`, :func:`check_mixed`, :func:`check_config` — the properties, as
  plain functions of drawn data, so ``tests/unit/test_fuzz.py`` runs them a few hundred
  times in CI and ``python -m bench.fuzz`` ten thousand times; each returns counts of
  what it tried. :func:`mixed_snapshot` builds the state the kernel checks render.

Objects go through the real manifest source (one JSON file each), so the log lines and
the skipping are the ones an operator sees.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from kubeproxy import cli
from kubeproxy.backends.iptables.proxier import IptablesBackend
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.codec import to_dict
from kubeproxy.config.defaults import default_config
from kubeproxy.config.runtime import ConfigError, ProxyConfig
from kubeproxy.config.types import API_VERSION, KIND
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.nftables.runner import NftCommand
from kubeproxy.model.events import dispatch
from kubeproxy.model.nodeports import NodePortAddresses
from kubeproxy.model.parse import (
    InvalidObjectError,
    parse_endpoint_slice,
    parse_node,
    parse_service,
    parse_service_cidr,
)
from kubeproxy.model.plan import DetectLocal, LocalMode
from kubeproxy.model.state import ProxyState, Snapshot
from kubeproxy.model.types import IPFamily, NamespacedName
from kubeproxy.sources.kube_decode import object_decoder
from kubeproxy.sources.manifests import ManifestSource
from kubeproxy.sources.standalone import StandaloneSource
from tests.conftest import NO_PROC, relies_on_exception

Doc = dict[str, Any]
NODE = "node-a"
KINDS = ("Service", "EndpointSlice", "Node", "ServiceCIDR")
PARSERS: dict[str, Callable[[Any], object]] = {
    "Service": parse_service,
    "EndpointSlice": parse_endpoint_slice,
    "Node": parse_node,
    "ServiceCIDR": parse_service_cidr,
}

# ------------------------------------------------------------------ hostile values

HOSTILE_TEXT = [
    "",
    " ",
    '"',
    "'",
    ";",
    "a;b",
    'x" ; drop',
    "x\ny",
    "x\r",
    "}",
    "{",
    "a b",
    "\\",
    "$(reboot)",
    "`id`",
    "#",
    "-j ACCEPT",
    "é",
    "名前",
    "\u202e",
    "\x00",
    "\x1b[2J",
    "a" * 63,
    "a" * 64,
    "a" * 253,
    "a" * 254,
    "a/b",
    "../x",
    "-a",
    "A",
    "a.",
    "web\n",
]
HOSTILE_IPS = [
    "::ffff:10.96.0.1",
    "::ffff:a60:1",
    "::ffff:192.168.50.1",
    "fe80::1%eth0",
    "fe80::1%25eth0",
    "10.96.0.1%0",
    " 10.96.0.7 ",
    "10.96.0.7\n",
    "010.096.000.001",
    "10.96.0.1/32",
    "2001:db8::/64",
    "1.2.3.4.5",
    "::",
    "0.0.0.0",
    "255.255.255.255",
    "127.0.0.1",
    "::1",
    "224.0.0.1",
    "ff02::1",
    "169.254.169.254",
    "fe80::1",
    "0:0:0:0:0:0:0:1",
    "FD00:10:96::1",
    "2001:db8::1",
    "10.244.9.9",
    "fd00:10:244::99",
]
HOSTILE_NUMBERS: list[Any] = [
    -1,
    0,
    1,
    65535,
    65536,
    30000,
    86400,
    86401,
    2**31,
    -(2**31),
    2**63,
    2**64,
    10**100,
    1.5,
    -0.0,
    float("nan"),
    float("inf"),
    True,
    False,
]


def hostile_value() -> st.SearchStrategy[Any]:
    scalars = st.one_of(
        st.sampled_from(HOSTILE_TEXT),
        st.sampled_from(HOSTILE_IPS),
        st.sampled_from(HOSTILE_NUMBERS),
        st.integers(),
        st.text(max_size=12),
        st.none(),
    )
    return st.one_of(
        scalars,
        st.lists(scalars, max_size=3),
        st.dictionaries(st.sampled_from(["name", "ip", "port", "x"]), scalars, max_size=2),
    )


# -------------------------------------------------------------------- good cluster


@st.composite
def good_cluster(draw: st.DrawFn) -> list[Doc]:
    """A small valid cluster: ``good-*`` Services with slices, our Node, a ServiceCIDR."""
    docs: list[Doc] = []
    for i in range(draw(st.integers(1, 4))):
        families = draw(st.sampled_from([("IPv4",), ("IPv6",), ("IPv4", "IPv6"), ("IPv6", "IPv4")]))
        host = draw(st.integers(1, 250))
        ips = [
            f"10.96.{i}.{host}" if f == "IPv4" else f"fd00:10:96::{i}:{host:x}" for f in families
        ]
        svc_type = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
        name = f"good-{i}"
        ports = []
        for j in range(draw(st.integers(1, 3))):
            port: Doc = {
                "name": f"p{j}",
                "port": draw(st.integers(1, 65535)) if j == 0 else 1000 + j,
                "protocol": draw(st.sampled_from(["TCP", "UDP", "SCTP"])),
                "targetPort": 8080,
            }
            if svc_type != "ClusterIP":
                port["nodePort"] = 30000 + 10 * i + j
            ports.append(port)
        spec: Doc = {
            "type": svc_type,
            "clusterIP": ips[0],
            "clusterIPs": ips,
            "ipFamilies": list(families),
            "ports": ports,
            "externalTrafficPolicy": draw(st.sampled_from(["Cluster", "Local"])),
            "internalTrafficPolicy": draw(st.sampled_from(["Cluster", "Local"])),
        }
        if draw(st.booleans()):
            spec["externalIPs"] = [f"203.0.113.{i + 1}"]
        if draw(st.booleans()):
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 600}}
        if svc_type == "LoadBalancer" and draw(st.booleans()):
            spec["loadBalancerSourceRanges"] = ["192.0.2.0/24"]
        svc: Doc = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": "good"},
            "spec": spec,
        }
        if svc_type == "LoadBalancer":
            svc["status"] = {"loadBalancer": {"ingress": [{"ip": f"198.51.100.{i + 1}"}]}}
        docs.append(svc)
        for family in families:
            endpoints = [
                {
                    "addresses": [
                        f"10.244.{i}.{k + 1}" if family == "IPv4" else f"fd00:10:244:{i}::{k + 1}"
                    ],
                    "conditions": {
                        "ready": draw(st.booleans()),
                        "serving": True,
                        "terminating": False,
                    },
                    "nodeName": draw(st.sampled_from([NODE, "node-b"])),
                    "zone": "zone-a",
                }
                for k in range(draw(st.integers(0, 4)))
            ]
            docs.append(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {
                        "name": f"{name}-{family.lower()}",
                        "namespace": "good",
                        "labels": {"kubernetes.io/service-name": name},
                    },
                    "addressType": family,
                    "ports": [
                        {"name": p["name"], "port": 8080, "protocol": p["protocol"]} for p in ports
                    ],
                    "endpoints": endpoints,
                }
            )
    docs.append(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "spec": {"podCIDRs": ["10.244.0.0/24", "fd00:10:244::/64"]},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "192.168.50.1"},
                    {"type": "InternalIP", "address": "fd00:50::1"},
                ]
            },
        }
    )
    docs.append(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "ServiceCIDR",
            "metadata": {"name": "good-cidr"},
            "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/108"]},
        }
    )
    return docs


# -------------------------------------------------------------------------- mutation

Path_ = tuple[str | int, ...]


def _paths(obj: Any, prefix: Path_ = ()) -> Iterator[Path_]:
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            yield (*prefix, index)
            yield from _paths(value, (*prefix, index))


def _parent(doc: Doc, path: Path_) -> Any:
    node: Any = doc
    for step in path[:-1]:
        node = node[step]
    return node


def _renamed(doc: Doc, index: int, namespace: str = "fuzz") -> Doc:
    """A copy named ``bad-<index>`` in ``namespace`` (never a good object's key)."""
    out = copy.deepcopy(doc)
    meta = out["metadata"]
    meta["name"] = f"bad-{index}"
    if "namespace" in meta:
        meta["namespace"] = namespace
    return out


@st.composite
def mutated(
    draw: st.DrawFn, docs: list[Doc], index: int, *, rename: bool = True, namespace: str = "fuzz"
) -> Doc:
    """A copy of one of ``docs`` (renamed into ``namespace``, unless ``rename`` is false)
    with 1-3 hostile mutations."""
    doc = draw(st.sampled_from(docs))
    doc = _renamed(doc, index, namespace) if rename else copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["replace", "replace", "delete", "unknown", "dup", "name", "ip"]))
        paths = [p for p in _paths(doc) if p != ("kind",)]
        if op == "name":
            field = draw(st.sampled_from(["name", "namespace"]))
            doc.setdefault("metadata", {})
            if isinstance(doc["metadata"], dict):
                doc["metadata"][field] = draw(st.sampled_from(HOSTILE_TEXT) | st.text(max_size=8))
            continue
        if op == "ip":
            ip_paths = [
                p
                for p in paths
                if any(k in str(p) for k in ("IP", "address", "ip", "cidr", "CIDR"))
                and isinstance(_parent(doc, p)[p[-1]], str)
            ]
            if ip_paths:
                path = draw(st.sampled_from(ip_paths))
                _parent(doc, path)[path[-1]] = draw(st.sampled_from(HOSTILE_IPS))
            continue
        if not paths:
            continue
        path = draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        if op == "replace":
            parent[path[-1]] = draw(hostile_value())
        elif op == "delete":
            del parent[path[-1]]
        elif op == "unknown":
            target = parent[path[-1]]
            if isinstance(target, dict):
                target[draw(st.sampled_from(["x-unknown", "Name", "PORT"]))] = draw(hostile_value())
        elif isinstance(parent, list) and isinstance(at := path[-1], int):
            parent.insert(at, copy.deepcopy(parent[at]))  # "dup": e.g. duplicate ports
    return doc


@st.composite
def one_mutated(draw: st.DrawFn) -> Doc:
    return draw(mutated(draw(good_cluster()), 0))


@st.composite
def mixed_objects(draw: st.DrawFn) -> tuple[list[Doc], list[Doc]]:
    """(good objects, mutated copies of them). Sometimes this node's own Node is only
    among the mutated ones (so its hostile addresses and pod CIDRs are used)."""
    good = draw(good_cluster())
    bad = [draw(mutated(good, i)) for i in range(draw(st.integers(1, 6)))]
    if draw(st.booleans()):
        node = next(d for d in good if d["kind"] == "Node")
        good.remove(node)
        bad.append(draw(mutated([node], 0, rename=False)))
    return good, bad


@st.composite
def standalone_objects(draw: st.DrawFn) -> list[Doc]:
    """A manifest directory for the standalone control plane: Services without a
    ClusterIP selecting Pods, our Node, and mutated copies of each in the same namespace
    (so hostile Pods are selected and hostile Services allocate)."""
    good: list[Doc] = []
    for i in range(draw(st.integers(1, 3))):
        app = f"good-{i}"
        spec: Doc = {
            "type": draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"])),
            "selector": {"app": app},
            "ipFamilyPolicy": draw(st.sampled_from(["SingleStack", "PreferDualStack"])),
            "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}],
        }
        good.append(
            {"kind": "Service", "metadata": {"name": app, "namespace": "good"}, "spec": spec}
        )
        for k in range(draw(st.integers(0, 3))):
            ips = [f"10.244.{i}.{k + 1}", f"fd00:10:244:{i}::{k + 1}"]
            good.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{app}-{k}", "namespace": "good", "labels": {"app": app}},
                    "spec": {
                        "nodeName": draw(st.sampled_from([NODE, "node-b"])),
                        "containers": [
                            {"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}
                        ],
                    },
                    "status": {
                        "phase": "Running",
                        "podIP": ips[0],
                        "podIPs": [{"ip": ip} for ip in ips],
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                }
            )
    good.append(
        {
            "kind": "Node",
            "metadata": {"name": NODE, "labels": {"topology.kubernetes.io/zone": "zone-a"}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "192.168.50.1"}],
                "allocatable": {"cpu": "2"},
            },
        }
    )
    good.append(
        {
            "kind": "ServiceCIDR",
            "metadata": {"name": "good-cidr"},
            "spec": {"cidrs": ["10.96.0.0/24", "fd00:10:96::/120"]},
        }
    )
    bad = [draw(mutated(good, i, namespace="good")) for i in range(draw(st.integers(1, 5)))]
    return good + bad


# --------------------------------------------------------------------------- checks


def roundtrip(doc: Any) -> Any:
    """What the manifest source reads back from the JSON file we write."""
    return json.loads(json.dumps(doc))


def is_rejected(doc: Doc) -> bool:
    """True if the manifest source must log and skip this (round-tripped) document."""
    kind = doc.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        return False  # not ours: ignored silently, as kubectl would not know it either
    try:
        PARSERS[kind](doc)
    except InvalidObjectError:
        return True
    return False


def _parsed(parser: Callable[[Any], object], doc: Any) -> object:
    """The model, or the one-line message of the InvalidObjectError (nothing else may
    escape)."""
    try:
        return parser(doc)
    except InvalidObjectError as err:
        message = str(err)
        assert message.isprintable(), repr(message)
        return message


@relies_on_exception("the parser raising anything but InvalidObjectError fails the caller")
def check_parse(doc: Doc) -> str:
    """Parsing never raises anything but InvalidObjectError, whose message is one line;
    the API source (msgspec decoding the JSON as the API server would send it, then the
    same parser) reaches the very same model or error as the manifest source."""
    kind = doc.get("kind")
    kind = kind if isinstance(kind, str) and kind in PARSERS else "Service"
    parser = PARSERS[kind]
    result = _parsed(parser, doc)
    try:
        raw = json.dumps(doc, allow_nan=False).encode()
    except ValueError:
        return "no-api-json"  # NaN/Infinity: not JSON, no API server sends it
    via_api = _parsed(parser, object_decoder(kind)(raw).obj)
    assert via_api == result, (via_api, result)
    return "rejected" if isinstance(result, str) else "accepted"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append((record.levelno, record.getMessage()))


def _through(
    docs: list[Doc], source: Callable[[Path], ManifestSource | StandaloneSource], logger: str
) -> tuple[Snapshot, list[tuple[int, str]]]:
    """The snapshot ``source`` (reading ``docs``, one JSON file each) and the proxy state
    make, and what ``logger`` logged meanwhile."""
    records = _Records()
    watched = logging.getLogger(logger)
    watched.addHandler(records)
    try:
        with tempfile.TemporaryDirectory(prefix="kpfuzz") as tmp:
            for i, doc in enumerate(docs):
                Path(tmp, f"{i:04d}.json").write_text(json.dumps(doc), encoding="utf-8")
            state = ProxyState(NODE)
            dispatch(state, source(Path(tmp)).reload())
    finally:
        watched.removeHandler(records)
    snapshot, _ = state.collect()
    return snapshot, records.messages


def load(docs: list[Doc]) -> tuple[Snapshot, list[tuple[int, str]]]:
    """What the manifest source makes of ``docs``, and what it logged."""
    return _through(docs, ManifestSource, "kubeproxy.sources.manifests")


CONFIG = ProxyConfig(
    hostname=NODE,
    families=(IPFamily.IPv4, IPFamily.IPv6),
    cluster_cidrs=("10.244.0.0/16", "fd00:10:244::/56"),
)


# The other way to recognise local traffic and to pick NodePort addresses, and
# masquerading everything: the Node's (fuzzed) pod CIDRs and addresses reach the rules.
NODE_CIDR_CONFIG = ProxyConfig(
    hostname=NODE,
    families=(IPFamily.IPv4, IPFamily.IPv6),
    detect_local=DetectLocal(LocalMode.NODE_CIDR),
    masquerade_all=True,
    nodeport_addresses=NodePortAddresses.parse(["primary"]),
)


def renders(snapshot: Snapshot) -> dict[str, str]:
    """The full-sync script of each backend (iptables rendered without touching a
    kernel) under :data:`CONFIG` and, suffixed ``-nodecidr``, :data:`NODE_CIDR_CONFIG`."""
    out = {}
    for suffix, config in (("", CONFIG), ("-nodecidr", NODE_CIDR_CONFIG)):
        fakes = {f: FakeIptables(f, "nft") for f in config.families}
        ipt = IptablesBackend(config, fakes, proc=NO_PROC)
        out["nftables" + suffix] = NftablesBackend(config, NftCommand()).render(snapshot)
        out["iptables" + suffix] = ipt.render(snapshot)
    return out


def _identity(doc: Doc) -> str | None:
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def check_mixed(good: list[Doc], bad: list[Doc]) -> Counter[str]:
    """Bad objects cost one log line each and only themselves.

    * loading good and mutated objects together never raises;
    * each rejected object gets exactly one ERROR line naming its kind (and its name,
      escaped), every line printable (no forged lines);
    * every good ServicePort is in the snapshot;
    * the nftables and iptables renders are byte-identical to those of the same input
      without the rejected objects (exact: a rejected object has no effect at all), and
      hold only printable ASCII (no object string reaches a script unescaped).
    """
    bad = [roundtrip(d) for d in bad]
    rejected = [d for d in bad if is_rejected(d)]
    accepted = [d for d in bad if not is_rejected(d)]
    snapshot, messages = load(good + bad)

    lines = [m for level, m in messages if level >= logging.ERROR]
    assert all(m.isprintable() for m in lines), lines
    skipped = [m for m in lines if m.startswith("Skipping invalid ")]
    assert len(skipped) == len(rejected), (skipped, rejected)
    for doc in rejected:
        name = _identity(doc)
        prefix = f"Skipping invalid {doc['kind']} "
        mine = [m for m in skipped if m.startswith(prefix)]
        assert mine, (doc, skipped)
        if name is not None and len(name) < 100:
            # Escaped (with its namespace) when either is not printable.
            shown = (name, name.encode("unicode_escape").decode("ascii"))
            assert any(n in m for m in mine for n in shown), (name, mine)

    good_ports = {
        NamespacedName(d["metadata"]["namespace"], d["metadata"]["name"])
        for d in good
        if d["kind"] == "Service"
    }
    present = {p.service for p in snapshot.services}
    assert good_ports <= present, good_ports - present

    with_bad = renders(snapshot)
    without, _ = load(good + accepted)
    assert with_bad == renders(without)
    for script in with_bad.values():
        assert script.isascii(), script
        assert all(line.replace("\t", " ").isprintable() for line in script.splitlines())
    return Counter(objects=len(good) + len(bad), rejected=len(rejected), accepted=len(accepted))


def check_standalone(docs: list[Doc]) -> Counter[str]:
    """The standalone control plane (Pods selected, ClusterIPs and NodePorts allocated)
    never raises on hostile objects; its log lines are printable; what it hands the
    proxy renders."""
    snapshot, messages = _through(
        docs, lambda path: StandaloneSource(path, persist=False), "kubeproxy"
    )
    renders(snapshot)
    lines = [m for level, m in messages if level >= logging.WARNING]
    assert all(m.isprintable() for m in lines), lines
    return Counter(objects=len(docs), service_ports=len(snapshot.services), logged=len(lines))


def mixed_snapshot(good: list[Doc], bad: list[Doc]) -> Snapshot:
    """The state of good and mutated objects together (what the kernel checks render)."""
    snapshot, _ = load([*good, *(roundtrip(d) for d in bad)])
    return snapshot


def big_objects(ports: int = 1000, endpoints: int = 10_000) -> list[Doc]:
    """The sizes upstream's API allows at most: a Service with ``ports`` ports (its slice
    too) and one slice of ``endpoints`` endpoints (the API caps a slice at 1,000; a
    manifest directory has no such cap)."""
    wide: Doc = {
        "kind": "Service",
        "metadata": {"name": "wide", "namespace": "big"},
        "spec": {
            "type": "NodePort",
            "clusterIPs": ["10.96.200.1", "fd00:10:96::c8:1"],
            "ports": [
                {"name": f"p{j}", "port": j + 1, "protocol": "TCP", "nodePort": 30000 + j}
                for j in range(ports)
            ],
        },
    }
    deep: Doc = {
        "kind": "Service",
        "metadata": {"name": "deep", "namespace": "big"},
        "spec": {"clusterIP": "10.96.201.1", "ports": [{"port": 80}]},
    }

    def slice_of(service: str, addresses: list[str], port_names: list[str]) -> Doc:
        return {
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{service}-1",
                "namespace": "big",
                "labels": {"kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "ports": [{"name": n, "port": 8080} for n in port_names],
            "endpoints": [{"addresses": [a], "nodeName": NODE} for a in addresses],
        }

    deep_ips = [f"10.{100 + k // 65536}.{k // 256 % 256}.{k % 256}" for k in range(endpoints)]
    return [
        wide,
        slice_of("wide", ["10.244.200.1", "10.244.200.2"], [f"p{j}" for j in range(ports)]),
        deep,
        slice_of("deep", deep_ips, [""]),
    ]


_IPTABLES_PART = re.compile(r"^# (ip6?tables)-restore --noflush \((IPv[46])\)$", re.MULTILINE)


def kernel_refusals(netns: str, scripts: dict[str, str]) -> list[str]:
    """What the kernel says to ``renders()`` inside the scratch namespace ``netns``;
    empty if every script is accepted.

    nftables: ``nft -c -f`` (the kernel checks the whole batch, then aborts it).
    iptables, per family: ``iptables-legacy-restore --test`` (parses and loads every
    match and target, commits nothing), and ``iptables-nft-restore`` committed for real,
    replacing the tables it names, because its ``--test`` only parses: it accepts a jump
    to a chain that does not exist (measured on 1.8.9)."""
    checks: list[tuple[list[str], str]] = []
    for name, script in scripts.items():
        if name.startswith("nftables"):
            checks.append((["nft", "-c", "-f", "-"], script))
            continue
        parts = _IPTABLES_PART.split(script)
        # split() gives [before, tool, family, body, tool, family, body, ...]
        for at in range(1, len(parts), 3):
            tool, body = parts[at], parts[at + 2]
            checks.append(([f"{tool}-legacy-restore", "--test"], body))
            checks.append(([f"{tool}-nft-restore"], body))
    refusals = []
    for command, script in checks:
        done = subprocess.run(
            ["ip", "netns", "exec", netns, *command],
            input=script,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            refusals.append(f"{' '.join(command)}: {done.stderr.strip()[:2000]}")
    return refusals


# --------------------------------------------------------------------------- config


def _valid_config() -> Doc:
    doc = to_dict(default_config())
    doc.update(apiVersion=API_VERSION, kind=KIND)
    doc.update(clusterCIDR="10.244.0.0/16", hostnameOverride=NODE)
    return doc


CONFIG_HOSTILE = st.one_of(
    hostile_value(),
    st.sampled_from(["1s", "-1s", "0s", "9999999999h", "1x", "", "10.0.0.0/8", "::/0", "300ms"]),
)


@st.composite
def config_document(draw: st.DrawFn) -> str:
    """A KubeProxyConfiguration document (JSON or YAML text) with 1-4 mutations."""
    doc = _valid_config()
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        op = draw(st.sampled_from(["replace", "replace", "delete", "unknown"]))
        if op == "replace":
            parent[path[-1]] = draw(CONFIG_HOSTILE)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["udpIdleTimeout", "x", "Mode"]))] = draw(CONFIG_HOSTILE)
    return json.dumps(doc) if draw(st.booleans()) else yaml.safe_dump(doc)


@relies_on_exception("loading raising anything but ConfigError fails the caller")
def check_config(text: str) -> str:
    """A config file only ever fails with the CLI's ConfigError (every problem listed);
    when it loads, building the proxy's settings from it fails only that way too."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        args = cli.build_parser().parse_args(["run", "--config", file.name])
        quiet = logging.getLogger("kubeproxy")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)  # lenient decoding warns on every unknown field
        try:
            cfg = cli.load_configuration(args)
            cli.proxy_config(cfg, args)
        except ConfigError as err:
            assert str(err).strip(), "an error must say what is wrong"
            return "rejected"
        finally:
            quiet.setLevel(level)
    return "accepted"
