"""The HNS interface the Windows kernelspace backend uses, and its error.

Nothing here has run on Windows.

:class:`Hns` is the small set of operations upstream's winkernel proxier performs
(``pkg/proxy/winkernel/hns.go``'s ``HostNetworkService`` over hnslib's ``hcn``):
the network by name, the endpoints (of a network; one by IP), creating and deleting
endpoints (kube-proxy creates the remote endpoints of other nodes' pods, and the source
VIP endpoint), listing, creating, modifying and deleting load balancers, and the
supported features. :class:`kubeproxy.dataplane.hns.hcn.HcnClient` implements it over
computenetwork.dll; :class:`kubeproxy.dataplane.hns.fake.FakeHns` is the strict fake.

:class:`HnsError` is the one error of both. ``kind`` says what a caller needs to decide:
``NOT_FOUND`` (a network, endpoint or load balancer that is not there), ``ALREADY_EXISTS``
(a load balancer with the frontend VIP, protocol and external port of another one; an
endpoint with an IP that has one), ``NOT_SUPPORTED`` (this host's HNS lacks the feature,
or this OS is not Windows), ``INVALID`` (HNS refused the document) and ``FAILED``
(anything else). ``hresult`` is HNS's code when there was one; :func:`kind_of` maps the
codes listed at learn.microsoft.com "HCN Error Code" (and the Win32 codes HNS answers
with) to a kind.
"""

from __future__ import annotations

import enum
from typing import Protocol

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.hns.schema import Endpoint, LoadBalancer, Network, SupportedFeatures


class HnsErrorKind(enum.Enum):
    NOT_FOUND = "not found"
    ALREADY_EXISTS = "already exists"
    NOT_SUPPORTED = "not supported"
    INVALID = "invalid"
    FAILED = "failed"


# HCN_E_* (learn.microsoft.com, "HCN Error Code") and the Win32 errors HNS answers with,
# as the HRESULTs HNS returns (HRESULT_FROM_WIN32(x) = 0x80070000 | x).
S_OK = 0
E_NOTIMPL = 0x80004001
HRESULT_ERROR_NOT_FOUND = 0x80070490  # ERROR_NOT_FOUND (1168)
HRESULT_ERROR_FILE_NOT_FOUND = 0x80070002
HRESULT_ERROR_ALREADY_EXISTS = 0x800700B7  # ERROR_ALREADY_EXISTS (183): "Cannot create a file..."
HRESULT_ERROR_NOT_SUPPORTED = 0x80070032  # ERROR_NOT_SUPPORTED (50)
HCN_E_NETWORK_NOT_FOUND = 0x803B0001
HCN_E_ENDPOINT_NOT_FOUND = 0x803B0002
HCN_E_PORT_NOT_FOUND = 0x803B0007
HCN_E_POLICY_NOT_FOUND = 0x803B0008
HCN_E_INVALID_NETWORK = 0x803B000A
HCN_E_INVALID_ENDPOINT = 0x803B000C
HCN_E_INVALID_POLICY = 0x803B000D
HCN_E_INVALID_REMOTE_ENDPOINT_OPERATION = 0x803B000F
HCN_E_NETWORK_ALREADY_EXISTS = 0x803B0010
HCN_E_POLICY_ALREADY_EXISTS = 0x803B0012
HCN_E_PORT_ALREADY_EXISTS = 0x803B0013
HCN_E_REQUEST_UNSUPPORTED = 0x803B0015
HCN_E_MAPPING_NOT_SUPPORTED = 0x803B0016
HCN_E_INVALID_JSON = 0x803B001B
HCN_E_INVALID_JSON_REFERENCE = 0x803B001C
HCN_E_INVALID_IP = 0x803B001E
HCN_E_MANAGER_STOPPED = 0x803B0020
HCN_E_ENTITY_HAS_REFERENCES = 0x803B002C
HCN_E_INVALID_INTERNAL_PORT = 0x803B002D
HCN_E_ADDR_INVALID_OR_RESERVED = 0x803B002F

_KINDS: dict[int, HnsErrorKind] = {
    HRESULT_ERROR_NOT_FOUND: HnsErrorKind.NOT_FOUND,
    HRESULT_ERROR_FILE_NOT_FOUND: HnsErrorKind.NOT_FOUND,
    HCN_E_NETWORK_NOT_FOUND: HnsErrorKind.NOT_FOUND,
    HCN_E_ENDPOINT_NOT_FOUND: HnsErrorKind.NOT_FOUND,
    HCN_E_PORT_NOT_FOUND: HnsErrorKind.NOT_FOUND,
    HCN_E_POLICY_NOT_FOUND: HnsErrorKind.NOT_FOUND,
    HRESULT_ERROR_ALREADY_EXISTS: HnsErrorKind.ALREADY_EXISTS,
    HCN_E_NETWORK_ALREADY_EXISTS: HnsErrorKind.ALREADY_EXISTS,
    HCN_E_POLICY_ALREADY_EXISTS: HnsErrorKind.ALREADY_EXISTS,
    HCN_E_PORT_ALREADY_EXISTS: HnsErrorKind.ALREADY_EXISTS,
    E_NOTIMPL: HnsErrorKind.NOT_SUPPORTED,
    HRESULT_ERROR_NOT_SUPPORTED: HnsErrorKind.NOT_SUPPORTED,
    HCN_E_REQUEST_UNSUPPORTED: HnsErrorKind.NOT_SUPPORTED,
    HCN_E_MAPPING_NOT_SUPPORTED: HnsErrorKind.NOT_SUPPORTED,
    HCN_E_INVALID_NETWORK: HnsErrorKind.INVALID,
    HCN_E_INVALID_ENDPOINT: HnsErrorKind.INVALID,
    HCN_E_INVALID_POLICY: HnsErrorKind.INVALID,
    HCN_E_INVALID_REMOTE_ENDPOINT_OPERATION: HnsErrorKind.INVALID,
    HCN_E_INVALID_JSON: HnsErrorKind.INVALID,
    HCN_E_INVALID_JSON_REFERENCE: HnsErrorKind.INVALID,
    HCN_E_INVALID_IP: HnsErrorKind.INVALID,
    HCN_E_INVALID_INTERNAL_PORT: HnsErrorKind.INVALID,
    HCN_E_ADDR_INVALID_OR_RESERVED: HnsErrorKind.INVALID,
}


def kind_of(hresult: int) -> HnsErrorKind:
    """The kind of error an HRESULT (signed or unsigned) stands for."""
    return _KINDS.get(hresult & 0xFFFFFFFF, HnsErrorKind.FAILED)


class HnsError(DataplaneError):
    """HNS refused or failed an operation (or cannot be reached: ``incomplete``)."""

    tool = "hns"

    def __init__(
        self,
        message: str,
        *,
        kind: HnsErrorKind = HnsErrorKind.FAILED,
        operation: str = "",
        hresult: int | None = None,
        incomplete: bool = False,
    ) -> None:
        super().__init__(message, incomplete=incomplete)
        self.kind = kind
        self.operation = operation
        self.hresult = None if hresult is None else hresult & 0xFFFFFFFF

    @property
    def not_found(self) -> bool:
        return self.kind is HnsErrorKind.NOT_FOUND

    @property
    def already_exists(self) -> bool:
        return self.kind is HnsErrorKind.ALREADY_EXISTS

    @property
    def not_supported(self) -> bool:
        return self.kind is HnsErrorKind.NOT_SUPPORTED

    def __str__(self) -> str:
        text = super().__str__()
        code = f" ({self.hresult:#010x})" if self.hresult is not None else ""
        where = f"{self.operation}: " if self.operation else ""
        return f"{where}{text}{code}"


class Hns(Protocol):
    """What the kernelspace backend asks of HNS; every method raises :class:`HnsError`."""

    def get_network_by_name(self, name: str) -> Network: ...

    def list_endpoints(self, network_id: str | None = None) -> list[Endpoint]:
        """Every endpoint, or those of one network."""
        ...

    def get_endpoint_by_ip(self, ip: str, network_id: str) -> Endpoint:
        """The endpoint of ``network_id`` with ``ip`` among its addresses (NOT_FOUND if none)."""
        ...

    def create_endpoint(self, network_id: str, endpoint: Endpoint) -> Endpoint:
        """Creates ``endpoint`` (its ``id`` and ``network_id`` are ignored) and returns it
        as HNS holds it, with its ID."""
        ...

    def delete_endpoint(self, endpoint_id: str) -> None: ...

    def list_load_balancers(self) -> list[LoadBalancer]: ...

    def create_load_balancer(self, lb: LoadBalancer) -> LoadBalancer:
        """Creates ``lb`` (its ``id`` is ignored) and returns it with its ID."""
        ...

    def modify_load_balancer(self, lb_id: str, lb: LoadBalancer) -> LoadBalancer:
        """Replaces load balancer ``lb_id`` by ``lb`` in place (needs ModifyLoadbalancer)."""
        ...

    def delete_load_balancer(self, lb_id: str) -> None: ...

    def supported_features(self) -> SupportedFeatures: ...
