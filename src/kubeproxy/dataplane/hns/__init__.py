"""HNS (the Windows Host Networking Service): the data-plane half of issue 26.

Nothing in this package has run on Windows: no Windows machine was available while it
was written. What it holds is checked on Linux against HCN schema v2 as hcsshim/hnslib
and upstream kube-proxy (``pkg/proxy/winkernel``) write it, and against a fake DLL.

* :mod:`.schema` — the documents kube-proxy creates and reads (load balancers and their
  port mappings, endpoints, the network and its remote subnets, supported features),
  frozen dataclasses with HCN's numeric flag values, each ``to_hcn()``/``from_hcn()``.
* :mod:`.client` — :class:`Hns`, the operations the backend uses, and :class:`HnsError`
  (``kind``: not found, already exists, not supported, invalid, failed).
* :mod:`.hcn` — :class:`~.hcn.HcnClient`, ``Hns`` over computenetwork.dll through ctypes;
  importable anywhere, constructible only on Windows.
* :mod:`.fake` — :class:`~.fake.FakeHns`, the strict fake, and ``load_state`` for the
  ``--hns-state`` file.
"""

from __future__ import annotations

from kubeproxy.dataplane.hns.client import Hns, HnsError, HnsErrorKind, kind_of
from kubeproxy.dataplane.hns.schema import (
    PROTOCOLS,
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
)

__all__ = [
    "PROTOCOLS",
    "Distribution",
    "Endpoint",
    "EndpointFlags",
    "Hns",
    "HnsError",
    "HnsErrorKind",
    "LoadBalancer",
    "LoadBalancerFlags",
    "Network",
    "NetworkType",
    "PortMapping",
    "PortMappingFlags",
    "RemoteSubnet",
    "SchemaError",
    "SupportedFeatures",
    "kind_of",
]
