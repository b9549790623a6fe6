"""Extended accounting objects (``nfnetlink_acct``): named packet counters that iptables
rules feed with ``-m nfacct --nfacct-name NAME``.

iptables mode uses two, as upstream kube-proxy does, for its metrics
``kubeproxy_iptables_localhost_nodeports_accepted_packets_total`` and
``kubeproxy_iptables_ct_state_invalid_dropped_packets_total``. A rule naming a counter
that does not exist is refused, so the backend first :meth:`Nfacct.ensure`\\ s each one
and leaves the match out when that fails (the rules work without it; only the metric is
missing, and that is logged once).

:class:`NfacctCommand` runs the ``nfacct`` tool (Debian package ``nfacct``, from the
netfilter project); the objects belong to a network namespace, like the rules.
:class:`FakeNfacct` keeps them in memory for tests without root.
"""

from __future__ import annotations

import re
from typing import Protocol

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.process import ToolError, run_tool

TIMEOUT = 5.0
# ``nfacct list``, a line per counter: "{ pkts = 00000000000000000012, bytes = 0...720 } = NAME;"
# (a name may hold spaces and semicolons: it ends with the line's last ";").
_COUNTER = re.compile(r"^\{\s*pkts\s*=\s*(\d+),\s*bytes\s*=\s*(\d+)\s*\}\s*=\s*(.+);$", re.M)
# NFACCT_NAME_MAX (32) with the terminating NUL: longer names are cut to this.
NAME_MAX = 31


class NfacctError(DataplaneError):
    """A counter could not be created or read (one sentence, from the tool)."""

    tool = "nfacct"


class Nfacct(Protocol):
    def ensure(self, name: str) -> None:
        """Create counter ``name`` unless it exists; :class:`NfacctError` if impossible."""
        ...

    def packets(self) -> dict[str, int]:
        """The packets counted so far by every counter; :class:`NfacctError` if unreadable."""
        ...


class NfacctCommand:
    def __init__(self, netns: str | None = None) -> None:
        self.netns = netns

    def _run(self, *args: str) -> str:
        try:
            done = run_tool("nfacct", list(args), netns=self.netns, timeout=TIMEOUT,
                            package="nfacct")  # fmt: skip
        except ToolError as err:
            raise NfacctError(str(err), incomplete=True) from None
        if done.returncode != 0:
            why = (done.stderr or done.stdout).strip().splitlines()
            raise NfacctError(f"nfacct {' '.join(args)}: {why[-1] if why else done.returncode}")
        return done.stdout

    def ensure(self, name: str) -> None:
        try:
            self._run("get", name)
        except NfacctError:
            self._run("add", name)

    def packets(self) -> dict[str, int]:
        # One process for every counter: this runs at each metrics scrape.
        return {name: int(pkts) for pkts, _, name in _COUNTER.findall(self._run("list"))}


class FakeNfacct:
    """In memory, as the real one (tests/nfacct_fake_cases.py checks it against the
    nfacct tool): an empty name is refused (EINVAL), a longer one is cut to
    :data:`NAME_MAX` characters. ``broken`` makes every call fail, as a kernel without
    the module does."""

    def __init__(self, *, broken: bool = False) -> None:
        self.counters: dict[str, int] = {}
        self.broken = broken

    def ensure(self, name: str) -> None:
        if self.broken:
            raise NfacctError("nfacct add: No such file or directory")
        if not name:
            raise NfacctError("nfacct add : nfacct v1.0.2: error: Invalid argument")
        self.counters.setdefault(name[:NAME_MAX], 0)

    def packets(self) -> dict[str, int]:
        if self.broken:
            raise NfacctError("nfacct list: No such file or directory")
        return dict(self.counters)
