"""``--nodeport-addresses``: which node addresses accept NodePort traffic, per IP family.

Values follow upstream: a list of CIDRs and/or the word ``primary`` (the node's primary
IP of each family). An empty list means ``primary`` in nftables mode. A CIDR that covers
the whole family (``0.0.0.0/0``, ``::/0``) means every local address except loopback.
A family that the list does not mention (e.g. only IPv4 CIDRs given) gets no NodePorts.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kubeproxy.model.types import IPFamily, family_of


@dataclass(frozen=True, slots=True)
class NodePortAddresses:
    """The parsed flag; resolve per family with the node's current primary IPs."""

    cidrs: tuple[str, ...] = ()
    primary: bool = True

    @classmethod
    def parse(cls, values: list[str] | tuple[str, ...]) -> NodePortAddresses:
        """Parse flag values; raises ValueError naming the bad entry."""
        cidrs: list[str] = []
        primary = False
        for raw in values:
            for item in raw.split(","):
                text = item.strip()
                if not text:
                    continue
                if text == "primary":
                    primary = True
                    continue
                try:
                    cidrs.append(str(ipaddress.ip_network(text, strict=False)))
                except ValueError:
                    raise ValueError(
                        f"--nodeport-addresses: {text!r} is neither a CIDR nor 'primary'"
                    ) from None
        if not cidrs and not primary:
            primary = True
        return cls(tuple(dict.fromkeys(cidrs)), primary)

    def for_family(self, family: IPFamily, primary_ip: str | None) -> FamilyNodePorts:
        cidrs = [c for c in self.cidrs if family_of(c) is family]
        if any(c.endswith("/0") for c in cidrs):
            return FamilyNodePorts(match_all=True, ranges=())
        ranges = list(cidrs)
        if self.primary and primary_ip is not None:
            ranges.append(primary_ip + ("/32" if family is IPFamily.IPv4 else "/128"))
        return FamilyNodePorts(match_all=False, ranges=tuple(dict.fromkeys(ranges)))

    def __str__(self) -> str:
        parts = list(self.cidrs) + (["primary"] if self.primary else [])
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class FamilyNodePorts:
    """NodePort destinations of one family: every local address, or local ones in ranges."""

    match_all: bool
    ranges: tuple[str, ...]

    @property
    def enabled(self) -> bool:
        return self.match_all or bool(self.ranges)
