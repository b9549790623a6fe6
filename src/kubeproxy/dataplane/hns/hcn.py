"""HNS over computenetwork.dll (the HCN v2 C API), through ctypes.

Nothing here has run on Windows. The function signatures are those hcsshim/hnslib's
``hcn`` package declares for computenetwork.dll (``hcn.go``'s ``//sys`` lines) and the
HCN reference at learn.microsoft.com; on Linux they are exercised against a fake DLL
(tests/unit/test_hns_hcn.py), which checks the marshalling, the documents and the
error handling, not HNS.

* :data:`PROTOTYPES` — each function: its DLL, its argument types; every one returns
  an HRESULT. Strings HCN returns (a result document, an error record) are allocated
  with CoTaskMemAlloc; :class:`HcnCalls` reads each one and frees it with ole32's
  ``CoTaskMemFree``, success or not.
* :class:`HcnCalls` — the calls, typed for Python: GUIDs in, handles and documents out,
  and a failed call (an HRESULT below zero, or a non-empty error record, as hcsshim's
  ``checkForErrors`` decides) raised as :class:`HnsError` read from the error record
  (``{"Success": false, "Error": "...", "ErrorCode": <HRESULT>}``) by
  :func:`error_from_record`.
* :class:`HcnClient` — :class:`~kubeproxy.dataplane.hns.client.Hns` over them: the
  queries (``{"SchemaVersion": {"Major": 2, "Minor": 0}, "Filter": "<JSON>"}``; the
  endpoints of a network are filtered by ``VirtualNetwork``, as hcsshim does), open,
  query, close (a handle handed out by a call that then reports an error is closed
  too); create and modify send the schema's documents. Supported features come
  from the HNS version (vmcompute.dll's ``HNSCall("GET", "/globals/version")``, as
  hnslib does), mapped by :meth:`SupportedFeatures.from_version`.

Importing this module works anywhere; :class:`HcnClient()` loads the DLLs and, on any
other OS than Windows, raises :class:`HnsError` (NOT_SUPPORTED) instead. Tests construct
it with a ``resolve`` function that hands out fake functions of the same prototypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any

from kubeproxy.dataplane.hns.client import HnsError, HnsErrorKind, kind_of
from kubeproxy.dataplane.hns.schema import (
    SCHEMA_VERSION,
    Endpoint,
    LoadBalancer,
    Network,
    SchemaError,
    SupportedFeatures,
    guids,
)

HRESULT = ctypes.c_int32
HANDLE = ctypes.c_void_p
OUT_STR = ctypes.POINTER(ctypes.c_void_p)  # PWSTR*: a CoTaskMem string is written here
OUT_HANDLE = ctypes.POINTER(ctypes.c_void_p)


class GUID(ctypes.Structure):
    _fields_ = (
        ("Data1", ctypes.c_uint32),
        ("Data2", ctypes.c_uint16),
        ("Data3", ctypes.c_uint16),
        ("Data4", ctypes.c_ubyte * 8),
    )

    @classmethod
    def parse(cls, text: str) -> GUID:
        """A GUID from its string form; HnsError (INVALID) if it is not one."""
        try:
            raw = uuid.UUID(text).bytes_le  # Data1..3 little-endian, as Windows lays them
        except ValueError:
            raise HnsError(f"invalid ID {text!r}", kind=HnsErrorKind.INVALID) from None
        return cls.from_buffer_copy(raw)

    def __str__(self) -> str:
        return str(uuid.UUID(bytes_le=bytes(self)))


P_GUID = ctypes.POINTER(GUID)
WSTR = ctypes.c_wchar_p

# name: (DLL, argument types). Every function returns an HRESULT but CoTaskMemFree.
PROTOTYPES: dict[str, tuple[str, tuple[Any, ...]]] = {
    "HcnEnumerateNetworks": ("computenetwork", (WSTR, OUT_STR, OUT_STR)),
    "HcnOpenNetwork": ("computenetwork", (P_GUID, OUT_HANDLE, OUT_STR)),
    "HcnQueryNetworkProperties": ("computenetwork", (HANDLE, WSTR, OUT_STR, OUT_STR)),
    "HcnCloseNetwork": ("computenetwork", (HANDLE,)),
    "HcnEnumerateEndpoints": ("computenetwork", (WSTR, OUT_STR, OUT_STR)),
    "HcnCreateEndpoint": ("computenetwork", (HANDLE, P_GUID, WSTR, OUT_HANDLE, OUT_STR)),
    "HcnOpenEndpoint": ("computenetwork", (P_GUID, OUT_HANDLE, OUT_STR)),
    "HcnQueryEndpointProperties": ("computenetwork", (HANDLE, WSTR, OUT_STR, OUT_STR)),
    "HcnDeleteEndpoint": ("computenetwork", (P_GUID, OUT_STR)),
    "HcnCloseEndpoint": ("computenetwork", (HANDLE,)),
    "HcnEnumerateLoadBalancers": ("computenetwork", (WSTR, OUT_STR, OUT_STR)),
    "HcnCreateLoadBalancer": ("computenetwork", (P_GUID, WSTR, OUT_HANDLE, OUT_STR)),
    "HcnOpenLoadBalancer": ("computenetwork", (P_GUID, OUT_HANDLE, OUT_STR)),
    "HcnModifyLoadBalancer": ("computenetwork", (HANDLE, WSTR, OUT_STR)),
    "HcnQueryLoadBalancerProperties": ("computenetwork", (HANDLE, WSTR, OUT_STR, OUT_STR)),
    "HcnDeleteLoadBalancer": ("computenetwork", (P_GUID, OUT_STR)),
    "HcnCloseLoadBalancer": ("computenetwork", (HANDLE,)),
    "HNSCall": ("vmcompute", (WSTR, WSTR, WSTR, OUT_STR)),
    "CoTaskMemFree": ("ole32", (ctypes.c_void_p,)),
}

# WINFUNCTYPE is stdcall on 32-bit Windows and the one convention on x64; elsewhere the
# tests' fake functions are C-convention callbacks of the same shape.
_FUNCTYPE: Any = getattr(ctypes, "WINFUNCTYPE", ctypes.CFUNCTYPE)

Resolve = Callable[[str, str, Any], Callable[..., Any]]
"""``resolve(dll, name, prototype)``: the function ``name`` of ``dll`` as ``prototype``."""


def prototype(name: str) -> Any:
    """The ctypes function type of ``name``."""
    _, args = PROTOTYPES[name]
    return _FUNCTYPE(None if name == "CoTaskMemFree" else HRESULT, *args)


def _windows_resolve() -> Resolve:
    if sys.platform != "win32":
        raise HnsError(
            f"HNS is not supported on this OS ({sys.platform}): the kernelspace mode needs Windows",
            kind=HnsErrorKind.NOT_SUPPORTED,
        )
    win_dll: Any = getattr(ctypes, "WinDLL")  # noqa: B009 (absent from ctypes off Windows)
    loaded: dict[str, Any] = {}

    def resolve(dll: str, name: str, proto: Any) -> Callable[..., Any]:
        if dll not in loaded:
            try:
                loaded[dll] = win_dll(f"{dll}.dll")
            except OSError as err:
                raise HnsError(
                    f"cannot load {dll}.dll ({err}): HCN needs Windows Server 2019 or later",
                    kind=HnsErrorKind.NOT_SUPPORTED,
                ) from None
        fn: Callable[..., Any] = proto((name, loaded[dll]))
        return fn

    return resolve


def error_from_record(operation: str, hresult: int, record: str | None) -> HnsError:
    """The HnsError of a failed call: HNS's error record (JSON with ``Error`` and
    ``ErrorCode``, or plain text) and its HRESULT (the record's ``ErrorCode`` when the
    call itself returned S_OK with a record)."""
    message = ""
    code = hresult & 0xFFFFFFFF
    if record:
        try:
            doc = json.loads(record)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            message = str(doc.get("Error") or "").strip()
            record_code = doc.get("ErrorCode")
            if not code and isinstance(record_code, int):
                code = record_code & 0xFFFFFFFF
        else:
            message = record.strip()
    if not message:
        message = "failed" if not code else f"failed with HRESULT {code:#010x}"
    return HnsError(message, kind=kind_of(code), operation=operation, hresult=code or None)


class HcnCalls:
    """The HCN functions, resolved once, with the string and error handling of each call."""

    def __init__(self, resolve: Resolve) -> None:
        self._fns = {
            name: resolve(dll, name, prototype(name)) for name, (dll, _) in PROTOTYPES.items()
        }

    def _take(self, slot: ctypes.c_void_p) -> str | None:
        """The CoTaskMem string written in ``slot``, freed."""
        address = slot.value
        if not address:
            return None
        try:
            return ctypes.wstring_at(address)
        finally:
            self._fns["CoTaskMemFree"](address)
            slot.value = None

    def call(self, name: str, *args: Any, out: int = 0) -> list[str | None]:
        """Calls ``name`` with ``args``, then ``out`` string slots, then the error-record
        slot; returns the ``out`` strings; raises HnsError when the call failed."""
        slots = [ctypes.c_void_p() for _ in range(out + 1)]
        hr = self._fns[name](*args, *(ctypes.byref(s) for s in slots))
        results = [self._take(s) for s in slots]
        record = results.pop()
        if hr < 0 or record:
            raise error_from_record(name, hr, record)
        return results

    def close(self, name: str, handle: ctypes.c_void_p) -> None:
        hr = self._fns[name](handle)
        if hr < 0:
            raise error_from_record(name, hr, None)

    def hns_call(self, method: str, path: str, request: str = "") -> str:
        """vmcompute.dll's HNSCall (the v1 API): the response document."""
        slot = ctypes.c_void_p()
        hr = self._fns["HNSCall"](method, path, request, ctypes.byref(slot))
        response = self._take(slot)
        if hr < 0:
            raise error_from_record("HNSCall", hr, response)
        return response or ""


def query(filter_: dict[str, str] | None = None) -> str:
    """An HCN query document, as hcsshim's ``defaultQuery`` marshals it."""
    doc: dict[str, Any] = {"SchemaVersion": dict(SCHEMA_VERSION)}
    if filter_:
        doc["Filter"] = json.dumps(filter_, separators=(",", ":"))
    return json.dumps(doc, separators=(",", ":"))


def _json(text: str | None, what: str) -> Any:
    try:
        return json.loads(text or "")
    except ValueError:
        raise HnsError(f"unreadable {what}: {text!r}", kind=HnsErrorKind.FAILED) from None


_KINDS = {
    "Network": ("HcnOpenNetwork", "HcnQueryNetworkProperties", "HcnCloseNetwork"),
    "Endpoint": ("HcnOpenEndpoint", "HcnQueryEndpointProperties", "HcnCloseEndpoint"),
    "LoadBalancer": (
        "HcnOpenLoadBalancer",
        "HcnQueryLoadBalancerProperties",
        "HcnCloseLoadBalancer",
    ),
}


class HcnClient:
    """:class:`~kubeproxy.dataplane.hns.client.Hns` over computenetwork.dll."""

    def __init__(self, resolve: Resolve | None = None) -> None:
        self.calls = HcnCalls(resolve if resolve is not None else _windows_resolve())

    # --- generic steps -----------------------------------------------------------------

    def _enumerate(self, name: str, filter_: dict[str, str] | None) -> tuple[str, ...]:
        (text,) = self.calls.call(name, query(filter_), out=1)
        try:
            return guids(_json(text, f"{name} answer"), name)
        except SchemaError as err:
            raise HnsError(str(err), kind=HnsErrorKind.FAILED, operation=name) from None

    def _open(self, name: str, close_fn: str, handle: ctypes.c_void_p, *args: Any) -> None:
        """Calls ``name`` (an open or create) writing ``handle``; when it fails after
        handing out a handle (an error record with S_OK), closes that handle."""
        try:
            self.calls.call(name, *args, ctypes.byref(handle))
        except HnsError:
            if handle.value:
                with contextlib.suppress(HnsError):
                    self.calls.close(close_fn, handle)
            raise

    def _properties(self, kind: str, handle: ctypes.c_void_p) -> Any:
        _, query_fn, _ = _KINDS[kind]
        (text,) = self.calls.call(query_fn, handle, query(), out=1)
        return _json(text, f"{kind} properties")

    def _get(self, kind: str, object_id: str) -> Any:
        open_fn, _, close_fn = _KINDS[kind]
        handle = ctypes.c_void_p()
        self._open(open_fn, close_fn, handle, ctypes.byref(GUID.parse(object_id)))
        try:
            doc = self._properties(kind, handle)
        finally:
            self.calls.close(close_fn, handle)
        return doc

    @staticmethod
    def _read(cls_: Any, doc: Any, operation: str) -> Any:
        try:
            return cls_.from_hcn(doc)
        except SchemaError as err:
            raise HnsError(f"unreadable answer: {err}", operation=operation) from None

    # --- Hns ---------------------------------------------------------------------------

    def get_network_by_name(self, name: str) -> Network:
        ids = self._enumerate("HcnEnumerateNetworks", {"Name": name})
        if not ids:
            raise HnsError(
                f"network {name!r} not found",
                kind=HnsErrorKind.NOT_FOUND,
                operation="get_network_by_name",
            )
        network: Network = self._read(Network, self._get("Network", ids[0]), "HcnOpenNetwork")
        return network

    def list_endpoints(self, network_id: str | None = None) -> list[Endpoint]:
        filter_ = {"VirtualNetwork": network_id} if network_id else None
        return [
            self._read(Endpoint, self._get("Endpoint", i), "HcnQueryEndpointProperties")
            for i in self._enumerate("HcnEnumerateEndpoints", filter_)
        ]

    def get_endpoint_by_ip(self, ip: str, network_id: str) -> Endpoint:
        for ep in self.list_endpoints():
            if ep.network_id.lower() == network_id.lower() and ip in ep.ip_addresses:
                return ep
        raise HnsError(
            f"no endpoint with IP {ip} on network {network_id}",
            kind=HnsErrorKind.NOT_FOUND,
            operation="get_endpoint_by_ip",
        )

    def create_endpoint(self, network_id: str, endpoint: Endpoint) -> Endpoint:
        settings = json.dumps(endpoint.with_identity("", network_id).to_hcn())
        network = ctypes.c_void_p()
        self.calls.call(
            "HcnOpenNetwork", ctypes.byref(GUID.parse(network_id)), ctypes.byref(network)
        )
        try:
            handle = ctypes.c_void_p()
            self._open(
                "HcnCreateEndpoint",
                "HcnCloseEndpoint",
                handle,
                network,
                ctypes.byref(GUID()),  # the null GUID: HNS chooses the ID
                settings,
            )
            try:
                doc = self._properties("Endpoint", handle)
            finally:
                self.calls.close("HcnCloseEndpoint", handle)
        finally:
            self.calls.close("HcnCloseNetwork", network)
        created: Endpoint = self._read(Endpoint, doc, "HcnCreateEndpoint")
        return created

    def delete_endpoint(self, endpoint_id: str) -> None:
        self.calls.call("HcnDeleteEndpoint", ctypes.byref(GUID.parse(endpoint_id)))

    def list_load_balancers(self) -> list[LoadBalancer]:
        return [
            self._read(LoadBalancer, self._get("LoadBalancer", i), "HcnQueryLoadBalancerProperties")
            for i in self._enumerate("HcnEnumerateLoadBalancers", None)
        ]

    def create_load_balancer(self, lb: LoadBalancer) -> LoadBalancer:
        settings = json.dumps(lb.with_id("").to_hcn())
        handle = ctypes.c_void_p()
        self._open(
            "HcnCreateLoadBalancer", "HcnCloseLoadBalancer", handle, ctypes.byref(GUID()), settings
        )
        try:
            doc = self._properties("LoadBalancer", handle)
        finally:
            self.calls.close("HcnCloseLoadBalancer", handle)
        created: LoadBalancer = self._read(LoadBalancer, doc, "HcnCreateLoadBalancer")
        return created

    def modify_load_balancer(self, lb_id: str, lb: LoadBalancer) -> LoadBalancer:
        settings = json.dumps(lb.with_id("").to_hcn())
        handle = ctypes.c_void_p()
        guid = GUID.parse(lb_id)
        self._open("HcnOpenLoadBalancer", "HcnCloseLoadBalancer", handle, ctypes.byref(guid))
        try:
            self.calls.call("HcnModifyLoadBalancer", handle, settings)
            doc = self._properties("LoadBalancer", handle)
        finally:
            self.calls.close("HcnCloseLoadBalancer", handle)
        modified: LoadBalancer = self._read(LoadBalancer, doc, "HcnModifyLoadBalancer")
        return modified

    def delete_load_balancer(self, lb_id: str) -> None:
        self.calls.call("HcnDeleteLoadBalancer", ctypes.byref(GUID.parse(lb_id)))

    def supported_features(self) -> SupportedFeatures:
        response = _json(self.calls.hns_call("GET", "/globals/version"), "HNSCall answer")
        if not isinstance(response, dict) or not response.get("Success"):
            error = response.get("Error", response) if isinstance(response, dict) else response
            raise HnsError(f"HNS version query failed: {error}", operation="HNSCall")
        version = response.get("Output")
        if not isinstance(version, dict):
            raise HnsError(f"HNS version unreadable: {version!r}", operation="HNSCall")
        major, minor = version.get("Major"), version.get("Minor")
        if not isinstance(major, int) or not isinstance(minor, int):
            raise HnsError(f"HNS version unreadable: {version!r}", operation="HNSCall")
        return SupportedFeatures.from_version(major, minor)
