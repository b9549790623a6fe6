"""The proxy modes (``--proxy-mode``, the file's ``mode``) as one enum.

A ``StrEnum``: a member is its flag value, so it prints, compares and serialises as the
text an operator types. Which backend serves a mode is the backends' registry
(:mod:`kubeproxy.backends.registry`); which configuration sections a mode reads is
:mod:`kubeproxy.config.defaults`.
"""

from __future__ import annotations

from enum import StrEnum


class ProxyMode(StrEnum):
    NFTABLES = "nftables"
    IPTABLES = "iptables"
    IPVS = "ipvs"
    # Ours: socket-level load balancing in BPF beside nftables mode's tables.
    EBPF = "ebpf"
    # Upstream's Windows mode: HNS load balancers (issue 26); runs on Windows only,
    # renders and explains anywhere.
    KERNELSPACE = "kernelspace"

    @property
    def nftables_rules(self) -> bool:
        """The mode programs nftables mode's tables (ebpf mode carries everything its
        hooks do not in them), and so reads the ``nftables:`` section."""
        return self in (ProxyMode.NFTABLES, ProxyMode.EBPF)
