"""The HCN (schema v2) documents kube-proxy's Windows kernelspace mode creates and reads.

Nothing here has run on Windows. The field names and numeric values are HCN schema v2's
as written by hcsshim/hnslib's ``hcn`` package (Go structs whose JSON names are the Go
field names, ``Id`` being ``"ID"``; ``omitempty`` drops zero values) and by upstream
kube-proxy's ``pkg/proxy/winkernel/hns.go``:

* :class:`LoadBalancer` — ``HostComputeLoadBalancer``: ``ID``, ``HostComputeEndpoints``
  (endpoint IDs), ``SourceVIP``, ``FrontendVIPs``, ``PortMappings``, ``SchemaVersion``,
  ``Flags`` (:class:`LoadBalancerFlags`).
* :class:`PortMapping` — ``LoadBalancerPortMapping``: ``Protocol`` (IANA number: TCP 6,
  UDP 17, SCTP 132), ``InternalPort``, ``ExternalPort``, ``DistributionType``
  (:class:`Distribution`), ``Flags`` (:class:`PortMappingFlags`).
* :class:`Endpoint` — ``HostComputeEndpoint``: ``ID``, ``Name``, ``HostComputeNetwork``,
  ``IpConfigurations[{IpAddress, PrefixLength}]``, ``MacAddress``, ``Flags``
  (:class:`EndpointFlags`: RemoteEndpoint 1), ``Policies`` (the provider address of a
  remote endpoint is a ``{"Type": "ProviderAddress", "Settings": {"ProviderAddress"}}``
  policy).
* :class:`Network` — ``HostComputeNetwork``: ``ID``, ``Name``, ``Type`` (``Overlay``,
  ``L2Bridge``; upstream compares case-insensitively) and its ``RemoteSubnetRoute``
  policies (:class:`RemoteSubnet`: ``DestinationPrefix``, ``IsolationId``,
  ``ProviderAddress``, ``DistributedRouterMacAddress``). ``ManagementIP`` is not a field
  of hcsshim's v2 ``HostComputeNetwork`` (it is one of the v1 ``HNSNetwork``); it is
  kept here because the ``--hns-state`` file carries it, and read from a document only
  when present.
* :class:`SupportedFeatures` — hcsshim's ``SupportedFeatures`` JSON names (``DSR``,
  ``ModifyLoadbalancer``, ``IPv6DualStack``, ``SessionAffinity``, ``RemoteSubnet``,
  ``API.V2``), and :meth:`SupportedFeatures.from_version`: hnslib derives them from the
  HNS version (``hcnglobals.go``), with the same version ranges.

Where each numeric value was checked (public sources, see the report of issue 26):
``LoadBalancerFlags`` None 0 / DSR 1 (hcsshim ``hcn/hcnloadbalancer.go``), IPv6 2
(upstream ``winkernel/hns.go``, which defines it beside hcsshim's); port-mapping flags
ILB 1 ("enables internal loadbalancing"), LocalRoutedVIP 2, UseMux 4, PreserveDIP 8
(hcsshim ``hcnloadbalancer.go``), VipExternalIP 16 (upstream ``winkernel/hns.go``);
distribution None 0, SourceIPProtocol 1, SourceIP 2 (hcsshim); EndpointFlags
RemoteEndpoint 1 (hcsshim ``hcn/hcnendpoint.go``).

Every class is frozen and validated on construction; ``to_hcn()`` writes the HCN
document (a ``dict`` ready for ``json.dumps``), ``from_hcn()`` reads one and raises
:class:`SchemaError` (a ``ValueError``) naming the field it could not read.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION: dict[str, int] = {"Major": 2, "Minor": 0}

PROTOCOL_TCP = 6
PROTOCOL_UDP = 17
PROTOCOL_SCTP = 132
PROTOCOLS: dict[str, int] = {"TCP": PROTOCOL_TCP, "UDP": PROTOCOL_UDP, "SCTP": PROTOCOL_SCTP}

_MAC = re.compile(r"^[0-9A-Fa-f]{2}([-:][0-9A-Fa-f]{2}){5}$")


class SchemaError(ValueError):
    """An HCN document (or a value for one) that cannot be read; the message names the field."""


class LoadBalancerFlags(enum.IntFlag):
    """``HostComputeLoadBalancer.Flags``."""

    NONE = 0
    DSR = 1  # EnableDirectServerReturn
    IPV6 = 2


class PortMappingFlags(enum.IntFlag):
    """``LoadBalancerPortMapping.Flags``."""

    NONE = 0
    ILB = 1  # internal load balancing (a ClusterIP)
    LOCAL_ROUTED_VIP = 2  # the VIP reachable from the host
    USE_MUX = 4  # DSR for NodePort access
    PRESERVE_DIP = 8  # deliver with the VIP as destination
    VIP_EXTERNAL_IP = 16


class Distribution(enum.IntEnum):
    """``LoadBalancerPortMapping.DistributionType``."""

    NONE = 0  # per connection
    SOURCE_IP_PROTOCOL = 1
    SOURCE_IP = 2  # what upstream uses for sessionAffinity: ClientIP


class EndpointFlags(enum.IntFlag):
    """``HostComputeEndpoint.Flags``."""

    NONE = 0
    REMOTE_ENDPOINT = 1


class NetworkType(enum.Enum):
    """The network types kube-proxy's kernelspace mode runs on."""

    OVERLAY = "Overlay"
    L2BRIDGE = "L2Bridge"

    @classmethod
    def parse(cls, value: object, where: str = "Type") -> NetworkType:
        if isinstance(value, str):
            for member in cls:
                if member.value.lower() == value.lower():
                    return member
        raise SchemaError(f"{where}: {value!r} is not a network type (Overlay, L2Bridge)")


# --- reading helpers -----------------------------------------------------------------


def _obj(doc: object, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise SchemaError(f"{where}: expected an object, got {type(doc).__name__}")
    return doc


def _str(doc: Mapping[str, Any], key: str, where: str, default: str = "") -> str:
    value = doc.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        raise SchemaError(f"{where}.{key}: expected a string, got {value!r}")
    return value


def _int(doc: Mapping[str, Any], key: str, where: str, limit: int) -> int:
    value = doc.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= limit:
        raise SchemaError(f"{where}.{key}: expected an integer 0..{limit}, got {value!r}")
    return value


def _list(doc: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SchemaError(f"{where}.{key}: expected a list, got {value!r}")
    return value


def _strs(doc: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = _list(doc, key, where)
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise SchemaError(f"{where}.{key}[{i}]: expected a string, got {item!r}")
    return tuple(items)


def _flags(doc: Mapping[str, Any], key: str, where: str, kind: type[enum.IntFlag]) -> int:
    value = _int(doc, key, where, 2**32 - 1)
    known = 0
    for member in kind:
        known |= int(member)
    if value & ~known:
        raise SchemaError(f"{where}.{key}: unknown {kind.__name__} bits in {value:#x}")
    return value


def check_ip(value: str, where: str) -> str:
    """``value`` as a canonical IP address, or :class:`SchemaError` naming ``where``."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise SchemaError(f"{where}: {value!r} is not an IP address") from None


def check_prefix(value: str, where: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        raise SchemaError(f"{where}: {value!r} is not an IP prefix") from None


def check_mac(value: str, where: str) -> str:
    if not _MAC.match(value):
        raise SchemaError(f"{where}: {value!r} is not a MAC address (aa-bb-cc-dd-ee-ff)")
    return value


def is_ipv6(address: str) -> bool:
    return ipaddress.ip_address(address).version == 6


# --- load balancers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PortMapping:
    protocol: int
    internal_port: int
    external_port: int
    distribution: Distribution = Distribution.NONE
    flags: PortMappingFlags = PortMappingFlags.NONE

    def __post_init__(self) -> None:
        if not 0 < self.protocol <= 255:
            raise SchemaError(f"PortMappings.Protocol: {self.protocol!r} is not 1..255")
        ports = (("InternalPort", self.internal_port), ("ExternalPort", self.external_port))
        for name, port in ports:
            if not 0 <= port <= 65535:
                raise SchemaError(f"PortMappings.{name}: {port!r} is not 0..65535")
        object.__setattr__(self, "distribution", Distribution(self.distribution))
        object.__setattr__(self, "flags", PortMappingFlags(self.flags))

    def to_hcn(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"Protocol": self.protocol}
        if self.internal_port:
            doc["InternalPort"] = self.internal_port
        if self.external_port:
            doc["ExternalPort"] = self.external_port
        if self.distribution:
            doc["DistributionType"] = int(self.distribution)
        if self.flags:
            doc["Flags"] = int(self.flags)
        return doc

    @classmethod
    def from_hcn(cls, doc: object, where: str = "PortMappings") -> PortMapping:
        d = _obj(doc, where)
        distribution = _int(d, "DistributionType", where, 2**32 - 1)
        try:
            dist = Distribution(distribution)
        except ValueError:
            raise SchemaError(f"{where}.DistributionType: unknown value {distribution}") from None
        return cls(
            protocol=_int(d, "Protocol", where, 255),
            internal_port=_int(d, "InternalPort", where, 65535),
            external_port=_int(d, "ExternalPort", where, 65535),
            distribution=dist,
            flags=PortMappingFlags(_flags(d, "Flags", where, PortMappingFlags)),
        )


@dataclass(frozen=True, slots=True)
class LoadBalancer:
    """A load balancer; ``id`` is empty until HNS has created it."""

    port_mappings: tuple[PortMapping, ...]
    frontend_vips: tuple[str, ...] = ()
    endpoint_ids: tuple[str, ...] = ()
    source_vip: str = ""
    flags: LoadBalancerFlags = LoadBalancerFlags.NONE
    id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "port_mappings", tuple(self.port_mappings))
        if not self.port_mappings:
            raise SchemaError("PortMappings: a load balancer needs one port mapping")
        vips = tuple(check_ip(v, f"FrontendVIPs[{i}]") for i, v in enumerate(self.frontend_vips))
        object.__setattr__(self, "frontend_vips", vips)
        object.__setattr__(self, "endpoint_ids", tuple(self.endpoint_ids))
        if self.source_vip:
            object.__setattr__(self, "source_vip", check_ip(self.source_vip, "SourceVIP"))
        object.__setattr__(self, "flags", LoadBalancerFlags(self.flags))

    @property
    def vip(self) -> str:
        """The frontend VIP ("" for a NodePort load balancer, which has none)."""
        return self.frontend_vips[0] if self.frontend_vips else ""

    def with_id(self, lb_id: str) -> LoadBalancer:
        return LoadBalancer(
            self.port_mappings,
            self.frontend_vips,
            self.endpoint_ids,
            self.source_vip,
            self.flags,
            lb_id,
        )

    def to_hcn(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.id:
            doc["ID"] = self.id
        if self.endpoint_ids:
            doc["HostComputeEndpoints"] = list(self.endpoint_ids)
        if self.source_vip:
            doc["SourceVIP"] = self.source_vip
        if self.frontend_vips:
            doc["FrontendVIPs"] = list(self.frontend_vips)
        doc["PortMappings"] = [pm.to_hcn() for pm in self.port_mappings]
        doc["SchemaVersion"] = dict(SCHEMA_VERSION)
        if self.flags:
            doc["Flags"] = int(self.flags)
        return doc

    @classmethod
    def from_hcn(cls, doc: object, where: str = "LoadBalancer") -> LoadBalancer:
        d = _obj(doc, where)
        mappings = tuple(
            PortMapping.from_hcn(pm, f"{where}.PortMappings[{i}]")
            for i, pm in enumerate(_list(d, "PortMappings", where))
        )
        if not mappings:
            raise SchemaError(f"{where}.PortMappings: missing")
        return cls(
            port_mappings=mappings,
            frontend_vips=_strs(d, "FrontendVIPs", where),
            endpoint_ids=_strs(d, "HostComputeEndpoints", where),
            source_vip=_str(d, "SourceVIP", where),
            flags=LoadBalancerFlags(_flags(d, "Flags", where, LoadBalancerFlags)),
            id=_str(d, "ID", where),
        )


# --- endpoints --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An HNS endpoint: a local pod, or a remote one kube-proxy creates for a load balancer."""

    ip_addresses: tuple[str, ...]
    mac_address: str = ""
    is_remote: bool = False
    provider_address: str = ""
    network_id: str = ""
    name: str = ""
    id: str = ""

    def __post_init__(self) -> None:
        ips = tuple(
            check_ip(ip, f"IpConfigurations[{i}].IpAddress")
            for i, ip in enumerate(self.ip_addresses)
        )
        if not ips:
            raise SchemaError("IpConfigurations: an endpoint needs an IP address")
        object.__setattr__(self, "ip_addresses", ips)
        if self.mac_address:
            check_mac(self.mac_address, "MacAddress")
        if self.provider_address:
            check_ip(self.provider_address, "ProviderAddress")

    @property
    def ip_address(self) -> str:
        return self.ip_addresses[0]

    def with_identity(self, endpoint_id: str, network_id: str) -> Endpoint:
        return Endpoint(
            self.ip_addresses,
            self.mac_address,
            self.is_remote,
            self.provider_address,
            network_id,
            self.name,
            endpoint_id,
        )

    def to_hcn(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.id:
            doc["ID"] = self.id
        if self.name:
            doc["Name"] = self.name
        if self.network_id:
            doc["HostComputeNetwork"] = self.network_id
        if self.provider_address:
            doc["Policies"] = [
                {"Type": "ProviderAddress", "Settings": {"ProviderAddress": self.provider_address}}
            ]
        doc["IpConfigurations"] = [{"IpAddress": ip} for ip in self.ip_addresses]
        if self.mac_address:
            doc["MacAddress"] = self.mac_address
        if self.is_remote:
            doc["Flags"] = int(EndpointFlags.REMOTE_ENDPOINT)
        doc["SchemaVersion"] = dict(SCHEMA_VERSION)
        return doc

    @classmethod
    def from_hcn(cls, doc: object, where: str = "Endpoint") -> Endpoint:
        d = _obj(doc, where)
        ips: list[str] = []
        for i, cfg in enumerate(_list(d, "IpConfigurations", where)):
            at = f"{where}.IpConfigurations[{i}]"
            ips.append(_str(_obj(cfg, at), "IpAddress", at))
        provider = ""
        for i, policy in enumerate(_list(d, "Policies", where)):
            p = _obj(policy, f"{where}.Policies[{i}]")
            if p.get("Type") == "ProviderAddress":
                settings = _obj(p.get("Settings"), f"{where}.Policies[{i}].Settings")
                provider = _str(settings, "ProviderAddress", f"{where}.Policies[{i}].Settings")
        flags = _int(d, "Flags", where, 2**32 - 1)
        return cls(
            ip_addresses=tuple(ips),
            mac_address=_str(d, "MacAddress", where),
            is_remote=bool(flags & EndpointFlags.REMOTE_ENDPOINT),
            provider_address=provider,
            network_id=_str(d, "HostComputeNetwork", where),
            name=_str(d, "Name", where),
            id=_str(d, "ID", where),
        )


# --- the network ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RemoteSubnet:
    """A ``RemoteSubnetRoute`` policy of an Overlay network: another node's pod subnet."""

    destination_prefix: str
    provider_address: str
    isolation_id: int = 0
    dr_mac_address: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "destination_prefix",
            check_prefix(self.destination_prefix, "DestinationPrefix"),
        )
        check_ip(self.provider_address, "ProviderAddress")
        if isinstance(self.isolation_id, bool) or not 0 <= self.isolation_id <= 65535:
            raise SchemaError(f"IsolationId: {self.isolation_id!r} is not 0..65535")
        if self.dr_mac_address:
            check_mac(self.dr_mac_address, "DistributedRouterMacAddress")

    def to_hcn(self) -> dict[str, Any]:
        return {
            "Type": "RemoteSubnetRoute",
            "Settings": {
                "DestinationPrefix": self.destination_prefix,
                "IsolationId": self.isolation_id,
                "ProviderAddress": self.provider_address,
                "DistributedRouterMacAddress": self.dr_mac_address,
            },
        }

    @classmethod
    def from_settings(cls, doc: object, where: str) -> RemoteSubnet:
        d = _obj(doc, where)
        return cls(
            destination_prefix=_str(d, "DestinationPrefix", where),
            provider_address=_str(d, "ProviderAddress", where),
            isolation_id=_int(d, "IsolationId", where, 65535),
            dr_mac_address=_str(d, "DistributedRouterMacAddress", where),
        )


@dataclass(frozen=True, slots=True)
class Network:
    name: str
    id: str
    type: NetworkType
    management_ip: str = ""
    remote_subnets: tuple[RemoteSubnet, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            raise SchemaError("Name: a network needs a name")
        if not self.id:
            raise SchemaError("ID: a network needs an ID")
        object.__setattr__(self, "type", NetworkType(self.type))
        if self.management_ip:
            object.__setattr__(self, "management_ip", check_ip(self.management_ip, "ManagementIP"))
        object.__setattr__(self, "remote_subnets", tuple(self.remote_subnets))

    @property
    def is_overlay(self) -> bool:
        return self.type is NetworkType.OVERLAY

    def to_hcn(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"ID": self.id, "Name": self.name, "Type": self.type.value}
        if self.remote_subnets:
            doc["Policies"] = [rs.to_hcn() for rs in self.remote_subnets]
        if self.management_ip:
            doc["ManagementIP"] = self.management_ip
        doc["SchemaVersion"] = dict(SCHEMA_VERSION)
        return doc

    @classmethod
    def from_hcn(cls, doc: object, where: str = "Network") -> Network:
        d = _obj(doc, where)
        subnets: list[RemoteSubnet] = []
        for i, policy in enumerate(_list(d, "Policies", where)):
            p = _obj(policy, f"{where}.Policies[{i}]")
            if p.get("Type") == "RemoteSubnetRoute":
                at = f"{where}.Policies[{i}].Settings"
                subnets.append(RemoteSubnet.from_settings(p.get("Settings"), at))
        return cls(
            name=_str(d, "Name", where),
            id=_str(d, "ID", where),
            type=NetworkType.parse(d.get("Type"), f"{where}.Type"),
            management_ip=_str(d, "ManagementIP", where),
            remote_subnets=tuple(subnets),
        )


# --- supported features ---------------------------------------------------------------

_MAX = 2**31 - 1
# hnslib hcn/hcnglobals.go: the HNS versions (major, minor) each feature is in.
_RANGES: dict[str, tuple[tuple[tuple[int, int], tuple[int, int]], ...]] = {
    "api_v2": (((9, 2), (_MAX, _MAX)),),
    "remote_subnet": (((9, 2), (_MAX, _MAX)),),
    "dsr": (((9, 3), (9, _MAX)), ((10, 2), (_MAX, _MAX))),
    "session_affinity": (((12, 0), (_MAX, _MAX)),),
    "ipv6_dual_stack": (((11, 10), (_MAX, _MAX)),),
    "modify_load_balancer": (((15, 5), (15, _MAX)), ((16, 0), (_MAX, _MAX))),
}


def _in_ranges(version: tuple[int, int], feature: str) -> bool:
    return any(low <= version <= high for low, high in _RANGES[feature])


@dataclass(frozen=True, slots=True)
class SupportedFeatures:
    """What this host's HNS can do. The defaults are a host where the features kube-proxy
    may go without (DSR, ModifyLoadbalancer, IPv6DualStack) are absent and those every
    supported Windows Server has (SessionAffinity since HNS 12, RemoteSubnet and the v2
    API since 9.2) are present."""

    dsr: bool = False
    modify_load_balancer: bool = False
    ipv6_dual_stack: bool = False
    session_affinity: bool = True
    remote_subnet: bool = True
    api_v2: bool = True

    @classmethod
    def from_version(cls, major: int, minor: int) -> SupportedFeatures:
        """The features of HNS ``major.minor``, by hnslib's version ranges."""
        v = (major, minor)
        return cls(**{name: _in_ranges(v, name) for name in _RANGES})

    def to_hcn(self) -> dict[str, Any]:
        return {
            "DSR": self.dsr,
            "ModifyLoadbalancer": self.modify_load_balancer,
            "IPv6DualStack": self.ipv6_dual_stack,
            "SessionAffinity": self.session_affinity,
            "RemoteSubnet": self.remote_subnet,
            "API": {"V1": True, "V2": self.api_v2},
        }

    @classmethod
    def from_hcn(cls, doc: object, where: str = "SupportedFeatures") -> SupportedFeatures:
        d = _obj(doc, where)

        def flag(key: str, default: bool) -> bool:
            value = d.get(key, default)
            if not isinstance(value, bool):
                raise SchemaError(f"{where}.{key}: expected true or false, got {value!r}")
            return value

        api = _obj(d.get("API", {}), f"{where}.API")
        v2 = api.get("V2", True)
        if not isinstance(v2, bool):
            raise SchemaError(f"{where}.API.V2: expected true or false, got {v2!r}")
        return cls(
            dsr=flag("DSR", False),
            modify_load_balancer=flag("ModifyLoadbalancer", False),
            ipv6_dual_stack=flag("IPv6DualStack", False),
            session_affinity=flag("SessionAffinity", True),
            remote_subnet=flag("RemoteSubnet", True),
            api_v2=v2,
        )


def guids(doc: object, where: str) -> tuple[str, ...]:
    """An ``HcnEnumerate*`` answer: a JSON list of GUID strings."""
    if not isinstance(doc, Sequence) or isinstance(doc, str):
        raise SchemaError(f"{where}: expected a list of IDs, got {doc!r}")
    out: list[str] = []
    for i, item in enumerate(doc):
        if not isinstance(item, str):
            raise SchemaError(f"{where}[{i}]: expected an ID string, got {item!r}")
        out.append(item)
    return tuple(out)


__all__ = [
    "PROTOCOLS",
    "SCHEMA_VERSION",
    "Distribution",
    "Endpoint",
    "EndpointFlags",
    "LoadBalancer",
    "LoadBalancerFlags",
    "Network",
    "NetworkType",
    "PortMapping",
    "PortMappingFlags",
    "RemoteSubnet",
    "SchemaError",
    "SupportedFeatures",
    "guids",
]
