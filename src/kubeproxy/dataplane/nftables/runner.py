"""The one place that talks to nftables: apply a transaction as one atomic kernel batch.

:class:`NftRunner` is the small interface backends depend on. It takes a
:class:`~kubeproxy.dataplane.nftables.transaction.Transaction` (data, not text), so the
strict in-memory fake (:mod:`kubeproxy.dataplane.nftables.fake`) can stand in for the
kernel in unprivileged tests. Two real implementations: :class:`LibNftables` runs scripts
in-process through ``libnftables`` (the library behind the ``nft`` command, reached with
ctypes), which saves spawning a process per transaction (~10 ms, most of a partial
sync); :class:`NftCommand` runs the ``nft`` binary and is the fallback when the library
cannot be loaded. :func:`open_runner` picks. Real-kernel tests run them in throw-away
network namespaces.

(The nftables project's own Python binding is packaged by Debian for the system Python
only; the handful of C calls needed here are not worth a vendored copy of it.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import shutil
import threading
from typing import Any, Protocol

from kubeproxy.dataplane.errors import DataplaneError
from kubeproxy.dataplane.nftables.transaction import Transaction
from kubeproxy.dataplane.process import ToolError, run_tool

DEFAULT_TIMEOUT = 60.0  # seconds an ``nft`` process may take before it is killed


class NftError(DataplaneError):
    """nft refused a transaction; nothing from it was applied (nft batches are atomic).

    ``incomplete``: nft did not answer at all (killed after its timeout, or missing), so
    nothing is known about the transaction itself: retrying another form of it (a full
    sync after a partial one, a replacement after a flush) would only wait again.
    """

    tool = "nft"

    def __init__(self, message: str, script: str, *, incomplete: bool = False) -> None:
        super().__init__(message, incomplete=incomplete)
        self.script = script


class NftRunner(Protocol):
    def apply(self, tx: Transaction) -> None:
        """Apply a transaction atomically or raise NftError having changed nothing."""

    def check(self, tx: Transaction) -> None:
        """Validate a transaction without applying it (``nft -c``); NftError if invalid."""

    def list_tables(self) -> list[tuple[str, str]]:
        """(family, name) of every table in this network namespace.

        nft fetches the whole ruleset for this (iptables-nft's rules included, and again
        whenever the ruleset changes meanwhile): ~1 s with 20,000 iptables-nft rules.
        Use :meth:`has_table` to look for a table by name."""

    def has_table(self, family: str, table: str) -> bool:
        """Whether the table exists (fetching only that table, terse)."""

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        """Names of the chains, sets and maps in a table (empty if it does not exist).

        Terse listing: set elements are not transferred, so this stays cheap however
        many Services there are.
        """


def _objects_from_json(text: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"chain": set(), "set": set(), "map": set()}
    for item in json.loads(text).get("nftables", []):
        for kind, names in found.items():
            obj = item.get(kind)
            if isinstance(obj, dict) and isinstance(obj.get("name"), str):
                names.add(obj["name"])
    return found


def _tables_from_text(text: str) -> list[tuple[str, str]]:
    tables = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "table":
            tables.append((parts[1], parts[2]))
    return tables


def _missing_table(message: str) -> bool:
    return "No such file or directory" in message


class _ScriptRunner:
    """A transaction is applied (or checked) as its script."""

    def apply(self, tx: Transaction) -> None:
        self.apply_script(str(tx))

    def check(self, tx: Transaction) -> None:
        self.check_script(str(tx))

    def apply_script(self, script: str) -> None:
        raise NotImplementedError

    def check_script(self, script: str) -> None:
        raise NotImplementedError


class NftCommand(_ScriptRunner):
    """Runs the ``nft`` binary (in another network namespace when ``netns`` is given).

    A process that takes longer than ``timeout`` seconds is killed and the call fails
    (nothing applied: the kernel commits a batch only when nft finishes it), so a hung
    ``nft`` cannot stall syncing forever.
    """

    # Transactions the caller may apply at once (from threads): each is a process of
    # its own, and the kernel commits them one at a time.
    concurrent_applies = 2

    def __init__(
        self, binary: str | None = None, netns: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        found = binary or shutil.which("nft") or "/usr/sbin/nft"
        self.binary = found
        self.timeout = timeout
        self.netns = netns

    def _run(self, args: list[str], script: str | None = None) -> str:
        try:
            proc = run_tool(
                self.binary,
                args,
                netns=self.netns,
                input=script,
                timeout=self.timeout,
                package="nftables",
            )
        except ToolError as err:
            raise NftError(str(err), script or "", incomplete=True) from None
        if proc.returncode != 0:
            raise NftError(_summarise(proc.stderr), script or "")
        return proc.stdout

    def available(self) -> str | None:
        """None if the binary runs; otherwise why not."""
        try:
            self._run(["--version"])
        except NftError as err:
            return str(err)
        return None

    def apply_script(self, script: str) -> None:
        if script:
            self._run(["-f", "-"], script)

    def check_script(self, script: str) -> None:
        if script:
            self._run(["-c", "-f", "-"], script)

    def list_tables(self) -> list[tuple[str, str]]:
        return _tables_from_text(self._run(["list", "tables"]))

    def has_table(self, family: str, table: str) -> bool:
        try:
            self._run(["-t", "list", "table", family, table])
        except NftError as err:
            if _missing_table(str(err)):
                return False
            raise
        return True

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        try:
            return _objects_from_json(self._run(["-j", "-t", "list", "table", family, table]))
        except NftError as err:
            if _missing_table(str(err)):
                return _objects_from_json("{}")
            raise


# Output flags from <nftables/libnftables.h>.
_OUTPUT_JSON = 1 << 4
_OUTPUT_TERSE = 1 << 11


class LibNftables(_ScriptRunner):
    """libnftables through ctypes: one long-lived context, one call per transaction."""

    def __init__(self, library: str | None = None) -> None:
        path = library or ctypes.util.find_library("nftables") or "libnftables.so.1"
        lib = ctypes.CDLL(path, use_errno=True)
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, name).restype = ctypes.c_int
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        for name in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, name).restype = ctypes.c_char_p
            getattr(lib, name).argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_ctx_output_get_flags.restype = ctypes.c_uint
        lib.nft_ctx_output_get_flags.argtypes = [ctypes.c_void_p]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        lib.nft_ctx_set_dry_run.argtypes = [ctypes.c_void_p, ctypes.c_bool]
        self._lib: Any = lib
        self._ctx = lib.nft_ctx_new(0)
        if not self._ctx:
            raise OSError("nft_ctx_new failed")
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)
        # One context is not safe for concurrent use; syncs are serialised anyway.
        self._lock = threading.Lock()

    def _run(self, script: str, *, flags: int = 0, dry_run: bool = False) -> str:
        lib = self._lib
        with self._lock:
            lib.nft_ctx_output_set_flags(self._ctx, flags)
            lib.nft_ctx_set_dry_run(self._ctx, dry_run)
            try:
                rc = lib.nft_run_cmd_from_buffer(self._ctx, script.encode())
                out = (lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode()
                err = (lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode()
            finally:
                lib.nft_ctx_set_dry_run(self._ctx, False)
        if rc != 0:
            raise NftError(_summarise(err), script)
        return out

    def apply_script(self, script: str) -> None:
        if script:
            self._run(script)

    def check_script(self, script: str) -> None:
        if script:
            self._run(script, dry_run=True)

    def list_tables(self) -> list[tuple[str, str]]:
        return _tables_from_text(self._run("list tables"))

    def has_table(self, family: str, table: str) -> bool:
        try:
            self._run(f"list table {family} {table}", flags=_OUTPUT_TERSE)
        except NftError as err:
            if _missing_table(str(err)):
                return False
            raise
        return True

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        try:
            out = self._run(f"list table {family} {table}", flags=_OUTPUT_JSON | _OUTPUT_TERSE)
        except NftError as err:
            if _missing_table(str(err)):
                return _objects_from_json("{}")
            raise
        return _objects_from_json(out)

    def close(self) -> None:
        if self._ctx:
            self._lib.nft_ctx_free(self._ctx)
            self._ctx = None


class HybridRunner:
    """Small transactions in-process, big ones in an ``nft`` process.

    libnftables parses a script in the calling process, and the C heap it uses for a
    full sync of a large cluster (hundreds of MB for 10,000 Services) is not given back
    to the system. A full sync spends ~1 s in the kernel anyway, so the ~10 ms of a
    process spawn does not matter there, and the memory goes away with the process;
    partial syncs are small and stay in-process, where they are fastest.
    """

    concurrent_applies = NftCommand.concurrent_applies

    def __init__(
        self, library: LibNftables, command: NftCommand, threshold: int = 256 * 1024
    ) -> None:
        self.library = library
        self.command = command
        self.threshold = threshold

    def _pick(self, script: str) -> LibNftables | NftCommand:
        return self.command if len(script) > self.threshold else self.library

    def apply(self, tx: Transaction) -> None:
        script = str(tx)
        self._pick(script).apply_script(script)

    def apply_separately(self, tx: Transaction) -> None:
        """In an ``nft`` process whatever its size: the pieces of a new table, applied
        two at a time from threads (never the one library context) and whose parse
        should not stay in this process's heap."""
        self.command.apply_script(str(tx))

    def check(self, tx: Transaction) -> None:
        script = str(tx)
        self._pick(script).check_script(script)

    def available(self) -> str | None:
        return self.command.available()

    def list_tables(self) -> list[tuple[str, str]]:
        return self.library.list_tables()

    def has_table(self, family: str, table: str) -> bool:
        return self.library.has_table(family, table)

    def list_objects(self, family: str, table: str) -> dict[str, set[str]]:
        return self.library.list_objects(family, table)


def open_runner() -> NftRunner:
    """libnftables (with the nft binary for big scripts) when it loads, else the binary."""
    try:
        return HybridRunner(LibNftables(), NftCommand())
    except (OSError, AttributeError):
        return NftCommand()


def _summarise(stderr: str, limit: int = 20) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if len(lines) > limit:
        lines = [*lines[:limit], f"... ({len(lines) - limit} more lines)"]
    return "nft: " + "\n".join(lines) if lines else "nft failed with no output"
