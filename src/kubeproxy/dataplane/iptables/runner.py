"""The one place that talks to iptables: restore inputs, listings and single rules, for
one IP family in one flavour (``nft`` or ``legacy``).

:class:`Iptables` is the small interface backends depend on; :class:`IptablesCommand`
runs the commands (``iptables-nft-restore``, ``ip6tables-legacy-save``...), in another
network namespace when asked, killing any that outlives its timeout; the strict fake
(:mod:`kubeproxy.dataplane.iptables.fake`) implements the same interface in memory.
:func:`detect_flavor` picks the flavour the node's other rules use, as the upstream
kube-proxy image's ``iptables-wrapper`` does.

How the commands are called, and why (upstream kube-proxy's ``pkg/util/iptables``):

* ``restore``: ``iptables-restore -w 5 --noflush --counters``, the whole input on stdin
  (streamed as it is printed when large).
  ``--noflush`` touches only the chains the input names; ``--counters`` is what upstream
  passes (it only matters for counters written in the input; ours are all ``[0:0]``).
  Upstream also passes ``-W 100000``; iptables 1.8.9 ignores that option and prints a
  deprecation warning, so it is left out. ``-w 5`` waits up to 5 s for the xtables lock
  (``/run/xtables.lock``, shared by every network namespace), which only the legacy
  flavour takes; when the wait runs out the command exits with status 4.
  Each table is committed at its ``COMMIT`` line: a refused table changes nothing, but
  the tables before it in the same input stay committed. :class:`IptablesError` says
  which table failed and which were committed, from the line number iptables reports.
* ``chain_exists``: ``iptables -w 5 -t TABLE -S CHAIN`` (upstream's canary check);
  ``ensure_chain``: ``-N``; ``ensure_rule``: ``-C`` then ``-I`` (or ``-A``);
  ``delete_rule``: ``-D`` alone (status 1, or a jump to a chain that does not exist, means
  the rule is not there: upstream's ``IsNotFoundError``).
* ``rules``: the rules of every chain. iptables-nft-save finds the chain of each rule it
  lists by walking its list of chains, so it is quadratic in chains (22 s at 5,000
  Services x 10 endpoints, 55,000 chains). An ``iptables-nft-restore --noflush`` input
  made of one ``-S CHAIN`` line per chain (largest name first, the order its chain list
  takes in cheapest, and nothing to commit) prints the same rules in the ``-S`` format in
  2.6 s there; so the nft flavour lists that way (when the chain names are known from
  ``nft``), and falls back to iptables-save if that fails. Legacy: iptables-save.
* ``chains``: the chain names of a table without its rules where that is possible. For
  the nft flavour ``nft -j list chains ip|ip6`` lists them without decoding any rule
  (35 ms where ``iptables-nft-save`` takes 1.4 s for 100,000 rules); without the ``nft``
  binary, the ``:CHAIN`` lines of ``iptables-save``. For legacy, ``iptables-legacy-save
  -t TABLE`` (the kernel hands over the whole table in one piece anyway), except that a
  table the namespace has not instantiated (not in ``/proc/net/ip_tables_names``) is
  reported as its builtin chains without being created.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, Protocol

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.iptables.listing import parse_save
from kubeproxy.dataplane.iptables.restore import BUILTIN_CHAINS, Restore
from kubeproxy.dataplane.process import ToolError, run_tool
from kubeproxy.model.types import IPFamily

Flavor = Literal["nft", "legacy"]
FLAVORS: tuple[Flavor, ...] = ("nft", "legacy")

DEFAULT_TIMEOUT = 60.0  # seconds a command may take before it is killed
WAIT = ("-w", "5")  # upstream's WaitString, WaitSecondsValue
RANDOM_FULLY_MIN_VERSION = (1, 6, 2)  # upstream's RandomFullyMinVersion

# Exit statuses of the iptables commands.
STATUS_FAILED = 1  # the operation failed: no such rule or chain, chain exists...
STATUS_PARAMETER = 2  # the command line (or a restore line) was refused while parsing
STATUS_RESOURCE = 4  # the xtables lock could not be taken in time
# Restores of more rules than this are streamed to the tool rather than printed first.
STREAM_RULES = 2000


class IptablesError(DataplaneError):
    """iptables refused something (or could not run).

    ``input`` is the restore input (or the command line); for a refused restore, ``line``
    is the line iptables reported, ``table`` the table it belongs to, and ``committed``
    the tables before it, which iptables did commit (None: unknown, e.g. a killed
    process). ``incomplete``: the command did not finish (killed after its timeout, or
    missing); retrying another form of the same input would only wait again.
    """

    tool = "iptables"

    def __init__(
        self,
        message: str,
        input: str = "",
        *,
        line: int | None = None,
        table: str | None = None,
        committed: tuple[str, ...] | None = None,
        incomplete: bool = False,
    ) -> None:
        super().__init__(message, incomplete=incomplete)
        self.input = input
        self.line = line
        self.table = table
        self.committed = committed


class Iptables(Protocol):
    """iptables for one IP family, in one flavour."""

    @property
    def family(self) -> IPFamily: ...

    @property
    def flavor(self) -> Flavor: ...

    @property
    def version(self) -> str:
        """``1.8.9``."""

    @property
    def has_random_fully(self) -> bool:
        """Whether ``MASQUERADE --random-fully`` is available."""

    def available(self) -> str | None:
        """None if the commands run; otherwise why not."""

    def works(self) -> str | None:
        """None if this flavour can program this kernel; otherwise why not (writes a
        chain and deletes it in the same commit)."""

    def restore(self, data: Restore) -> None:
        """Apply ``data`` with ``--noflush``, table by table; IptablesError if a table is
        refused (it is left unchanged; the tables before it are committed)."""

    def save(self, table: str) -> str:
        """``iptables-save -t TABLE``."""

    def chains(self, table: str) -> set[str]:
        """Names of every chain in ``table``, builtin ones included."""

    def rules(self, table: str, chains: set[str]) -> dict[str, list[str]]:
        """Every chain of ``table`` (``chains``: what :meth:`chains` returned) with its
        rules as iptables-save prints them after ``-A CHAIN``;
        :class:`~.listing.UnreadableTableError` if iptables cannot list them."""

    def chain_exists(self, table: str, chain: str) -> bool:
        """Cheap: for the canary check between syncs."""

    def ensure_chain(self, table: str, chain: str) -> bool:
        """Create ``chain`` if missing; True if it already existed."""

    def ensure_rule(
        self, table: str, chain: str, args: Sequence[str], *, prepend: bool = True
    ) -> bool:
        """Insert (or append) the rule unless an equal one exists; True if it existed."""

    def delete_rule(self, table: str, chain: str, args: Sequence[str]) -> bool:
        """Delete the first equal rule; False if there is none (not an error)."""


def command_names(family: IPFamily, flavor: Flavor) -> tuple[str, str, str]:
    """(iptables, iptables-save, iptables-restore) for this family and flavour."""
    base = "ip6tables" if family is IPFamily.IPv6 else "iptables"
    return f"{base}-{flavor}", f"{base}-{flavor}-save", f"{base}-{flavor}-restore"


def _locate(name: str, sbin: str | None) -> str:
    if sbin is not None:
        return str(Path(sbin) / name)
    return shutil.which(name) or f"/usr/sbin/{name}"


_LINE = re.compile(r"line:? (\d+)")
_VERSION = re.compile(r"v(\d+(?:\.\d+)+)")
# What iptables says when a rule cannot exist because a chain it names does not:
# upstream's iptablesNotFoundStrings.
_NOT_FOUND = ("No chain/target/match by that name", "No such file or directory", "does not exist")


# "iptables-nft-restore v1.8.9 (nf_tables): " -- the caller names the command already.
_PROGRAM = re.compile(r"^\S+ v\d+(?:\.\d+)+(?: \([^)]*\))?:\s*")


def _summarise(stderr: str, limit: int = 10) -> str:
    """iptables' complaint on one line, without its noise (program banner, usage hint,
    deprecation and legacy-tables warnings)."""
    lines = []
    for raw in stderr.strip().splitlines():
        line = _PROGRAM.sub("", raw).strip()
        if line and not line.startswith(("Try `", "# Warning:", "Ignoring deprecated")):
            lines.append(line)
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more lines)"]
    return "; ".join(lines) if lines else "failed with no output"


def locate_failure(text: str, line: int) -> tuple[str | None, tuple[str, ...]]:
    """The table of restore input ``text`` that line ``line`` (1-based) belongs to, and
    the tables committed before it."""
    table: str | None = None
    committed: list[str] = []
    for number, content in enumerate(text.splitlines(), start=1):
        if content.startswith("*"):
            table = content[1:].strip()
        if number == line:
            return table, tuple(committed)
        if content.strip() == "COMMIT" and table is not None:
            committed.append(table)
            table = None
    return table, tuple(committed)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


class IptablesCommand:
    """Runs the iptables commands of one family and flavour (in network namespace
    ``netns`` when given). ``sbin`` overrides where the binaries are looked up (default:
    ``PATH``, then ``/usr/sbin``); ``nft`` is the nft binary used for cheap chain
    listings in the nft flavour (None: look it up; "" : never use it).
    """

    def __init__(
        self,
        family: IPFamily = IPFamily.IPv4,
        flavor: Flavor = "nft",
        netns: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        sbin: str | None = None,
        nft: str | None = None,
    ) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"iptables flavour must be nft or legacy, not {flavor!r}")
        self._family = family
        self._flavor: Flavor = flavor
        self.netns = netns
        self.timeout = timeout
        names = command_names(family, flavor)
        self.iptables, self.save_binary, self.restore_binary = (_locate(n, sbin) for n in names)
        found = (shutil.which("nft") or "") if nft is None else nft
        self.nft_binary = found if flavor == "nft" else ""
        self._version: str | None = None
        self._saved: tuple[str, str] | None = None  # (table, iptables-save output)

    def __repr__(self) -> str:
        where = f" in {self.netns}" if self.netns else ""
        return f"IptablesCommand({self._family}, {self._flavor}{where})"

    @property
    def family(self) -> IPFamily:
        return self._family

    @property
    def flavor(self) -> Flavor:
        return self._flavor

    # ------------------------------------------------------------------- running

    def _run(
        self,
        binary: str,
        args: list[str],
        input: str | Iterable[str] | None = None,
        *,
        keep_stdout: bool = True,
    ) -> tuple[int, str, str]:
        try:
            proc = run_tool(
                binary,
                args,
                netns=self.netns,
                input=input,
                timeout=self.timeout,
                package="iptables",
                keep_stdout=keep_stdout,
            )
        except ToolError as err:
            text = input if isinstance(input, str) else ""
            raise IptablesError(
                str(err), text or " ".join([binary, *args]), incomplete=True
            ) from None
        return proc.returncode, proc.stdout or "", proc.stderr

    def _fail(self, binary: str, args: list[str], stderr: str) -> IptablesError:
        command = " ".join([Path(binary).name, *args])
        return IptablesError(f"{command}: {_summarise(stderr)}", " ".join([binary, *args]))

    def _rule(self, op: str, table: str, chain: str, args: Sequence[str] = ()) -> tuple[int, str]:
        self._saved = None  # perhaps a change: a listing kept for ``rules`` is stale
        argv = [*WAIT, "-t", table, op, chain, *args]
        status, _, stderr = self._run(self.iptables, argv)
        if status not in (0, STATUS_FAILED, STATUS_PARAMETER):
            raise self._fail(self.iptables, argv, stderr)
        return status, stderr

    # ---------------------------------------------------------------- Iptables

    @property
    def version(self) -> str:
        if self._version is None:
            status, out, err = self._run(self.iptables, ["--version"])
            m = _VERSION.search(out)
            if status != 0 or m is None:
                raise self._fail(self.iptables, ["--version"], err or out)
            self._version = m.group(1)
        return self._version

    @property
    def has_random_fully(self) -> bool:
        return version_tuple(self.version) >= RANDOM_FULLY_MIN_VERSION

    def available(self) -> str | None:
        want = "(nf_tables)" if self._flavor == "nft" else "(legacy)"
        for binary in (self.iptables, self.save_binary, self.restore_binary):
            try:
                status, out, err = self._run(binary, ["--version"])
            except IptablesError as error:
                return str(error)
            if status != 0:
                return f"{binary} --version failed: {_summarise(err or out)}"
            if want not in out:
                return f"{binary} is not the {self._flavor} flavour: {out.strip()}"
        return None

    def restore(self, data: Restore) -> None:
        self._saved = None
        if not data:
            return
        args = [*WAIT, "--noflush", "--counters"]
        # A big input is streamed: the tool parses its first lines while the rest are
        # printed (and rendered, for rules from a source). Its text is printed again
        # only if it fails, for the error.
        small = data.rule_count <= STREAM_RULES
        text = str(data) if small else ""
        try:
            # Nothing worth reading goes to stdout but what a ``-S`` line lists.
            status, _, stderr = self._run(
                self.restore_binary, args, text or data.chunks(), keep_stdout=False
            )
        except IptablesError as err:
            # Killed: unknown what committed.
            raise IptablesError(str(err), text or str(data), incomplete=err.incomplete) from None
        if status == 0:
            return
        text = text or str(data)
        m = _LINE.search(stderr)
        line = int(m.group(1)) if m else None
        table, committed = locate_failure(text, line) if line is not None else (None, None)
        where = f" (table {table}" + (f"; {', '.join(committed)} committed)" if committed else ")")
        raise IptablesError(
            f"{Path(self.restore_binary).name}: {_summarise(stderr)}" + (where if table else ""),
            text,
            line=line,
            table=table,
            committed=committed,
        )

    def works(self) -> str | None:
        """None if this flavour can program this kernel, else why not: creates and
        deletes a chain in the nat table in one commit. Listing is not enough: in a
        kernel whose nf_tables lacks the ip family (the user-mode-Linux guest) the nft
        flavour lists, and ``--test`` passes, but every write fails."""
        chain = "KUBE-PROXY-PROBE"
        probe = f"*nat\n:{chain} - [0:0]\n-X {chain}\nCOMMIT\n"
        try:
            status, out, err = self._run(self.restore_binary, [*WAIT, "--noflush"], probe)
        except IptablesError as error:
            return str(error)
        if status != 0:
            return f"{Path(self.restore_binary).name}: {_summarise(err or out)}"
        return None

    def save(self, table: str) -> str:
        status, out, err = self._run(self.save_binary, ["-t", table])
        if status != 0:
            raise self._fail(self.save_binary, ["-t", table], err)
        return out

    def chains(self, table: str) -> set[str]:
        if self._flavor == "nft" and self.nft_binary:
            listed = self._nft_chains(table)
            if listed is not None:
                return listed
        if self._flavor == "legacy" and not self._legacy_table_exists(table):
            return set(BUILTIN_CHAINS.get(table, ()))
        text = self.save(table)
        # Kept for a ``rules`` call that follows (a full sync's) with no change in
        # between (any command of ours drops it), instead of listing the table twice.
        self._saved = (table, text)
        return chains_from_save(text)

    def rules(self, table: str, chains: set[str]) -> dict[str, list[str]]:
        if self._flavor == "nft" and self.nft_binary:
            lines = [f"*{table}\n", *(f"-S {c}\n" for c in sorted(chains, reverse=True))]
            with contextlib.suppress(IptablesError):
                status, out, _ = self._run(
                    self.restore_binary, [*WAIT, "--noflush"], "".join([*lines, "COMMIT\n"])
                )
                if status == 0:
                    return parse_save(out)
        saved, self._saved = self._saved, None
        if saved is None or saved[0] != table:
            return parse_save(self.save(table))
        return parse_save(saved[1])

    def _nft_chains(self, table: str) -> set[str] | None:
        family = "ip6" if self._family is IPFamily.IPv6 else "ip"
        try:
            status, out, _ = self._run(self.nft_binary, ["-j", "list", "chains", family])
        except IptablesError:
            return None
        if status != 0:
            return None
        found = set(BUILTIN_CHAINS.get(table, ()))
        for item in json.loads(out).get("nftables", []):
            chain = item.get("chain")
            if isinstance(chain, dict) and chain.get("table") == table:
                found.add(str(chain.get("name")))
        return found

    def _legacy_table_exists(self, table: str) -> bool:
        names = "ip6_tables_names" if self._family is IPFamily.IPv6 else "ip_tables_names"
        path = f"/proc/net/{names}"
        if self.netns:
            status, out, _ = self._run("cat", [path])
            text = out if status == 0 else ""
        else:
            try:
                text = Path(path).read_text()
            except OSError:
                text = ""
        # No such file: the ip_tables module is not loaded yet, so no table exists.
        return table in text.split()

    def chain_exists(self, table: str, chain: str) -> bool:
        status, stderr = self._rule("-S", table, chain)
        if status == STATUS_PARAMETER:
            raise self._fail(self.iptables, ["-t", table, "-S", chain], stderr)
        return status == 0

    def ensure_chain(self, table: str, chain: str) -> bool:
        status, stderr = self._rule("-N", table, chain)
        if status == 0:
            return False
        if status == STATUS_FAILED and "exists" in stderr:
            return True
        raise self._fail(self.iptables, ["-t", table, "-N", chain], stderr)

    def ensure_rule(
        self, table: str, chain: str, args: Sequence[str], *, prepend: bool = True
    ) -> bool:
        status, stderr = self._rule("-C", table, chain, args)
        if status == 0:
            return True
        if status != STATUS_FAILED:
            raise self._fail(self.iptables, ["-t", table, "-C", chain, *args], stderr)
        op = "-I" if prepend else "-A"
        status, stderr = self._rule(op, table, chain, args)
        if status != 0:
            raise self._fail(self.iptables, ["-t", table, op, chain, *args], stderr)
        return False

    def delete_rule(self, table: str, chain: str, args: Sequence[str]) -> bool:
        status, stderr = self._rule("-D", table, chain, args)
        if status == 0:
            return True
        if status == STATUS_FAILED or any(s in stderr for s in _NOT_FOUND):
            return False
        raise self._fail(self.iptables, ["-t", table, "-D", chain, *args], stderr)


def chains_from_save(text: str) -> set[str]:
    """The chain names of ``iptables-save`` output (its ``:CHAIN POLICY [p:b]`` lines)."""
    return {line[1:].split()[0] for line in text.splitlines() if line.startswith(":")}


# ------------------------------------------------------------------------ flavour

_KUBELET_CHAINS = re.compile(r"^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY)\b", re.MULTILINE)
_RULE_LINE = re.compile(r"^-", re.MULTILINE)


def detect_flavor(
    netns: str | None = None, *, sbin: str | None = None, timeout: float = 10.0
) -> Flavor:
    """The flavour :func:`detect_flavor_why` picks."""
    return detect_flavor_why(netns, sbin=sbin, timeout=timeout)[0]


def detect_flavor_why(
    netns: str | None = None, *, sbin: str | None = None, timeout: float = 10.0
) -> tuple[Flavor, str]:
    """The flavour the node's other iptables users (kubelet) use, as the upstream image's
    ``iptables-wrapper`` (kubernetes-sigs/iptables-wrappers) decides:

    1. kubelet (1.17 and later) creates ``KUBE-IPTABLES-HINT`` or ``KUBE-KUBELET-CANARY``
       in the mangle table: if ``iptables-nft-save -t mangle`` (or ip6tables') shows one,
       nft;
    2. else if ``iptables-legacy-save`` (or ip6tables') shows one, legacy. The wrapper
       lists every table here: ``-t mangle`` would make the legacy kernel module create
       that table;
    3. else the wrapper's older shell version counted rules: legacy if the legacy
       flavour holds more rules (``-A`` lines, both families) than nft, otherwise nft.
       The current Go wrapper skips this and answers nft; we keep the count so a node
       without kubelet whose firewall is legacy is not split between two flavours.

    Every command's failure (missing binary, timeout) counts as empty output, as in the
    wrapper. Nothing is created: nft listings do not create tables.
    """

    def output(family: IPFamily, flavor: Flavor, *args: str) -> str:
        binary = _locate(command_names(family, flavor)[1], sbin)
        try:
            proc = run_tool(binary, list(args), netns=netns, timeout=timeout, package="iptables")
        except ToolError:
            return ""
        return proc.stdout if proc.returncode == 0 else ""

    families = (IPFamily.IPv4, IPFamily.IPv6)
    if any(_KUBELET_CHAINS.search(output(f, "nft", "-t", "mangle")) for f in families):
        return "nft", "kubelet's chains are in nft"
    legacy = [output(f, "legacy") for f in families]
    if any(_KUBELET_CHAINS.search(text) for text in legacy):
        return "legacy", "kubelet's chains are in legacy"
    legacy_rules = sum(len(_RULE_LINE.findall(text)) for text in legacy)
    nft_rules = sum(len(_RULE_LINE.findall(output(f, "nft"))) for f in families)
    counted = f"{legacy_rules} legacy rules, {nft_rules} nft rules"
    return ("legacy" if legacy_rules > nft_rules else "nft"), f"no kubelet chains; {counted}"
