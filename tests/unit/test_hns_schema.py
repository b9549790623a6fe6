"""HCN schema v2 documents: the flag values, and each type to and from its document.

The example documents are written the way hcsshim/hnslib's ``hcn`` package marshals its
Go structs (field names as the Go names, ``Id`` as ``"ID"``, zero values omitted).
"""

from __future__ import annotations

import json

import pytest

from kubeproxy.dataplane.hns.schema import (
    Distribution,
    Endpoint,
    EndpointFlags,
    LoadBalancer,
    LoadBalancerFlags,
    Network,
    NetworkType,
    PortMapping,
    PortMappingFlags,
    RemoteSubnet,
    SchemaError,
    SupportedFeatures,
    guids,
)

LB_DOC = {
    "ID": "2f9b4f0e-8d6a-4c1e-9a53-5d7c1e0f8a11",
    "HostComputeEndpoints": [
        "7c1a0c5e-0000-4000-8000-000000000001",
        "7c1a0c5e-0000-4000-8000-000000000002",
    ],
    "SourceVIP": "10.244.1.2",
    "FrontendVIPs": ["10.96.0.10"],
    "PortMappings": [
        {
            "Protocol": 17,
            "InternalPort": 53,
            "ExternalPort": 53,
            "DistributionType": 2,
            "Flags": 1,
        }
    ],
    "SchemaVersion": {"Major": 2, "Minor": 0},
    "Flags": 1,
}

ENDPOINT_DOC = {
    "ID": "7c1a0c5e-0000-4000-8000-000000000002",
    "HostComputeNetwork": "c8a5e2a4-1f3b-4e4e-9a2a-0d1e2f3a4b5c",
    "Policies": [{"Type": "ProviderAddress", "Settings": {"ProviderAddress": "192.168.0.12"}}],
    "IpConfigurations": [{"IpAddress": "10.244.2.7"}],
    "MacAddress": "02-11-0a-f4-02-07",
    "Flags": 1,
    "SchemaVersion": {"Major": 2, "Minor": 0},
}

NETWORK_DOC = {
    "ID": "c8a5e2a4-1f3b-4e4e-9a2a-0d1e2f3a4b5c",
    "Name": "vxlan0",
    "Type": "Overlay",
    "Policies": [
        {
            "Type": "RemoteSubnetRoute",
            "Settings": {
                "DestinationPrefix": "10.244.2.0/24",
                "IsolationId": 4096,
                "ProviderAddress": "192.168.0.12",
                "DistributedRouterMacAddress": "00-15-5d-52-c0-00",
            },
        }
    ],
    "ManagementIP": "192.168.0.11",
    "SchemaVersion": {"Major": 2, "Minor": 0},
}


def test_flag_values_are_hcn_s() -> None:
    assert [int(f) for f in LoadBalancerFlags] == [1, 2]  # DSR, IPv6 (None is 0)
    assert int(LoadBalancerFlags.NONE) == 0
    # ILB, LocalRoutedVIP, UseMux, PreserveDIP, VipExternalIP
    assert [int(f) for f in PortMappingFlags] == [1, 2, 4, 8, 16]
    assert [int(d) for d in Distribution] == [0, 1, 2]  # None, SourceIPProtocol, SourceIP
    assert [int(f) for f in EndpointFlags] == [1]  # RemoteEndpoint


def test_load_balancer_round_trip() -> None:
    lb = LoadBalancer.from_hcn(LB_DOC)
    assert lb.vip == "10.96.0.10"
    assert lb.flags == LoadBalancerFlags.DSR
    (pm,) = lb.port_mappings
    assert pm == PortMapping(17, 53, 53, Distribution.SOURCE_IP, PortMappingFlags.ILB)
    assert lb.endpoint_ids[1].endswith("02")
    assert lb.to_hcn() == LB_DOC
    assert json.loads(json.dumps(lb.to_hcn())) == LB_DOC


def test_load_balancer_omits_zero_values_as_hcsshim_does() -> None:
    nodeport = LoadBalancer((PortMapping(6, 8080, 30080),), endpoint_ids=("e1",))
    assert nodeport.vip == ""
    assert nodeport.to_hcn() == {
        "HostComputeEndpoints": ["e1"],
        "PortMappings": [{"Protocol": 6, "InternalPort": 8080, "ExternalPort": 30080}],
        "SchemaVersion": {"Major": 2, "Minor": 0},
    }
    assert LoadBalancer.from_hcn(nodeport.to_hcn()) == nodeport


def test_combined_flags_survive() -> None:
    flags = PortMappingFlags.USE_MUX | PortMappingFlags.PRESERVE_DIP
    lb = LoadBalancer(
        (PortMapping(6, 80, 80, flags=flags),),
        frontend_vips=("fd00::10",),
        flags=LoadBalancerFlags.DSR | LoadBalancerFlags.IPV6,
    )
    doc = lb.to_hcn()
    assert doc["Flags"] == 3 and doc["PortMappings"][0]["Flags"] == 12
    assert LoadBalancer.from_hcn(doc) == lb


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({**LB_DOC, "PortMappings": []}, "LoadBalancer.PortMappings"),
        ({**LB_DOC, "FrontendVIPs": ["not-an-ip"]}, "FrontendVIPs[0]"),
        ({**LB_DOC, "Flags": 4}, "LoadBalancer.Flags"),
        ({**LB_DOC, "PortMappings": [{"Protocol": 6, "ExternalPort": 70000}]}, "ExternalPort"),
        ({**LB_DOC, "PortMappings": [{"Protocol": 6, "DistributionType": 7}]}, "DistributionType"),
        ({**LB_DOC, "PortMappings": [{"Protocol": 6, "Flags": 32}]}, "PortMappings[0].Flags"),
        ({**LB_DOC, "HostComputeEndpoints": [1]}, "HostComputeEndpoints[0]"),
        ({**LB_DOC, "SourceVIP": 5}, "SourceVIP"),
    ],
)
def test_load_balancer_errors_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(SchemaError, match=field.replace("[", r"\[").replace("]", r"\]")):
        LoadBalancer.from_hcn(doc)


def test_remote_endpoint_round_trip() -> None:
    ep = Endpoint.from_hcn(ENDPOINT_DOC)
    assert ep.is_remote and ep.ip_address == "10.244.2.7"
    assert ep.provider_address == "192.168.0.12"
    assert ep.network_id.startswith("c8a5")
    assert ep.to_hcn() == ENDPOINT_DOC


def test_local_endpoint_has_no_flags_and_may_be_dual_stack() -> None:
    doc = {
        "ID": "x",
        "Name": "pod-a_eth0",
        "IpConfigurations": [
            {"IpAddress": "10.244.1.5", "PrefixLength": 24},
            {"IpAddress": "fd00::5"},
        ],
        "MacAddress": "00-15-5D-52-C0-05",
        "Dns": {"ServerList": ["10.96.0.10"]},
    }
    ep = Endpoint.from_hcn(doc)
    assert not ep.is_remote
    assert ep.ip_addresses == ("10.244.1.5", "fd00::5")
    assert "Flags" not in ep.to_hcn()


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({"IpConfigurations": []}, "IpConfigurations"),
        ({"IpConfigurations": [{"IpAddress": "300.1.1.1"}]}, r"IpConfigurations\[0\]"),
        ({"IpConfigurations": [{"IpAddress": "10.0.0.1"}], "MacAddress": "zz"}, "MacAddress"),
        ({"IpConfigurations": "10.0.0.1"}, "Endpoint.IpConfigurations"),
        ({"IpConfigurations": [{"IpAddress": "10.0.0.1"}], "Flags": -1}, "Endpoint.Flags"),
    ],
)
def test_endpoint_errors_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(SchemaError, match=field):
        Endpoint.from_hcn(doc)


def test_network_round_trip_and_type_case() -> None:
    net = Network.from_hcn(NETWORK_DOC)
    assert net.is_overlay and net.management_ip == "192.168.0.11"
    assert net.remote_subnets == (
        RemoteSubnet("10.244.2.0/24", "192.168.0.12", 4096, "00-15-5d-52-c0-00"),
    )
    assert net.to_hcn() == NETWORK_DOC
    # upstream's own fake answers "overlay"; the proxier compares with EqualFold
    assert Network.from_hcn({**NETWORK_DOC, "Type": "overlay"}).type is NetworkType.OVERLAY
    bridge = Network.from_hcn({"ID": "n", "Name": "cbr0", "Type": "L2Bridge"})
    assert bridge.type is NetworkType.L2BRIDGE and bridge.remote_subnets == ()


def test_network_ignores_other_policies_and_refuses_other_types() -> None:
    doc = {**NETWORK_DOC, "Policies": [{"Type": "ProviderAddress", "Settings": {}}]}
    assert Network.from_hcn(doc).remote_subnets == ()
    with pytest.raises(SchemaError, match=r"Network\.Type: 'NAT'"):
        Network.from_hcn({**NETWORK_DOC, "Type": "NAT"})
    bad = {
        **NETWORK_DOC,
        "Policies": [{"Type": "RemoteSubnetRoute", "Settings": {"DestinationPrefix": "x"}}],
    }
    with pytest.raises(SchemaError, match="DestinationPrefix"):
        Network.from_hcn(bad)


def test_supported_features_json_names() -> None:
    doc = {
        "DSR": True,
        "ModifyLoadbalancer": False,
        "IPv6DualStack": True,
        "SessionAffinity": True,
        "RemoteSubnet": True,
        "API": {"V1": True, "V2": True},
        "L4Proxy": True,
    }
    f = SupportedFeatures.from_hcn(doc)
    assert f.dsr and f.ipv6_dual_stack and not f.modify_load_balancer
    assert {k: v for k, v in f.to_hcn().items() if k in doc} == {k: doc[k] for k in f.to_hcn()}
    with pytest.raises(SchemaError, match=r"SupportedFeatures\.DSR"):
        SupportedFeatures.from_hcn({"DSR": "yes"})


@pytest.mark.parametrize(
    ("version", "dsr", "ipv6", "modify"),
    [
        ((9, 2), False, False, False),
        ((9, 5), True, False, False),
        ((10, 1), False, False, False),  # DSR is 9.3..9.x and 10.2+
        ((11, 10), True, True, False),
        ((13, 2), True, True, False),  # Windows Server 2022
        ((15, 4), True, True, False),
        ((15, 5), True, True, True),
        ((16, 0), True, True, True),
    ],
)
def test_features_from_hns_version(
    version: tuple[int, int], dsr: bool, ipv6: bool, modify: bool
) -> None:
    f = SupportedFeatures.from_version(*version)
    assert (f.dsr, f.ipv6_dual_stack, f.modify_load_balancer) == (dsr, ipv6, modify)


def test_guids() -> None:
    assert guids(["a", "b"], "x") == ("a", "b")
    with pytest.raises(SchemaError, match=r"x\[1\]"):
        guids(["a", 2], "x")
    with pytest.raises(SchemaError, match="list of IDs"):
        guids("a", "x")
