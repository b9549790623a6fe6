"""The one root of the errors the data-plane tools raise.

Every tool wrapper under :mod:`kubeproxy.dataplane` raises a :class:`DataplaneError`
(its own subclass of it), so a caller that only needs to know "did the tool fail, and
is the kernel's state still known?" can catch one class and read two attributes:

* ``tool``: which tool or kernel interface failed (``nft``, ``iptables``, ``ipset``...);
* ``incomplete``: True when the tool hung (killed after its timeout), was missing or
  vanished, so nothing is known about what it did; retrying another form of the same
  change would only wait again. False when the tool answered and refused.

The hierarchy (each class keeps its module, name and attributes)::

    RuntimeError
    └── DataplaneError                          kubeproxy.dataplane.errors
        ├── ToolError                           .process: a command could not be run
        │                                       to completion (always incomplete)
        ├── NftError  (script)                  .nftables.runner
        ├── IptablesError  (input, line,        .iptables.runner
        │   │           table, committed)
        │   └── CleanupError  (errors, removed) .iptables.cleanup
        ├── IpsetError  (line, missing)         .ipset
        ├── IpvsError  (errno)                  .ipvs (netlink, not an OSError)
        ├── ConntrackError                      .conntrack
        ├── NfacctError                         .nfacct
        ├── SockLBError                         .bpf.socklb
        ├── BuildError                          .bpf.build
        ├── BpfError  (also an OSError)         .bpf.libbpf
        ├── HnsError  (kind, operation,         .hns.client (Windows HNS; kind: not
        │              hresult)                 found, already exists, not supported...)
        ├── UnreadableTableError  (also a       .iptables.listing
        │                          ValueError)
        └── DataplaneInputError  (also a ValueError): input that the tool would
            │                    refuse, found before running it
            ├── ScriptError                     .nftables.transaction
            ├── RuleError                       .iptables.rule_values (and .rules)
            └── RestoreError                    .iptables.restore

Classes that were a ``ValueError`` or an ``OSError`` before stay one (multiple
inheritance), so the ``except ValueError``/``except OSError`` clauses that catch them
keep doing so. The fakes' private ``_RefusedError`` classes are not part of this: they
never leave their fake.
"""

from __future__ import annotations


class DataplaneError(RuntimeError):
    """A data-plane tool failed; ``tool`` names it, ``incomplete`` says whether the
    kernel's state is unknown (the tool hung, was killed or was missing)."""

    tool: str = ""
    incomplete: bool = False

    def __init__(self, *args: object, tool: str | None = None, incomplete: bool = False) -> None:
        super().__init__(*args)
        if tool is not None:
            self.tool = tool
        self.incomplete = incomplete


class DataplaneInputError(DataplaneError, ValueError):
    """Input the tool would refuse, found while building it (nothing was run).

    Also a ValueError: these classes were ValueErrors, and callers catch them as such.
    """
