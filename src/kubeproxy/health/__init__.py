"""Health: is the proxy healthy, and is this node a good target for a load balancer?

* :mod:`~kubeproxy.health.proxy` — :class:`ProxyHealth`, the pure state behind
  ``/healthz`` and ``/livez`` (queued update vs last successful sync; Node eligibility).
* :mod:`~kubeproxy.health.server` — :class:`HealthServer`, those two endpoints over HTTP
  on healthzBindAddress, counting answers per status code.
* :mod:`~kubeproxy.health.services` — :class:`ServiceHealthServers`, one listener per
  ``healthCheckNodePort`` of an ``externalTrafficPolicy: Local`` Service, on the node
  addresses ``--nodeport-addresses`` selects.
* :mod:`~kubeproxy.health.listener` — bind-address parsing and the aiohttp listener the
  servers (and the metrics server) share.
"""

from kubeproxy.health.listener import BindAddress, HttpListener
from kubeproxy.health.proxy import ProxyHealth
from kubeproxy.health.server import DEFAULT_HEALTHZ_BIND_ADDRESS, HealthServer, ProbeCounter
from kubeproxy.health.services import (
    BindFailure,
    ServiceHealthServers,
    health_check_families,
    health_check_node_ports,
    local_ready_endpoints,
)

__all__ = [
    "DEFAULT_HEALTHZ_BIND_ADDRESS",
    "BindAddress",
    "BindFailure",
    "HealthServer",
    "HttpListener",
    "ProbeCounter",
    "ProxyHealth",
    "ServiceHealthServers",
    "health_check_families",
    "health_check_node_ports",
    "local_ready_endpoints",
]
