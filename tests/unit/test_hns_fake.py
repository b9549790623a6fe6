"""The strict HNS fake: what it refuses, its reference counts, failure injection, the
operation log, the golden state, and the ``--hns-state`` file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.hns import (
    Distribution,
    Endpoint,
    Hns,
    HnsError,
    HnsErrorKind,
    LoadBalancer,
    LoadBalancerFlags,
    Network,
    NetworkType,
    PortMapping,
    PortMappingFlags,
    SupportedFeatures,
)
from kubeproxy.dataplane.hns.client import (
    HCN_E_ENTITY_HAS_REFERENCES,
    HCN_E_INVALID_JSON_REFERENCE,
    HRESULT_ERROR_ALREADY_EXISTS,
)
from kubeproxy.dataplane.hns.fake import FakeHns, StateFileError, load_state, state_from_doc

DATA = Path(__file__).parent / "data" / "hns"
NET = Network("vxlan0", "net-1", NetworkType.OVERLAY, "192.168.0.11")
ALL = SupportedFeatures(dsr=True, modify_load_balancer=True, ipv6_dual_stack=True)


def fake(features: SupportedFeatures = ALL, **kw: object) -> FakeHns:
    pod = Endpoint(("10.244.1.5",), "00-15-5d-52-c0-05", id="pod-a")
    pod6 = Endpoint(("fd00::5",), id="pod-a6")
    return FakeHns(NET, endpoints=[pod, pod6], features=features, seed=7, **kw)  # type: ignore[arg-type]


def remote(ip: str) -> Endpoint:
    return Endpoint((ip,), "02-11-0a-f4-02-07", is_remote=True, provider_address="192.168.0.12")


def lb(
    vip: str = "10.96.0.10", port: int = 80, *eps: str, proto: int = 6, **kw: object
) -> LoadBalancer:
    return LoadBalancer(
        (PortMapping(proto, 8080, port, flags=PortMappingFlags.ILB),),
        frontend_vips=(vip,) if vip else (),
        endpoint_ids=eps or ("pod-a",),
        **kw,  # type: ignore[arg-type]
    )


def refused(kind: HnsErrorKind, err: pytest.ExceptionInfo[HnsError]) -> None:
    assert err.value.kind is kind, err.value


def test_is_an_hns_and_errors_are_dataplane_errors() -> None:
    hns: Hns = fake()
    with pytest.raises(DataplaneError) as err:
        hns.get_network_by_name("other")
    assert isinstance(err.value, HnsError) and err.value.tool == "hns" and err.value.not_found


def test_network_and_endpoints() -> None:
    f = fake()
    assert f.get_network_by_name("vxlan0") is NET
    assert {e.id for e in f.list_endpoints("NET-1")} == {"pod-a", "pod-a6"}
    assert f.list_endpoints("other") == []
    assert f.get_endpoint_by_ip("10.244.1.5", "net-1").id == "pod-a"
    with pytest.raises(HnsError) as err:
        f.get_endpoint_by_ip("10.244.9.9", "net-1")
    refused(HnsErrorKind.NOT_FOUND, err)


def test_create_remote_endpoint_gets_an_id_and_the_network() -> None:
    f = fake()
    ep = f.create_endpoint("net-1", remote("10.244.2.7"))
    assert ep.id and ep.network_id == "net-1" and ep.is_remote
    assert f.get_endpoint_by_ip("10.244.2.7", "net-1") == ep
    with pytest.raises(HnsError) as err:
        f.create_endpoint("net-2", remote("10.244.2.8"))
    refused(HnsErrorKind.NOT_FOUND, err)


def test_ids_are_deterministic_with_a_seed() -> None:
    a, b = fake(), fake()
    assert a.create_endpoint("net-1", remote("10.244.2.7")).id == (
        b.create_endpoint("net-1", remote("10.244.2.7")).id
    )


def test_duplicate_endpoint_ip_refused_without_ref_tracking() -> None:
    f = fake()
    f.create_endpoint("net-1", remote("10.244.2.7"))
    with pytest.raises(HnsError) as err:
        f.create_endpoint("net-1", remote("10.244.2.7"))
    refused(HnsErrorKind.ALREADY_EXISTS, err)
    assert err.value.hresult == HRESULT_ERROR_ALREADY_EXISTS
    with pytest.raises(HnsError, match=r"endpoint pod-a already has IP 10\.244\.1\.5"):
        f.create_endpoint("net-1", remote("10.244.1.5"))  # a pod's IP


def test_shared_remote_endpoints_are_reference_counted() -> None:
    f = fake(track_refs=True)
    first = f.create_endpoint("net-1", remote("10.244.2.7"))
    again = f.create_endpoint("net-1", remote("10.244.2.7"))
    assert again.id == first.id and f.ref_count(first.id) == 2
    f.delete_endpoint(first.id)
    assert f.ref_count(first.id) == 1 and f.list_endpoints("net-1").count(first) == 1
    f.delete_endpoint(first.id)
    assert f.ref_count(first.id) == 0
    with pytest.raises(HnsError) as err:
        f.delete_endpoint(first.id)
    refused(HnsErrorKind.NOT_FOUND, err)


def test_pod_endpoints_are_not_deleted() -> None:
    with pytest.raises(HnsError, match="fake: endpoint pod-a is a pod's"):
        fake().delete_endpoint("pod-a")


def test_endpoint_in_use_by_a_load_balancer_is_not_deleted() -> None:
    f = fake()
    ep = f.create_endpoint("net-1", remote("10.244.2.7"))
    made = f.create_load_balancer(lb("10.96.0.10", 80, ep.id))
    with pytest.raises(HnsError) as err:
        f.delete_endpoint(ep.id)
    assert err.value.hresult == HCN_E_ENTITY_HAS_REFERENCES
    f.delete_load_balancer(made.id)
    f.delete_endpoint(ep.id)


def test_duplicate_frontend_refused() -> None:
    f = fake()
    first = f.create_load_balancer(lb("10.96.0.10", 80))
    assert first.id and f.list_load_balancers() == [first]
    with pytest.raises(HnsError) as err:
        f.create_load_balancer(lb("10.96.0.10", 80, source_vip="10.244.1.2"))
    refused(HnsErrorKind.ALREADY_EXISTS, err)
    assert "10.96.0.10 TCP/80" in str(err.value)
    # another port, protocol or VIP is another frontend
    f.create_load_balancer(lb("10.96.0.10", 81))
    f.create_load_balancer(lb("10.96.0.10", 80, proto=17))
    f.create_load_balancer(lb("10.96.0.11", 80))
    assert len(f.list_load_balancers()) == 4


def test_nodeport_load_balancer_is_one_per_protocol_and_port() -> None:
    f = fake()
    f.create_load_balancer(lb("", 30080))
    with pytest.raises(HnsError) as err:
        f.create_load_balancer(lb("", 30080))
    refused(HnsErrorKind.ALREADY_EXISTS, err)
    assert "(node ports) TCP/30080" in str(err.value)
    f.create_load_balancer(lb("", 30080, proto=17))
    f.create_load_balancer(lb("10.96.0.10", 30080))  # a VIP on that port is another


def test_unknown_endpoint_and_internal_port_zero_refused() -> None:
    f = fake()
    with pytest.raises(HnsError) as err:
        f.create_load_balancer(lb("10.96.0.10", 80, "nope"))
    refused(HnsErrorKind.INVALID, err)
    assert err.value.hresult == HCN_E_INVALID_JSON_REFERENCE
    zero = LoadBalancer((PortMapping(6, 0, 80),), ("10.96.0.10",), ("pod-a",))
    with pytest.raises(HnsError, match="internal port"):
        f.create_load_balancer(zero)
    with pytest.raises(HnsError, match="listed twice"):
        f.create_load_balancer(lb("10.96.0.10", 80, "pod-a", "pod-a"))


@pytest.mark.parametrize(
    ("features", "flags", "distribution", "missing"),
    [
        (SupportedFeatures(), LoadBalancerFlags.DSR, Distribution.NONE, "DSR"),
        (SupportedFeatures(), LoadBalancerFlags.IPV6, Distribution.NONE, "IPv6DualStack"),
        (
            SupportedFeatures(session_affinity=False),
            LoadBalancerFlags.NONE,
            Distribution.SOURCE_IP,
            "SessionAffinity",
        ),
    ],
)
def test_features_are_required(
    features: SupportedFeatures,
    flags: LoadBalancerFlags,
    distribution: Distribution,
    missing: str,
) -> None:
    f = fake(features)
    v6 = bool(flags & LoadBalancerFlags.IPV6)
    want = LoadBalancer(
        (PortMapping(6, 8080, 80, distribution),),
        ("fd00::10" if v6 else "10.96.0.10",),
        ("pod-a6" if v6 else "pod-a",),
        flags=flags,
    )
    with pytest.raises(HnsError, match=missing) as err:
        f.create_load_balancer(want)
    refused(HnsErrorKind.NOT_SUPPORTED, err)
    assert f.list_load_balancers() == []
    assert fake(ALL).create_load_balancer(want).id


def test_family_must_match_the_ipv6_flag() -> None:
    f = fake()
    with pytest.raises(HnsError, match="fake: fd00::10"):
        f.create_load_balancer(lb("fd00::10", 80, "pod-a6"))
    with pytest.raises(HnsError, match="no IPv6 address"):
        f.create_load_balancer(lb("fd00::10", 80, "pod-a", flags=LoadBalancerFlags.IPV6))
    ok = f.create_load_balancer(lb("fd00::10", 80, "pod-a6", flags=LoadBalancerFlags.IPV6))
    assert ok.flags == LoadBalancerFlags.IPV6


def test_modify_needs_the_feature_and_keeps_the_id() -> None:
    f = fake(SupportedFeatures())
    made = f.create_load_balancer(lb("10.96.0.10", 80))
    with pytest.raises(HnsError) as err:
        f.modify_load_balancer(made.id, lb("10.96.0.10", 80, "pod-a"))
    refused(HnsErrorKind.NOT_SUPPORTED, err)

    g = fake()
    made = g.create_load_balancer(lb("10.96.0.10", 80))
    other = g.create_load_balancer(lb("10.96.0.11", 80))
    ep = g.create_endpoint("net-1", remote("10.244.2.7"))
    changed = g.modify_load_balancer(made.id, lb("10.96.0.10", 80, "pod-a", ep.id))
    assert changed.id == made.id and changed.endpoint_ids == ("pod-a", ep.id)
    assert sorted(x.id for x in g.list_load_balancers()) == sorted([made.id, other.id])
    with pytest.raises(HnsError) as err:  # onto another's frontend
        g.modify_load_balancer(made.id, lb("10.96.0.11", 80))
    refused(HnsErrorKind.ALREADY_EXISTS, err)
    with pytest.raises(HnsError) as err:
        g.modify_load_balancer("nope", lb())
    refused(HnsErrorKind.NOT_FOUND, err)


def test_delete_unknown_load_balancer() -> None:
    with pytest.raises(HnsError) as err:
        fake().delete_load_balancer("nope")
    refused(HnsErrorKind.NOT_FOUND, err)


def test_failure_injection_and_log() -> None:
    f = fake()
    f.fail_next("create_load_balancer", 2)
    for _ in range(2):
        with pytest.raises(HnsError, match="injected"):
            f.create_load_balancer(lb())
    assert f.list_load_balancers() == []
    made = f.create_load_balancer(lb())
    custom = HnsError("gone", kind=HnsErrorKind.FAILED, incomplete=True)
    f.fail_next("delete_load_balancer", error=custom)
    with pytest.raises(HnsError) as err:
        f.delete_load_balancer(made.id)
    assert err.value is custom and err.value.incomplete
    f.delete_load_balancer(made.id)
    assert [(c.operation, c.outcome) for c in f.log] == [
        ("create_load_balancer", "injected failed"),
        ("create_load_balancer", "injected failed"),
        ("list_load_balancers", "ok"),
        ("create_load_balancer", "ok"),
        ("delete_load_balancer", "injected failed"),
        ("delete_load_balancer", "ok"),
    ]
    assert f.calls("create_load_balancer")[2].detail == "10.96.0.10 TCP/80->8080"
    with pytest.raises(ValueError, match="unknown operation"):
        f.fail_next("create_lb")


def test_state_golden_from_the_state_file() -> None:
    f = load_state(DATA / "overlay-state.json", seed=1, track_refs=True)
    assert f.supported_features().dsr and not f.supported_features().modify_load_balancer
    ep = f.create_endpoint(f.network.id, remote("10.244.2.7"))
    f.create_endpoint(f.network.id, remote("10.244.2.7"))
    local = "11111111-1111-4111-8111-111111111111"
    f.create_load_balancer(
        LoadBalancer(
            (PortMapping(6, 8080, 80, flags=PortMappingFlags.ILB | PortMappingFlags.PRESERVE_DIP),),
            ("10.96.0.10",),
            (ep.id, local),
            source_vip="10.244.1.2",
            flags=LoadBalancerFlags.DSR,
        )
    )
    f.create_load_balancer(LoadBalancer((PortMapping(17, 53, 30053),), (), (local,)))
    got = f.state()
    assert json.loads(json.dumps(got)) == got
    golden = DATA / "overlay-state.golden.json"
    assert got == json.loads(golden.read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("network"), "network: missing"),
        (lambda d: d.update(extra=1), "extra: unknown field"),
        (lambda d: d["network"].update(type="NAT"), "network.type: 'NAT'"),
        (lambda d: d["network"].pop("id"), "network.id: missing"),
        (lambda d: d["network"].update(managementIP="x"), "network.managementIP: 'x'"),
        (
            lambda d: d["network"]["remoteSubnets"][0].update(providerAddress="1.2.3"),
            r"network.remoteSubnets\[0\].providerAddress: '1.2.3'",
        ),
        (
            lambda d: d["network"]["remoteSubnets"][0].update(isolationId=70000),
            r"remoteSubnets\[0\].isolationId",
        ),
        (lambda d: d["endpoints"][1].update(isLocal="yes"), r"endpoints\[1\].isLocal"),
        (lambda d: d["endpoints"][1].update(ipAddress="10.244.1.5"), "also endpoints"),
        (lambda d: d["endpoints"][0].update(macAddress="zz"), r"endpoints\[0\].macAddress"),
        (lambda d: d["endpoints"][0].update(isRemote=True), "isRemote: unknown field"),
        (lambda d: d["supportedFeatures"].update(DSR=1), "supportedFeatures.DSR"),
        (lambda d: d["supportedFeatures"].update(L4Proxy=True), "L4Proxy: unknown"),
    ],
)
def test_state_file_errors_name_the_field(change: object, message: str) -> None:
    doc = json.loads((DATA / "overlay-state.json").read_text())
    change(doc)  # type: ignore[operator]
    with pytest.raises(StateFileError, match=f"^state.json: .*{message}"):
        state_from_doc(doc, source="state.json")


def test_state_file_unreadable(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="cannot read"):
        load_state(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(StateFileError, match="not JSON"):
        load_state(bad)


def test_minimal_state_file() -> None:
    f = state_from_doc({"network": {"name": "cbr0", "id": "n", "type": "L2Bridge"}})
    assert f.network.type is NetworkType.L2BRIDGE and f.list_endpoints() == []
    assert f.supported_features() == SupportedFeatures()
