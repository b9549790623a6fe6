"""HcnClient over a fake computenetwork.dll (no Windows here).

The fake DLL is a table of Python functions made into ctypes callbacks of the very
prototypes :mod:`kubeproxy.dataplane.hns.hcn` declares, so the marshalling (GUIDs,
handles, wide strings written into out-pointers, CoTaskMemFree) runs for real. Behind
the table sits a :class:`FakeHns`: what HNS would answer comes from the strict fake, and
its errors come back as HRESULTs and error records the client must read.
"""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest

from kubeproxy.dataplane.hns import (
    Endpoint,
    HnsError,
    HnsErrorKind,
    LoadBalancer,
    Network,
    NetworkType,
    PortMapping,
    PortMappingFlags,
    SupportedFeatures,
)
from kubeproxy.dataplane.hns.client import (
    E_NOTIMPL,
    HCN_E_ENDPOINT_NOT_FOUND,
    HCN_E_PORT_ALREADY_EXISTS,
    HRESULT_ERROR_ALREADY_EXISTS,
    HRESULT_ERROR_NOT_FOUND,
)
from kubeproxy.dataplane.hns.fake import FakeHns
from kubeproxy.dataplane.hns.hcn import (
    GUID,
    PROTOTYPES,
    HcnCalls,
    HcnClient,
    error_from_record,
    query,
)

NET_ID = "c8a5e2a4-1f3b-4e4e-9a2a-0d1e2f3a4b5c"
POD = "11111111-1111-4111-8111-111111111111"
E_FAIL = 0x80004005
_DEFAULT_CODES = {
    HnsErrorKind.NOT_FOUND: HRESULT_ERROR_NOT_FOUND,
    HnsErrorKind.NOT_SUPPORTED: E_NOTIMPL,
}


def signed(code: int) -> int:
    return code - 2**32 if code >= 2**31 else code


class FakeDll:
    """computenetwork.dll, vmcompute.dll's HNSCall and ole32's CoTaskMemFree."""

    def __init__(self, hns: FakeHns, version: tuple[int, int] = (15, 5)) -> None:
        self.hns = hns
        self.version = version
        self.handles: dict[int, tuple[str, str]] = {}
        self.buffers: dict[int, Any] = {}
        self.given = 0
        self.freed: list[int] = []
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.crashes: list[BaseException] = []
        self.record_on_success: str | None = None  # an error record with S_OK
        self._keep: list[Any] = []

    def resolve(self, dll: str, name: str, proto: Any) -> Callable[..., Any]:
        assert PROTOTYPES[name][0] == dll
        method = getattr(self, name)

        def fn(*args: Any) -> Any:
            self.calls.append((name, args))
            try:
                return method(*args)
            except HnsError as err:
                return self._fail(args[-1], err)
            except BaseException as err:  # a bug of the fake or the client: the test fails
                self.crashes.append(err)
                return signed(E_FAIL)

        callback = proto(fn)
        self._keep.append(callback)
        return callback  # type: ignore[no-any-return]

    # --- plumbing ----------------------------------------------------------------------

    def _give(self, slot: Any, text: str) -> None:
        buf = ctypes.create_unicode_buffer(text)
        address = ctypes.addressof(buf)
        self.buffers[address] = buf
        self.given += 1
        slot[0] = address

    def _fail(self, slot: Any, err: HnsError) -> int:
        code = err.hresult or _DEFAULT_CODES.get(err.kind, E_FAIL)
        record = {"Success": False, "Error": str(err.args[0]) + " ", "ErrorCode": code}
        self._give(slot, json.dumps(record))
        return signed(code)

    def _ok(self, err_slot: Any) -> int:
        if self.record_on_success is not None:
            self._give(err_slot, self.record_on_success)
        return 0

    def _handle(self, slot: Any, kind: str, object_id: str) -> None:
        h = 0x1000 + len(self.calls)
        self.handles[h] = (kind, object_id)
        slot[0] = h

    def _object(self, handle: int, kind: str) -> str:
        held_kind, object_id = self.handles[handle]
        assert held_kind == kind
        return object_id

    def _close(self, handle: int, kind: str) -> int:
        self._object(handle, kind)
        del self.handles[handle]
        return 0

    @staticmethod
    def _filter(q: str) -> dict[str, str]:
        doc = json.loads(q)
        assert doc["SchemaVersion"] == {"Major": 2, "Minor": 0}
        return json.loads(doc["Filter"]) if "Filter" in doc else {}

    def _endpoint(self, endpoint_id: str) -> Endpoint:
        for ep in self.hns.list_endpoints():
            if ep.id == endpoint_id:
                return ep
        raise HnsError("The endpoint was not found", hresult=HCN_E_ENDPOINT_NOT_FOUND)

    def _lb(self, lb_id: str) -> LoadBalancer:
        for lb in self.hns.list_load_balancers():
            if lb.id == lb_id:
                return lb
        raise HnsError("Element not found.", hresult=HRESULT_ERROR_NOT_FOUND)

    # --- the functions -----------------------------------------------------------------

    def CoTaskMemFree(self, address: int) -> None:  # noqa: N802
        self.buffers.pop(address)  # a double free raises (and is recorded as a crash)
        self.freed.append(address)

    def HNSCall(self, method: str, path: str, request: str, out: Any) -> int:  # noqa: N802
        assert (method, path) == ("GET", "/globals/version")
        major, minor = self.version
        self._give(out, json.dumps({"Success": True, "Output": {"Major": major, "Minor": minor}}))
        return 0

    def HcnEnumerateNetworks(self, q: str, out: Any, err: Any) -> int:  # noqa: N802
        name = self._filter(q).get("Name")
        ids = [self.hns.network.id] if name in (None, self.hns.network.name) else []
        self._give(out, json.dumps(ids))
        return self._ok(err)

    def HcnOpenNetwork(self, guid: Any, out: Any, err: Any) -> int:  # noqa: N802
        if str(guid.contents) != self.hns.network.id:
            raise HnsError("The network was not found", hresult=0x803B0001)
        self._handle(out, "network", self.hns.network.id)
        return self._ok(err)

    def HcnQueryNetworkProperties(self, h: int, q: str, out: Any, err: Any) -> int:  # noqa: N802
        self._object(h, "network")
        self._give(out, json.dumps(self.hns.network.to_hcn()))
        return self._ok(err)

    def HcnCloseNetwork(self, h: int) -> int:  # noqa: N802
        return self._close(h, "network")

    def HcnEnumerateEndpoints(self, q: str, out: Any, err: Any) -> int:  # noqa: N802
        eps = self.hns.list_endpoints(self._filter(q).get("VirtualNetwork"))
        self._give(out, json.dumps([ep.id for ep in eps]))
        return self._ok(err)

    def HcnCreateEndpoint(  # noqa: N802
        self, network: int, guid: Any, settings: str, out: Any, err: Any
    ) -> int:
        assert str(guid.contents) == "00000000-0000-0000-0000-000000000000"
        doc = json.loads(settings)
        network_id = self._object(network, "network")
        assert doc["HostComputeNetwork"] == network_id
        created = self.hns.create_endpoint(network_id, Endpoint.from_hcn(doc))
        self._handle(out, "endpoint", created.id)
        return self._ok(err)

    def HcnOpenEndpoint(self, guid: Any, out: Any, err: Any) -> int:  # noqa: N802
        ep = self._endpoint(str(guid.contents))
        self._handle(out, "endpoint", ep.id)
        return self._ok(err)

    def HcnQueryEndpointProperties(self, h: int, q: str, out: Any, err: Any) -> int:  # noqa: N802
        self._give(out, json.dumps(self._endpoint(self._object(h, "endpoint")).to_hcn()))
        return self._ok(err)

    def HcnDeleteEndpoint(self, guid: Any, err: Any) -> int:  # noqa: N802
        self.hns.delete_endpoint(str(guid.contents))
        return self._ok(err)

    def HcnCloseEndpoint(self, h: int) -> int:  # noqa: N802
        return self._close(h, "endpoint")

    def HcnEnumerateLoadBalancers(self, q: str, out: Any, err: Any) -> int:  # noqa: N802
        assert self._filter(q) == {}
        self._give(out, json.dumps([lb.id for lb in self.hns.list_load_balancers()]))
        return self._ok(err)

    def HcnCreateLoadBalancer(self, guid: Any, settings: str, out: Any, err: Any) -> int:  # noqa: N802
        doc = json.loads(settings)
        assert "ID" not in doc and doc["SchemaVersion"] == {"Major": 2, "Minor": 0}
        created = self.hns.create_load_balancer(LoadBalancer.from_hcn(doc))
        self._handle(out, "lb", created.id)
        return self._ok(err)

    def HcnOpenLoadBalancer(self, guid: Any, out: Any, err: Any) -> int:  # noqa: N802
        self._handle(out, "lb", self._lb(str(guid.contents)).id)
        return self._ok(err)

    def HcnModifyLoadBalancer(self, h: int, settings: str, err: Any) -> int:  # noqa: N802
        self.hns.modify_load_balancer(
            self._object(h, "lb"), LoadBalancer.from_hcn(json.loads(settings))
        )
        return self._ok(err)

    def HcnQueryLoadBalancerProperties(self, h: int, q: str, out: Any, err: Any) -> int:  # noqa: N802
        self._give(out, json.dumps(self._lb(self._object(h, "lb")).to_hcn()))
        return self._ok(err)

    def HcnDeleteLoadBalancer(self, guid: Any, err: Any) -> int:  # noqa: N802
        self.hns.delete_load_balancer(str(guid.contents))
        return self._ok(err)

    def HcnCloseLoadBalancer(self, h: int) -> int:  # noqa: N802
        return self._close(h, "lb")


def setup(features: SupportedFeatures | None = None) -> tuple[HcnClient, FakeDll]:
    hns = FakeHns(
        Network("vxlan0", NET_ID, NetworkType.OVERLAY),
        endpoints=[Endpoint(("10.244.1.5",), "00-15-5d-52-c0-05", id=POD)],
        features=features or SupportedFeatures(dsr=True, modify_load_balancer=True),
        seed=3,
    )
    dll = FakeDll(hns)
    return HcnClient(resolve=dll.resolve), dll


def clean(dll: FakeDll) -> None:
    """Nothing crashed, every returned string was freed once, every handle closed."""
    assert dll.crashes == []
    assert dll.buffers == {} and len(dll.freed) == dll.given
    assert dll.handles == {}


def remote(ip: str) -> Endpoint:
    return Endpoint((ip,), "02-11-0a-f4-02-07", is_remote=True, provider_address="192.168.0.12")


def service_lb(*eps: str, port: int = 80) -> LoadBalancer:
    return LoadBalancer(
        (PortMapping(6, 8080, port, flags=PortMappingFlags.ILB),),
        ("10.96.0.10",),
        eps,
        source_vip="10.244.1.2",
    )


@pytest.mark.skipif(sys.platform == "win32", reason="the refusal is for other OSes")
def test_not_supported_off_windows() -> None:
    with pytest.raises(HnsError, match="not supported on this OS") as err:
        HcnClient()
    assert err.value.not_supported and err.value.tool == "hns"


def test_guid_layout_is_windows_s() -> None:
    g = GUID.parse("00112233-4455-6677-8899-AABBCCDDEEFF")
    assert (g.Data1, g.Data2, g.Data3) == (0x00112233, 0x4455, 0x6677)
    assert bytes(g.Data4) == bytes.fromhex("8899aabbccddeeff")
    assert str(g) == "00112233-4455-6677-8899-aabbccddeeff"
    with pytest.raises(HnsError, match="invalid ID") as err:
        GUID.parse("lb-1")
    assert err.value.kind is HnsErrorKind.INVALID


def test_query_document_is_hcsshim_s() -> None:
    assert query() == '{"SchemaVersion":{"Major":2,"Minor":0}}'
    assert json.loads(json.loads(query({"Name": "vxlan0"}))["Filter"]) == {"Name": "vxlan0"}


def test_network_endpoints_and_load_balancers_through_the_dll() -> None:
    client, dll = setup()
    net = client.get_network_by_name("vxlan0")
    assert (net.id, net.type) == (NET_ID, NetworkType.OVERLAY)
    ep = client.create_endpoint(NET_ID, remote("10.244.2.7"))
    assert ep.is_remote and ep.network_id == NET_ID and ep.provider_address == "192.168.0.12"
    assert {e.ip_address for e in client.list_endpoints(NET_ID)} == {"10.244.1.5", "10.244.2.7"}
    assert client.get_endpoint_by_ip("10.244.2.7", NET_ID.upper()) == ep

    made = client.create_load_balancer(service_lb(POD, ep.id))
    assert made.id and made == service_lb(POD, ep.id).with_id(made.id)
    assert client.list_load_balancers() == [made]
    changed = client.modify_load_balancer(made.id, service_lb(POD))
    assert changed.id == made.id and changed.endpoint_ids == (POD,)
    client.delete_load_balancer(made.id)
    client.delete_endpoint(ep.id)
    assert client.list_load_balancers() == [] and len(client.list_endpoints()) == 1
    assert client.supported_features() == SupportedFeatures.from_version(15, 5)
    clean(dll)


def test_the_documents_sent() -> None:
    client, dll = setup()
    client.create_load_balancer(service_lb(POD))
    (args,) = [a for name, a in dll.calls if name == "HcnCreateLoadBalancer"]
    assert json.loads(args[1]) == {
        "HostComputeEndpoints": [POD],
        "SourceVIP": "10.244.1.2",
        "FrontendVIPs": ["10.96.0.10"],
        "PortMappings": [{"Protocol": 6, "InternalPort": 8080, "ExternalPort": 80, "Flags": 1}],
        "SchemaVersion": {"Major": 2, "Minor": 0},
    }
    client.list_endpoints(NET_ID)
    (enum_args,) = [a for name, a in dll.calls if name == "HcnEnumerateEndpoints"]
    assert json.loads(json.loads(enum_args[0])["Filter"]) == {"VirtualNetwork": NET_ID}
    clean(dll)


def test_refusals_come_back_as_hns_errors() -> None:
    client, dll = setup()
    client.create_load_balancer(service_lb(POD))
    with pytest.raises(HnsError) as err:
        client.create_load_balancer(service_lb(POD))
    assert err.value.already_exists and err.value.hresult == HRESULT_ERROR_ALREADY_EXISTS
    assert err.value.operation == "HcnCreateLoadBalancer"
    assert "already has 10.96.0.10 TCP/80" in str(err.value)

    with pytest.raises(HnsError) as err:
        client.delete_load_balancer("2f9b4f0e-8d6a-4c1e-9a53-5d7c1e0f8a11")
    assert err.value.not_found

    with pytest.raises(HnsError) as err:
        client.get_network_by_name("cbr0")
    assert err.value.not_found and err.value.hresult is None

    with pytest.raises(HnsError) as err:
        client.get_endpoint_by_ip("10.244.9.9", NET_ID)
    assert err.value.not_found
    clean(dll)


def test_handles_are_closed_when_a_call_fails() -> None:
    client, dll = setup(SupportedFeatures())  # no ModifyLoadbalancer
    made = client.create_load_balancer(service_lb(POD))
    with pytest.raises(HnsError) as err:
        client.modify_load_balancer(made.id, service_lb(POD, port=81))
    assert err.value.not_supported and err.value.hresult == E_NOTIMPL
    with pytest.raises(HnsError) as err:
        client.create_endpoint(NET_ID, remote("10.244.1.5"))  # a pod has that IP
    assert err.value.already_exists
    clean(dll)


def test_an_error_record_with_s_ok_is_a_failure() -> None:
    client, dll = setup()
    dll.record_on_success = json.dumps(
        {"Success": False, "Error": "The specified port already exists. ", "ErrorCode": 2151350291}
    )
    with pytest.raises(HnsError, match="The specified port already exists") as err:
        client.create_load_balancer(service_lb(POD))
    assert err.value.hresult == HCN_E_PORT_ALREADY_EXISTS and err.value.already_exists
    dll.record_on_success = None
    clean(dll)


class AnswersNotAList(FakeDll):
    def HcnEnumerateLoadBalancers(self, q: str, out: Any, err: Any) -> int:  # noqa: N802
        self._give(out, '{"not": "a list"}')
        return 0


class HnsStopping(FakeDll):
    def HNSCall(self, method: str, path: str, request: str, out: Any) -> int:  # noqa: N802
        self._give(out, '{"Success":false,"Error":"HNS is stopping"}')
        return 0


def test_unreadable_answers_are_hns_errors() -> None:
    _, plain = setup()
    dll = AnswersNotAList(plain.hns)
    with pytest.raises(HnsError, match="expected a list of IDs"):
        HcnClient(resolve=dll.resolve).list_load_balancers()
    clean(dll)


def test_hns_version_query_failure() -> None:
    _, plain = setup()
    dll = HnsStopping(plain.hns)
    with pytest.raises(HnsError, match="HNS is stopping"):
        HcnClient(resolve=dll.resolve).supported_features()
    clean(dll)


@pytest.mark.parametrize(
    ("hresult", "record", "kind", "message", "code"),
    [
        (
            signed(0x803B0013),
            '{"Success":false,"Error":"The specified port already exists. ",'
            '"ErrorCode":2151350291}',
            HnsErrorKind.ALREADY_EXISTS,
            "The specified port already exists.",
            0x803B0013,
        ),
        (
            signed(0x803B001C),
            '{"Success":false,"Error":"The reference is invalid in the JSON document. '
            'A Reference is required","ErrorCode":2151350300}',
            HnsErrorKind.INVALID,
            "A Reference is required",
            0x803B001C,
        ),
        (signed(0x800700B7), None, HnsErrorKind.ALREADY_EXISTS, "0x800700b7", 0x800700B7),
        (signed(0x80070490), "Element not found.", HnsErrorKind.NOT_FOUND, "Element", 0x80070490),
        (signed(0x80004005), "", HnsErrorKind.FAILED, "failed with HRESULT", 0x80004005),
    ],
)
def test_error_from_record(
    hresult: int, record: str | None, kind: HnsErrorKind, message: str, code: int
) -> None:
    err = error_from_record("HcnCreateLoadBalancer", hresult, record)
    assert err.kind is kind and err.hresult == code and message in str(err)
    assert str(err).startswith("HcnCreateLoadBalancer: ")


def test_every_prototype_is_resolved_once() -> None:
    seen: list[tuple[str, str]] = []

    def resolve(dll: str, name: str, proto: Any) -> Callable[..., Any]:
        seen.append((dll, name))
        return lambda *args: 0

    HcnCalls(resolve)
    assert sorted(seen) == sorted((dll, name) for name, (dll, _) in PROTOTYPES.items())
