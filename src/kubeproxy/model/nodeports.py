"""``--nodeport-addresses``: which node addresses accept NodePort traffic, per IP family.

Values follow upstream kube-proxy exactly:

* a list of CIDRs, or the single word ``primary`` (the node's primary IP of each family;
  the default in nftables mode); mixing the two is an error; nothing at all means every
  local address (the default in iptables and ipvs modes);
* per family, only the CIDRs of that family count; when none is left — a family the list
  does not mention, or ``primary`` with no known primary IP of that family — NodePorts
  are accepted on every local address of that family (upstream falls back to
  ``0.0.0.0/0`` / ``::/0``);
* a CIDR covering the whole family means every local address except loopback.
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
                    # Python keeps an IPv6 zone ID ("fe80::%eth0/64", any text after "%")
                    # in str(), which would go verbatim into the rule script: reject it.
                    if "%" in text:
                        raise ValueError(text)
                    cidrs.append(str(ipaddress.ip_network(text, strict=False)))
                except ValueError:
                    raise ValueError(
                        f"--nodeport-addresses: {text!r} is neither a CIDR nor 'primary'"
                    ) from None
        if primary and cidrs:
            raise ValueError("--nodeport-addresses: can't use both 'primary' and CIDRs")
        # Nothing given: every local address (upstream's default in iptables and ipvs
        # modes; nftables mode's default of "primary" is filled in by the config).
        return cls(tuple(dict.fromkeys(cidrs)), primary)

    def admits_ipv4_loopback(self) -> bool:
        """Whether the IPv4 NodePort addresses take in 127.0.0.1 (upstream's
        ContainsIPv4Loopback). Never with ``primary``: a node's primary IP is never
        loopback."""
        if self.primary:
            return False
        v4 = [ipaddress.ip_network(c) for c in self.cidrs if family_of(c) is IPFamily.IPv4]
        loopback = ipaddress.ip_address("127.0.0.1")
        return not v4 or any(loopback in n for n in v4)

    def serves_localhost(self, family: IPFamily, wanted: bool) -> bool:
        """Whether ``family``'s NodePorts are served on 127.0.0.1 when the mode ``wanted``
        them (iptables mode's ``iptables.localhostNodePorts``): IPv4 only, and only where
        :meth:`admits_ipv4_loopback`. The one decision behind the plan's rules and the
        route_localnet sysctl (CVE-2020-8558: never set when nothing needs it)."""
        return wanted and family is IPFamily.IPv4 and self.admits_ipv4_loopback()

    def for_family(self, family: IPFamily, primary_ip: str | None) -> FamilyNodePorts:
        if self.primary:
            usable = primary_ip is not None and not ipaddress.ip_address(primary_ip).is_loopback
            bits = "/32" if family is IPFamily.IPv4 else "/128"
            ranges = [primary_ip + bits] if usable and primary_ip is not None else []
        else:
            ranges = [c for c in self.cidrs if family_of(c) is family]
        if not ranges or any(c.endswith("/0") for c in ranges):
            return FamilyNodePorts(match_all=True, ranges=())
        return FamilyNodePorts(match_all=False, ranges=tuple(ranges))

    def __str__(self) -> str:
        return "primary" if self.primary else ",".join(self.cidrs)


@dataclass(frozen=True, slots=True)
class FamilyNodePorts:
    """NodePort destinations of one family: every local address, or local ones in ranges."""

    match_all: bool
    ranges: tuple[str, ...]

    @property
    def enabled(self) -> bool:
        return self.match_all or bool(self.ranges)
