"""``kubeproxy render --proxy-mode kernelspace``: the HNS objects a full sync creates.

A render touches nothing: the backend copies what HNS holds (the network, its
endpoints, the supported features; or the ``--hns-state`` file's, off Windows) into a
:class:`~kubeproxy.dataplane.hns.fake.FakeHns` (:func:`mirror`), runs a full sync
against the copy and prints what the sync created (:func:`contract`), in issue 26's
shape with HCN's numeric flag values::

    {"endpoints": [{"id", "ipAddress", "isRemote", "providerAddress"}],
     "loadBalancers": [{"id", "frontendVIPs", "portMappings": [{"protocol",
       "internalPort", "externalPort", "distributionType", "flags"}], "flags",
       "sourceVIP", "endpointIPs"}]}

``endpoints`` are those the sync created (remote endpoints, the source VIP's and the
ClusterIPs' on an Overlay network); ``endpointIPs`` name every endpoint a load balancer
uses, this node's Pods included. IDs come from a seeded generator: the same input
renders the same output. Load balancers HNS already holds are not copied: the render
shows what a node without them gets.
"""

from __future__ import annotations

import ipaddress
from argparse import SUPPRESS, ArgumentParser
from typing import Any

from kubeproxy.dataplane.hns import Hns
from kubeproxy.dataplane.hns.fake import FakeHns

RENDER_SEED = 0


def add_hns_state_flag(command: ArgumentParser) -> None:
    """``--hns-state`` (render, explain, list): the node's HNS, off Windows."""
    command.add_argument(
        "--hns-state",
        metavar="FILE",
        help="kernelspace mode, off Windows: a JSON file describing the node's HNS "
        "(network, remote subnets, endpoints, supported features) to answer against",
    )


def add_render_flags(render: ArgumentParser) -> None:
    """``render``'s kernelspace options: ``--hns-state``, and ``-o`` for ``--format``."""
    add_hns_state_flag(render)
    render.add_argument("-o", dest="format", choices=("nft", "json", "yaml"), help=SUPPRESS)


def mirror(hns: Hns, network_name: str) -> FakeHns:
    """A fake HNS holding what ``hns`` holds of the network (not its load balancers)."""
    network = hns.get_network_by_name(network_name)
    endpoints = hns.list_endpoints(network.id)
    return FakeHns(
        network, endpoints=endpoints, features=hns.supported_features(), seed=RENDER_SEED
    )


def contract(hns: FakeHns, before: set[str]) -> dict[str, Any]:
    """What ``hns`` holds that is not in ``before`` (endpoint IDs), as issue 26 prints it."""
    all_endpoints = hns.list_endpoints()
    ips = {ep.id: ep.ip_address for ep in all_endpoints}
    created = sorted((ep for ep in all_endpoints if ep.id not in before), key=_by_ip)
    lbs = sorted(
        hns.list_load_balancers(),
        key=lambda lb: (
            _ip_key(lb.vip),
            lb.port_mappings[0].protocol,
            lb.port_mappings[0].external_port,
        ),
    )
    return {
        "endpoints": [
            {
                "id": ep.id,
                "ipAddress": ep.ip_address,
                "isRemote": ep.is_remote,
                "providerAddress": ep.provider_address,
            }
            for ep in created
        ],
        "loadBalancers": [
            {
                "id": lb.id,
                "frontendVIPs": list(lb.frontend_vips),
                "portMappings": [
                    {
                        "protocol": pm.protocol,
                        "internalPort": pm.internal_port,
                        "externalPort": pm.external_port,
                        "distributionType": int(pm.distribution),
                        "flags": int(pm.flags),
                    }
                    for pm in lb.port_mappings
                ],
                "flags": int(lb.flags),
                "sourceVIP": lb.source_vip,
                "endpointIPs": [ips[i] for i in lb.endpoint_ids],
            }
            for lb in lbs
        ],
    }


def _ip_key(ip: str) -> tuple[int, int]:
    if not ip:
        return (0, 0)  # the NodePort load balancers first
    addr = ipaddress.ip_address(ip)
    return (addr.version, int(addr))


def _by_ip(ep: Any) -> tuple[int, int]:
    return _ip_key(ep.ip_address)
