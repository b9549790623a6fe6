"""A strict in-memory HNS, and the ``--hns-state`` file that seeds it.

Nothing here has run on Windows, and no Windows HNS was at hand to check the fake
against: what it refuses is taken from HNS's documented error codes, from errors HNS is
seen answering in upstream kube-proxy's issues, and from hnslib's feature checks. Where
the fake is stricter than HNS is known to be, the refusal says ``fake:`` and
:data:`STRICTER` lists it.

:class:`FakeHns` implements :class:`~kubeproxy.dataplane.hns.client.Hns` over one network
and refuses, with the :class:`HnsError` kind (and HRESULT) HNS answers:

* a load balancer whose frontend VIP, protocol and external port are another's
  (ALREADY_EXISTS, ``0x800700b7``: "Cannot create a file when that file already
  exists", as kubernetes#139519 shows HNS answering a duplicate); the NodePort load
  balancer, which has no VIP, is likewise one per protocol and port;
* a load balancer naming an endpoint ID that does not exist (INVALID,
  HCN_E_INVALID_JSON_REFERENCE, as in kubernetes#100384) or with internal port 0
  (INVALID, HCN_E_INVALID_INTERNAL_PORT);
* the DSR flag unless DSR is supported, the IPv6 flag unless IPv6DualStack is, a
  distribution other than None unless SessionAffinity is, and any modify unless
  ModifyLoadbalancer is (NOT_SUPPORTED, no HRESULT: a client checks SupportedFeatures
  first, as upstream's proxier does);
* deleting or modifying an ID that is not there (NOT_FOUND), creating an endpoint on
  another network (NOT_FOUND, HCN_E_NETWORK_NOT_FOUND), and deleting an endpoint a load
  balancer still uses (HCN_E_ENTITY_HAS_REFERENCES).

Remote endpoints shared between Services: upstream kube-proxy counts references itself.
With ``track_refs=True`` the fake counts them too: creating a remote endpoint whose IP a
remote endpoint already has returns that one and adds a reference; deleting it drops one
and removes it at zero. Without it, a second endpoint with the same IP is refused.

Tests drive failures with :meth:`FakeHns.fail_next` (the next N calls of one operation
raise), read :attr:`FakeHns.log` (every call and its outcome), and compare
:meth:`FakeHns.state` (sorted, JSON-ready) with golden files. IDs are uuid4, or drawn
from ``random.Random(seed)`` when a seed is given, so that goldens can hold them.

:func:`load_state` reads the ``--hns-state`` file (issue 26)::

    {"network": {"name", "id", "type": "Overlay"|"L2Bridge", "managementIP",
                 "remoteSubnets": [{"destinationPrefix", "providerAddress",
                                    "isolationId", "drMacAddress"}]},
     "endpoints": [{"id", "ipAddress", "macAddress", "isLocal"}],
     "supportedFeatures": {"DSR", "ModifyLoadbalancer", "IPv6DualStack"}}

(``supportedFeatures`` may also say ``SessionAffinity``, true unless given; every
field but the network's name, id and type and each endpoint's id, ipAddress and isLocal
may be left out) and raises :class:`StateFileError` naming the field (``network.remoteSubnets[0].
providerAddress: ...``). The state file's local endpoints are the pods' (created by the
CNI): the fake refuses to delete them (``fake:``; HNS would let it happen).
"""

from __future__ import annotations

import enum
import json
import random
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubeproxy.dataplane.hns.client import (
    HCN_E_ENDPOINT_NOT_FOUND,
    HCN_E_ENTITY_HAS_REFERENCES,
    HCN_E_INVALID_INTERNAL_PORT,
    HCN_E_INVALID_JSON_REFERENCE,
    HCN_E_NETWORK_NOT_FOUND,
    HRESULT_ERROR_ALREADY_EXISTS,
    HRESULT_ERROR_NOT_FOUND,
    HnsError,
    HnsErrorKind,
)
from kubeproxy.dataplane.hns.schema import (
    Distribution,
    Endpoint,
    LoadBalancer,
    LoadBalancerFlags,
    Network,
    NetworkType,
    RemoteSubnet,
    SchemaError,
    SupportedFeatures,
    check_ip,
    check_mac,
    check_prefix,
    is_ipv6,
)

OPERATIONS = (
    "get_network_by_name",
    "list_endpoints",
    "get_endpoint_by_ip",
    "create_endpoint",
    "delete_endpoint",
    "list_load_balancers",
    "create_load_balancer",
    "modify_load_balancer",
    "delete_load_balancer",
    "supported_features",
)

# Refusals of the fake that HNS is not known to make (each message starts "fake:").
STRICTER = (
    "a load balancer whose frontend VIP, source VIP or endpoints mix IPv4 and IPv6, or "
    "whose family disagrees with its IPv6 flag",
    "a load balancer listing one endpoint twice",
    "a second endpoint with an IP an endpoint of the network has (without track_refs)",
    "deleting a local (pod) endpoint of the state file",
)

_PROTOCOL_NAMES = {6: "TCP", 17: "UDP", 132: "SCTP"}


@dataclass(frozen=True, slots=True)
class Call:
    """One call the fake answered: the operation, its arguments in brief, the outcome
    (``ok`` or the error kind)."""

    operation: str
    detail: str
    outcome: str


class FakeHns:
    """An HNS with one network; see the module docstring for what it refuses."""

    def __init__(
        self,
        network: Network,
        *,
        endpoints: Iterable[Endpoint] = (),
        features: SupportedFeatures | None = None,
        seed: int | None = None,
        track_refs: bool = False,
    ) -> None:
        self.network = network
        self.features = features if features is not None else SupportedFeatures()
        self.track_refs = track_refs
        self.log: list[Call] = []
        self._rng = random.Random(seed) if seed is not None else None
        self._endpoints: dict[str, Endpoint] = {}
        self._pods: set[str] = set()  # IDs of local endpoints seeded from the state
        self._refs: dict[str, int] = {}
        self._lbs: dict[str, LoadBalancer] = {}
        self._failures: dict[str, list[HnsError | None]] = {}
        for ep in endpoints:
            ep_id = ep.id or self._new_id()
            if ep_id in self._endpoints:
                raise ValueError(f"endpoint ID {ep_id} given twice")
            self._endpoints[ep_id] = ep.with_identity(ep_id, network.id)
            if not ep.is_remote:
                self._pods.add(ep_id)
            else:
                self._refs[ep_id] = 1

    # --- test controls -----------------------------------------------------------------

    def fail_next(self, operation: str, count: int = 1, error: HnsError | None = None) -> None:
        """The next ``count`` calls of ``operation`` raise ``error`` (or a FAILED HnsError)
        without changing anything."""
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r} (one of {', '.join(OPERATIONS)})")
        self._failures.setdefault(operation, []).extend([error] * count)

    def calls(self, operation: str) -> list[Call]:
        return [c for c in self.log if c.operation == operation]

    def ref_count(self, endpoint_id: str) -> int:
        return self._refs.get(endpoint_id, 0)

    @contextmanager
    def _op(self, operation: str, detail: str) -> Iterator[None]:
        pending = self._failures.get(operation)
        if pending:
            error = pending.pop(0) or HnsError(
                "injected failure", kind=HnsErrorKind.FAILED, operation=operation
            )
            self.log.append(Call(operation, detail, f"injected {error.kind.value}"))
            raise error
        try:
            yield
        except HnsError as err:
            self.log.append(Call(operation, detail, err.kind.value))
            raise
        self.log.append(Call(operation, detail, "ok"))

    def _new_id(self) -> str:
        if self._rng is None:
            return str(uuid.uuid4())
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    # --- the network and endpoints -----------------------------------------------------

    def get_network_by_name(self, name: str) -> Network:
        with self._op("get_network_by_name", name):
            if name != self.network.name:
                raise _error(HnsErrorKind.NOT_FOUND, "get_network_by_name", f"network {name!r}")
            return self.network

    def list_endpoints(self, network_id: str | None = None) -> list[Endpoint]:
        with self._op("list_endpoints", network_id or "*"):
            return [
                ep
                for ep in self._endpoints.values()
                if network_id is None or ep.network_id.lower() == network_id.lower()
            ]

    def get_endpoint_by_ip(self, ip: str, network_id: str) -> Endpoint:
        with self._op("get_endpoint_by_ip", f"{ip} {network_id}"):
            found = self._by_ip(ip, network_id)
            if found is None:
                raise _error(
                    HnsErrorKind.NOT_FOUND,
                    "get_endpoint_by_ip",
                    f"no endpoint with IP {ip} on network {network_id}",
                )
            return found

    def _by_ip(self, ip: str, network_id: str) -> Endpoint | None:
        for ep in self._endpoints.values():
            if ep.network_id.lower() == network_id.lower() and ip in ep.ip_addresses:
                return ep
        return None

    def create_endpoint(self, network_id: str, endpoint: Endpoint) -> Endpoint:
        op = "create_endpoint"
        kind = "remote" if endpoint.is_remote else "local"
        with self._op(op, f"{kind} {','.join(endpoint.ip_addresses)}"):
            if network_id.lower() != self.network.id.lower():
                raise _error(
                    HnsErrorKind.NOT_FOUND, op, f"network {network_id}", HCN_E_NETWORK_NOT_FOUND
                )
            for ip in endpoint.ip_addresses:
                existing = self._by_ip(ip, network_id)
                if existing is None:
                    continue
                if self.track_refs and existing.is_remote and endpoint.is_remote:
                    self._refs[existing.id] += 1
                    return existing
                raise _error(
                    HnsErrorKind.ALREADY_EXISTS,
                    op,
                    f"fake: endpoint {existing.id} already has IP {ip}",
                    HRESULT_ERROR_ALREADY_EXISTS,
                )
            created = endpoint.with_identity(self._new_id(), self.network.id)
            self._endpoints[created.id] = created
            self._refs[created.id] = 1
            return created

    def delete_endpoint(self, endpoint_id: str) -> None:
        op = "delete_endpoint"
        with self._op(op, endpoint_id):
            if endpoint_id not in self._endpoints:
                raise _error(
                    HnsErrorKind.NOT_FOUND, op, f"endpoint {endpoint_id}", HCN_E_ENDPOINT_NOT_FOUND
                )
            if endpoint_id in self._pods:
                raise _error(
                    HnsErrorKind.FAILED,
                    op,
                    f"fake: endpoint {endpoint_id} is a pod's (isLocal in the state file)",
                )
            if self.track_refs and self._refs.get(endpoint_id, 1) > 1:
                self._refs[endpoint_id] -= 1
                return
            users = sorted(i for i, lb in self._lbs.items() if endpoint_id in lb.endpoint_ids)
            if users:
                raise _error(
                    HnsErrorKind.FAILED,
                    op,
                    f"endpoint {endpoint_id} is used by load balancer(s) {', '.join(users)}",
                    HCN_E_ENTITY_HAS_REFERENCES,
                )
            del self._endpoints[endpoint_id]
            self._refs.pop(endpoint_id, None)

    # --- load balancers ----------------------------------------------------------------

    def list_load_balancers(self) -> list[LoadBalancer]:
        with self._op("list_load_balancers", "*"):
            return list(self._lbs.values())

    def create_load_balancer(self, lb: LoadBalancer) -> LoadBalancer:
        with self._op("create_load_balancer", _brief(lb)):
            self._check_lb("create_load_balancer", lb, replacing=None)
            created = lb.with_id(self._new_id())
            self._lbs[created.id] = created
            return created

    def modify_load_balancer(self, lb_id: str, lb: LoadBalancer) -> LoadBalancer:
        op = "modify_load_balancer"
        with self._op(op, f"{lb_id} {_brief(lb)}"):
            if not self.features.modify_load_balancer:
                raise _error(HnsErrorKind.NOT_SUPPORTED, op, "ModifyLoadbalancer is not supported")
            if lb_id not in self._lbs:
                raise _error(
                    HnsErrorKind.NOT_FOUND, op, f"load balancer {lb_id}", HRESULT_ERROR_NOT_FOUND
                )
            self._check_lb(op, lb, replacing=lb_id)
            modified = lb.with_id(lb_id)
            self._lbs[lb_id] = modified
            return modified

    def delete_load_balancer(self, lb_id: str) -> None:
        op = "delete_load_balancer"
        with self._op(op, lb_id):
            if lb_id not in self._lbs:
                raise _error(
                    HnsErrorKind.NOT_FOUND, op, f"load balancer {lb_id}", HRESULT_ERROR_NOT_FOUND
                )
            del self._lbs[lb_id]

    def supported_features(self) -> SupportedFeatures:
        with self._op("supported_features", ""):
            return self.features

    def _check_lb(self, op: str, lb: LoadBalancer, replacing: str | None) -> None:
        f = self.features
        unsupported = [
            (bool(lb.flags & LoadBalancerFlags.DSR) and not f.dsr, "DSR"),
            (bool(lb.flags & LoadBalancerFlags.IPV6) and not f.ipv6_dual_stack, "IPv6DualStack"),
            (
                any(pm.distribution != Distribution.NONE for pm in lb.port_mappings)
                and not f.session_affinity,
                "SessionAffinity",
            ),
        ]
        for refused, feature in unsupported:
            if refused:
                raise _error(HnsErrorKind.NOT_SUPPORTED, op, f"{feature} is not supported")
        for pm in lb.port_mappings:
            if pm.internal_port == 0:
                raise _error(
                    HnsErrorKind.INVALID,
                    op,
                    "the internal port must exist and cannot be zero",
                    HCN_E_INVALID_INTERNAL_PORT,
                )
        if len(set(lb.endpoint_ids)) != len(lb.endpoint_ids):
            raise _error(HnsErrorKind.INVALID, op, "fake: an endpoint is listed twice")
        endpoints = []
        for ep_id in lb.endpoint_ids:
            ep = self._endpoints.get(ep_id)
            if ep is None:
                raise _error(
                    HnsErrorKind.INVALID,
                    op,
                    f"the reference is invalid in the JSON document: endpoint {ep_id}",
                    HCN_E_INVALID_JSON_REFERENCE,
                )
            endpoints.append(ep)
        v6 = bool(lb.flags & LoadBalancerFlags.IPV6)
        addresses = [*lb.frontend_vips, *([lb.source_vip] if lb.source_vip else [])]
        for address in addresses:
            if is_ipv6(address) != v6:
                raise _error(
                    HnsErrorKind.INVALID,
                    op,
                    f"fake: {address} does not match the load balancer's IPv6 flag ({v6})",
                )
        for ep in endpoints:
            if not any(is_ipv6(ip) == v6 for ip in ep.ip_addresses):
                raise _error(
                    HnsErrorKind.INVALID,
                    op,
                    f"fake: endpoint {ep.id} has no {'IPv6' if v6 else 'IPv4'} address",
                )
        taken = {
            key: other_id
            for other_id, other in self._lbs.items()
            if other_id != replacing
            for key in _frontends(other)
        }
        for key in _frontends(lb):
            if key in taken:
                vip, proto, port = key
                raise _error(
                    HnsErrorKind.ALREADY_EXISTS,
                    op,
                    f"load balancer {taken[key]} already has "
                    f"{vip or '(node ports)'} {_PROTOCOL_NAMES.get(proto, proto)}/{port}",
                    HRESULT_ERROR_ALREADY_EXISTS,
                )

    # --- golden state ------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything the fake holds, sorted, as plain JSON values."""
        ips = {ep_id: ep.ip_addresses for ep_id, ep in self._endpoints.items()}
        endpoints = []
        for ep in sorted(self._endpoints.values(), key=lambda e: (e.ip_addresses, e.id)):
            entry: dict[str, Any] = {
                "id": ep.id,
                "ipAddresses": list(ep.ip_addresses),
                "macAddress": ep.mac_address,
                "isLocal": not ep.is_remote,
            }
            if ep.provider_address:
                entry["providerAddress"] = ep.provider_address
            if ep.is_remote:
                entry["refCount"] = self._refs.get(ep.id, 1)
            endpoints.append(entry)
        lbs = []
        for lb in sorted(self._lbs.values(), key=_lb_order):
            lbs.append(
                {
                    "id": lb.id,
                    "frontendVIPs": list(lb.frontend_vips),
                    "sourceVIP": lb.source_vip,
                    "flags": _names(lb.flags),
                    "portMappings": [
                        {
                            "protocol": pm.protocol,
                            "internalPort": pm.internal_port,
                            "externalPort": pm.external_port,
                            "distributionType": pm.distribution.name,
                            "flags": _names(pm.flags),
                        }
                        for pm in lb.port_mappings
                    ],
                    "hostComputeEndpoints": sorted(lb.endpoint_ids),
                    "endpointIPs": sorted(ip for e in lb.endpoint_ids for ip in ips[e]),
                }
            )
        return {
            "network": _network_state(self.network),
            "supportedFeatures": {
                "DSR": self.features.dsr,
                "ModifyLoadbalancer": self.features.modify_load_balancer,
                "IPv6DualStack": self.features.ipv6_dual_stack,
                "SessionAffinity": self.features.session_affinity,
            },
            "endpoints": endpoints,
            "loadBalancers": lbs,
        }


def _error(kind: HnsErrorKind, op: str, message: str, hresult: int | None = None) -> HnsError:
    return HnsError(message, kind=kind, operation=op, hresult=hresult)


def _frontends(lb: LoadBalancer) -> set[tuple[str, int, int]]:
    vips = lb.frontend_vips or ("",)
    return {(vip, pm.protocol, pm.external_port) for vip in vips for pm in lb.port_mappings}


def _brief(lb: LoadBalancer) -> str:
    pm = lb.port_mappings[0]
    proto = _PROTOCOL_NAMES.get(pm.protocol, str(pm.protocol))
    return f"{lb.vip or '(node ports)'} {proto}/{pm.external_port}->{pm.internal_port}"


def _lb_order(lb: LoadBalancer) -> tuple[str, int, int, str]:
    pm = lb.port_mappings[0]
    return (lb.vip, pm.protocol, pm.external_port, lb.id)


def _names(flags: enum.IntFlag) -> list[str]:
    return [m.name or "" for m in type(flags) if m.value and m in flags]


def _network_state(net: Network) -> dict[str, Any]:
    return {
        "name": net.name,
        "id": net.id,
        "type": net.type.value,
        "managementIP": net.management_ip,
        "remoteSubnets": [
            {
                "destinationPrefix": rs.destination_prefix,
                "providerAddress": rs.provider_address,
                "isolationId": rs.isolation_id,
                "drMacAddress": rs.dr_mac_address,
            }
            for rs in net.remote_subnets
        ],
    }


# --- the --hns-state file -----------------------------------------------------------------


class StateFileError(ValueError):
    """The ``--hns-state`` file cannot be read; the message names the file and the field."""


_TOP = {"network": True, "endpoints": False, "supportedFeatures": False}
_NETWORK = {"name": True, "id": True, "type": True, "managementIP": False, "remoteSubnets": False}
_SUBNET = {
    "destinationPrefix": True,
    "providerAddress": True,
    "isolationId": False,
    "drMacAddress": False,
}
_ENDPOINT = {"id": True, "ipAddress": True, "macAddress": False, "isLocal": True}
_FEATURES = {
    "DSR": False,
    "ModifyLoadbalancer": False,
    "IPv6DualStack": False,
    "SessionAffinity": False,
}


def load_state(path: str | Path, *, seed: int | None = None, track_refs: bool = False) -> FakeHns:
    """A :class:`FakeHns` holding what the ``--hns-state`` file at ``path`` describes."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as err:
        raise StateFileError(f"{p}: cannot read: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise StateFileError(f"{p}: not JSON: {err}") from None
    return state_from_doc(doc, source=str(p), seed=seed, track_refs=track_refs)


def state_from_doc(
    doc: object, *, source: str = "hns-state", seed: int | None = None, track_refs: bool = False
) -> FakeHns:
    """:func:`load_state` of a document already read."""
    try:
        top = _fields(doc, _TOP, "")
        net = _fields(top["network"], _NETWORK, "network")
        subnets = tuple(
            _subnet(s, f"network.remoteSubnets[{i}]")
            for i, s in enumerate(_array(net.get("remoteSubnets", []), "network.remoteSubnets"))
        )
        network = Network(
            name=_text(net["name"], "network.name"),
            id=_text(net["id"], "network.id"),
            type=_network_type(net["type"]),
            management_ip=_management_ip(net.get("managementIP", "")),
            remote_subnets=subnets,
        )
        endpoints = [
            _endpoint(e, f"endpoints[{i}]")
            for i, e in enumerate(_array(top.get("endpoints", []), "endpoints"))
        ]
        _unique(endpoints)
        feats = _fields(top.get("supportedFeatures", {}), _FEATURES, "supportedFeatures")
        for key, value in feats.items():
            if not isinstance(value, bool):
                raise StateFileError(
                    f"supportedFeatures.{key}: expected true or false, got {value!r}"
                )
        features = SupportedFeatures(
            dsr=feats.get("DSR", False),
            modify_load_balancer=feats.get("ModifyLoadbalancer", False),
            ipv6_dual_stack=feats.get("IPv6DualStack", False),
            session_affinity=feats.get("SessionAffinity", True),
        )
    except (StateFileError, SchemaError) as err:
        raise StateFileError(f"{source}: {err}") from None
    return FakeHns(
        network, endpoints=endpoints, features=features, seed=seed, track_refs=track_refs
    )


def _fields(doc: object, spec: dict[str, bool], where: str) -> dict[str, Any]:
    label = where or "the file"
    if not isinstance(doc, dict):
        raise StateFileError(f"{label}: expected an object, got {type(doc).__name__}")
    for key in doc:
        if key not in spec:
            prefix = f"{where}." if where else ""
            raise StateFileError(f"{prefix}{key}: unknown field (known: {', '.join(spec)})")
    for key, required in spec.items():
        if required and key not in doc:
            prefix = f"{where}." if where else ""
            raise StateFileError(f"{prefix}{key}: missing")
    return doc


def _array(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise StateFileError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _text(value: object, where: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise StateFileError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _management_ip(value: object) -> str:
    text = _text(value, "network.managementIP", empty=True)
    return check_ip(text, "network.managementIP") if text else ""


def _network_type(value: object) -> NetworkType:
    if value not in ("Overlay", "L2Bridge"):
        raise StateFileError(f"network.type: {value!r} is not Overlay or L2Bridge")
    return NetworkType(value)


def _subnet(doc: object, where: str) -> RemoteSubnet:
    d = _fields(doc, _SUBNET, where)
    isolation = d.get("isolationId", 0)
    if isinstance(isolation, bool) or not isinstance(isolation, int) or not 0 <= isolation <= 65535:
        raise StateFileError(
            f"{where}.isolationId: expected an integer 0..65535, got {isolation!r}"
        )
    mac = _text(d.get("drMacAddress", ""), f"{where}.drMacAddress", empty=True)
    return RemoteSubnet(
        destination_prefix=check_prefix(
            _text(d["destinationPrefix"], f"{where}.destinationPrefix"),
            f"{where}.destinationPrefix",
        ),
        provider_address=check_ip(
            _text(d["providerAddress"], f"{where}.providerAddress"), f"{where}.providerAddress"
        ),
        isolation_id=isolation,
        dr_mac_address=check_mac(mac, f"{where}.drMacAddress") if mac else "",
    )


def _endpoint(doc: object, where: str) -> Endpoint:
    d = _fields(doc, _ENDPOINT, where)
    is_local = d["isLocal"]
    if not isinstance(is_local, bool):
        raise StateFileError(f"{where}.isLocal: expected true or false, got {is_local!r}")
    mac = _text(d.get("macAddress", ""), f"{where}.macAddress", empty=True)
    return Endpoint(
        ip_addresses=(check_ip(_text(d["ipAddress"], f"{where}.ipAddress"), f"{where}.ipAddress"),),
        mac_address=check_mac(mac, f"{where}.macAddress") if mac else "",
        is_remote=not is_local,
        id=_text(d["id"], f"{where}.id"),
    )


def _unique(endpoints: list[Endpoint]) -> None:
    ids: dict[str, int] = {}
    ips: dict[str, int] = {}
    for i, ep in enumerate(endpoints):
        if ep.id in ids:
            raise StateFileError(f"endpoints[{i}].id: {ep.id} is also endpoints[{ids[ep.id]}]'s")
        ids[ep.id] = i
        if ep.ip_address in ips:
            raise StateFileError(
                f"endpoints[{i}].ipAddress: {ep.ip_address} is also "
                f"endpoints[{ips[ep.ip_address]}]'s"
            )
        ips[ep.ip_address] = i
