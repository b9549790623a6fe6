"""``--nodeport-addresses``: which node addresses accept NodePort traffic, per IP family.

Values follow upstream kube-proxy v1.37 exactly:

* a list of CIDRs and the keywords ``primary`` (the node's primary IP of each family,
  unless it is loopback; the default in nftables mode), ``localhost`` (``127.0.0.0/8`` and
  ``::1/128``) and ``all`` (``0.0.0.0/0`` and ``::/0``), mixed freely; nothing at all means
  every local address (the default in iptables and ipvs modes);
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

KEYWORD_CIDRS = {"localhost": ("127.0.0.0/8", "::1/128"), "all": ("0.0.0.0/0", "::/0")}
_LOOPBACK_START = ipaddress.IPv4Address("127.0.0.0")


@dataclass(frozen=True, slots=True)
class NodePortAddresses:
    """The parsed flag; resolve per family with the node's current primary IPs."""

    # The CIDRs given, and those ``localhost`` and ``all`` stand for.
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
                if text in KEYWORD_CIDRS:
                    cidrs += KEYWORD_CIDRS[text]
                    continue
                try:
                    # Python keeps an IPv6 zone ID ("fe80::%eth0/64", any text after "%")
                    # in str(), which would go verbatim into the rule script: reject it.
                    if "%" in text:
                        raise ValueError(text)
                    cidrs.append(str(ipaddress.ip_network(text, strict=False)))
                except ValueError:
                    raise ValueError(
                        f"--nodeport-addresses: {text!r} is neither a CIDR nor one of the "
                        "keywords 'primary', 'localhost', 'all'"
                    ) from None
        # Nothing given: every local address (upstream's default in iptables and ipvs
        # modes; nftables mode's default of "primary" is filled in by the config).
        return cls(tuple(dict.fromkeys(cidrs)), primary)

    def admits_ipv4_loopback(self) -> bool:
        """Whether the IPv4 NodePort addresses take in loopback (upstream's
        ContainsIPv4Loopback: a loopback network, or one holding 127.0.0.0). ``primary``
        is never loopback (a loopback primary IP is skipped, as upstream)."""
        v4 = [ipaddress.ip_network(c) for c in self.cidrs if family_of(c) is IPFamily.IPv4]
        if not v4 and not self.primary:
            return True  # no IPv4 entry: every IPv4 address, 127.0.0.1 among them
        return any(n.network_address.is_loopback or _LOOPBACK_START in n for n in v4)

    def serves_localhost(self, family: IPFamily, wanted: bool) -> bool:
        """Whether ``family``'s NodePorts are served on 127.0.0.1 when the mode ``wanted``
        them (iptables mode's ``iptables.localhostNodePorts``): IPv4 only, and only where
        :meth:`admits_ipv4_loopback`. The one decision behind the plan's rules and the
        route_localnet sysctl (CVE-2020-8558: never set when nothing needs it)."""
        return wanted and family is IPFamily.IPv4 and self.admits_ipv4_loopback()

    def for_family(self, family: IPFamily, primary_ip: str | None) -> FamilyNodePorts:
        ranges = []
        if self.primary and primary_ip and not ipaddress.ip_address(primary_ip).is_loopback:
            ranges.append(primary_ip + ("/32" if family is IPFamily.IPv4 else "/128"))
        ranges += [c for c in self.cidrs if family_of(c) is family]
        if not ranges or any(c.endswith("/0") for c in ranges):
            return FamilyNodePorts(match_all=True, ranges=())
        return FamilyNodePorts(match_all=False, ranges=tuple(ranges))

    def __str__(self) -> str:
        return ",".join((*(["primary"] if self.primary else []), *self.cidrs))


@dataclass(frozen=True, slots=True)
class FamilyNodePorts:
    """NodePort destinations of one family: every local address, or local ones in ranges."""

    match_all: bool
    ranges: tuple[str, ...]

    @property
    def enabled(self) -> bool:
        return self.match_all or bool(self.ranges)
