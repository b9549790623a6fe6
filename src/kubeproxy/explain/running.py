"""Which proxy mode runs on this node, for ``explain --live`` and ``list --live``.

``--live`` compares the plan with the kernel objects of one proxy mode, so it must
compare with the mode that runs here, not with a default. Unless ``--proxy-mode`` (or the
configuration file's ``mode``) says, :func:`running_mode` finds it out, read-only:

1. the running proxy says: ``GET /proxyMode`` on its metrics address (the
   ``metricsBindAddress`` of the same flags; ``0.0.0.0`` / ``::`` asked on loopback), as
   kubeproxy and kube-proxy both serve it;
2. otherwise what the kernel holds (:func:`kernel_modes`): ``table ip|ip6 kube-proxy``
   (nftables mode; ebpf mode when its maps are pinned too), a ``kube-ipvs0`` link (ipvs
   mode), ``KUBE-SERVICES`` in either iptables' nat table (iptables mode).

Exactly one answer is used, and said (the caller logs :attr:`Found.how`); none, or the
rules of several modes at once (a switch half done), is a
:class:`~kubeproxy.config.runtime.ConfigError` asking for ``--proxy-mode``.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubeproxy.backends.inspection import Reader, read_command
from kubeproxy.backends.ipvs.names import DUMMY_DEVICE
from kubeproxy.config.runtime import ConfigError
from kubeproxy.dataplane.bpf.socklb import map_pin
from kubeproxy.dataplane.process import ToolError
from kubeproxy.health.listener import BindAddress

MODES = ("nftables", "iptables", "ipvs", "ebpf")
TIMEOUT = 2.0

# GET a URL: its body, or None when nothing answers.
Fetch = Callable[[str], str | None]


@dataclass(frozen=True, slots=True)
class Found:
    mode: str
    how: str  # how it was learnt, for the log line


def fetch_url(url: str) -> str | None:
    # Straight to the node's own port, whatever HTTP_PROXY says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=TIMEOUT) as response:
            body: bytes = response.read(64)
            return body.decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


def proxy_mode_url(metrics_bind_address: str) -> str | None:
    """Where the proxy of ``metricsBindAddress`` answers ``/proxyMode`` (None: no server)."""
    if not metrics_bind_address:
        return None
    try:
        address = BindAddress.parse(metrics_bind_address)
    except ValueError:
        return None
    # Every address (0.0.0.0, ::, or none given) includes loopback.
    host = address.host or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{address.port}/proxyMode"


def _succeeds(read: Reader, binary: str, args: list[str]) -> bool:
    try:
        read(binary, args)
    except ToolError:
        return False
    return True


def _nat_has_services(read: Reader, binary: str) -> bool:
    """``KUBE-SERVICES`` in the nat table that ``binary`` (an iptables-save) shows. No
    ``-t nat``: legacy iptables would load the table's module to list it."""
    try:
        text = read(binary, [])
    except ToolError:
        return False
    nat = text.partition("*nat\n")[2].partition("COMMIT")[0]
    return any(line.startswith(":KUBE-SERVICES ") for line in nat.splitlines())


def kernel_modes(read: Reader, pin_dir: Path) -> list[str]:
    """The proxy modes whose objects this network namespace holds."""
    found: list[str] = []
    if any(
        _succeeds(read, "nft", ["-j", "-t", "list", "table", family, "kube-proxy"])
        for family in ("ip", "ip6")
    ):
        pinned = any(map_pin(pin_dir, name).exists() for name in ("kp_svc4", "kp_svc6"))
        found.append("ebpf" if pinned else "nftables")
    if _succeeds(read, "ip", ["-j", "link", "show", DUMMY_DEVICE]):
        found.append("ipvs")  # its KUBE-SERVICES chain is ipvs mode's, not iptables mode's
    elif any(_nat_has_services(read, b) for b in ("iptables-nft-save", "iptables-legacy-save")):
        found.append("iptables")
    return found


def running_mode(
    metrics_bind_address: str,
    pin_dir: Path,
    *,
    read: Reader = read_command,
    fetch: Fetch = fetch_url,
) -> Found:
    """The proxy mode to compare the kernel with (see the module docstring)."""
    url = proxy_mode_url(metrics_bind_address)
    if url is not None:
        answer = fetch(url)
        if answer is not None and answer.strip() in MODES:
            return Found(answer.strip(), f"the running proxy's {url} says so")
    modes = kernel_modes(read, pin_dir)
    if len(modes) == 1:
        return Found(modes[0], "the kernel holds that mode's rules, and no other's")
    asked = f"no proxy answers {url}" if url is not None else "no metrics server to ask"
    held = (
        f"the kernel holds the rules of {' and '.join(modes)} modes"
        if modes
        else "the kernel holds no kubeproxy rules"
    )
    raise ConfigError(
        f"--live: cannot tell which proxy mode runs on this node ({asked}; {held}): "
        "give --proxy-mode"
    )
