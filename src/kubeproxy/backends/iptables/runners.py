"""The iptables runners a mode drives (iptables mode, and ipvs mode's iptables rules).

:func:`open_runners` opens one per family in the configured flavour (``auto``: detected,
read-only); :func:`working_runners` then checks at ``start`` that an ``auto`` choice can
program this kernel, switching to the other flavour if not. Both modes use these, so
they live beside the iptables backend rather than inside it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from kubeproxy.backends.base import BackendError
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.iptables.runner import (
    Flavor,
    Iptables,
    IptablesCommand,
    detect_flavor_why,
)
from kubeproxy.model.types import IPFamily

log = logging.getLogger(__name__)


def open_runners(config: ProxyConfig, netns: str | None = None) -> dict[IPFamily, Iptables]:
    """One runner per family the proxy serves, in the configured (or, with ``auto``,
    detected: :func:`detect_flavor_why`, read-only) flavour; a backend's ``start`` then
    checks an ``auto`` choice works (:func:`working_runners`)."""
    flavor = config.iptables_backend
    chosen: Flavor
    if flavor == "auto":
        chosen, why = detect_flavor_why(netns)
        log.info("iptables flavour: %s (--iptables-backend auto: %s)", chosen, why)
    else:
        chosen = "legacy" if flavor == "legacy" else "nft"
    return {f: IptablesCommand(f, chosen, netns=netns) for f in config.families}


# Runners of every family the proxy serves, in the flavour given.
Reopen = Callable[[Flavor], Mapping[IPFamily, Iptables]]


def working_runners(
    runners: Mapping[IPFamily, Iptables], reopen: Reopen | None
) -> dict[IPFamily, Iptables]:
    """``--iptables-backend auto`` (``reopen`` given): ``runners`` if their flavour can
    program this kernel, else the other flavour's if that can (logged), else
    BackendError with both reasons. The detected flavour may not work: in a kernel whose
    nf_tables lacks the ip family, kubelet-less detection says nft, and every sync fails.
    """
    if reopen is None or not runners:
        return dict(runners)
    first = next(iter(runners.values())).flavor
    refused: dict[Flavor, str] = {}
    for flavor in (first, "legacy" if first == "nft" else "nft"):
        candidates = runners if flavor == first else reopen(flavor)
        reason = next((r for r in (c.works() for c in candidates.values()) if r), None)
        if reason is None:
            if flavor != first:
                log.warning(
                    "iptables-%s does not work in this kernel (%s): using iptables-%s",
                    first,
                    refused[first],
                    flavor,
                )
            return dict(candidates)
        refused[flavor] = reason
    raise BackendError(
        "--iptables-backend auto: neither iptables flavour works in this kernel: "
        + "; ".join(f"{f}: {r}" for f, r in refused.items())
    )
