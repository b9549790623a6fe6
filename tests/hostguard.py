"""The suite's guard of the host: a root run leaves the machine's own network namespace
as it found it.

Tests program the kernel only inside network namespaces they create; a test that builds
a backend in its own process (which lives in the host's namespace) and lets it write
through the host's /proc once set ``net.ipv4.conf.all.route_localnet=1`` on the machine
(the CVE-2020-8558 exposure, inherited by every namespace created after it). This guard
makes such a write a failure of the run, naming the test module that made it.

* :func:`snapshot` reads the host's state: the network sysctls (``net.ipv4`` and its
  ``conf/{all,default}``, ``net.ipv6.conf.{all,default}``, ``net.core``,
  ``net.netfilter``, ``net.bridge``, ``net.ipv4.vs``), the conntrack hash size (a module
  parameter: global, also when written from a namespace), the root namespace's rules
  (nftables, both iptables flavours and families, ipset) without counters, its links,
  the files of kubeproxy's default manifest parse cache (``run --manifests``
  without ``--manifests-cache-dir`` keeps a file per directory there, for good), the
  host's BPF filesystem and cgroup mount points (one a test mounted and left), what is
  pinned in the host's BPF filesystem, and kubeproxy's entries in /run.
* :class:`HostGuard` (a pytest plugin, registered by tests/conftest.py on a root run
  outside the IPVS guest) snapshots at the start, compares after each test module's
  teardown, restores what changed and fails the run, listing each change under the
  module after which it was seen. Leaked network namespaces are looked for once, at
  the end (session fixtures hold some until then): those made during the run and named
  after its process, as the suite names them (``kpt<pid>x0-node``), so a second run
  beside this one is neither blamed nor disturbed.

Values that move on their own are left out: counters (``nf_conntrack_count``, packet
and byte counts) and the write-only ``route/flush``-like files.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PROC_NET = Path("/proc/sys/net")
# Directories whose files are read recursively (relative to /proc/sys/net) ...
TREES = (
    "ipv4/conf/all",
    "ipv4/conf/default",
    "ipv6/conf/all",
    "ipv6/conf/default",
    "netfilter",
    "bridge",
    "ipv4/vs",
)
# ... and those whose own files only are (their subdirectories are per device or move).
FLAT = ("ipv4", "core")
# Counters and values the kernel changes by itself.
MOVING = frozenset({"netfilter/nf_conntrack_count"})
HASHSIZE = Path("/sys/module/nf_conntrack/parameters/hashsize")
PARSE_CACHE = Path("/var/cache/kubeproxy/manifests")
MOUNTINFO = Path("/proc/self/mountinfo")
BPFFS = Path("/sys/fs/bpf")
RUN = Path("/run")
RUN_KEY = "/run/kubeproxy*"
WATCHED_MOUNTS = frozenset({"bpf", "cgroup", "cgroup2"})
# Name lists (space-separated): compared and restored by name.
LISTS = (str(PARSE_CACHE), "links", "mounts", str(BPFFS), RUN_KEY)

COUNTERS = re.compile(r"counter packets \d+ bytes \d+|\[\d+:\d+\]")
# iptables-save's and nft's comment lines carry dates and versions.
COMMENT = re.compile(r"^#.*$", re.MULTILINE)
# The root namespace's rules, each as (name, listing command, restore command).
RULESETS = (
    ("nftables", ["nft", "list", "ruleset"], None),
    ("iptables-legacy", ["iptables-legacy-save"], ["iptables-legacy-restore"]),
    ("ip6tables-legacy", ["ip6tables-legacy-save"], ["ip6tables-legacy-restore"]),
    ("iptables-nft", ["iptables-nft-save"], ["iptables-nft-restore"]),
    ("ip6tables-nft", ["ip6tables-nft-save"], ["ip6tables-nft-restore"]),
    ("ipset", ["ipset", "save"], None),
)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as err:  # write-only, or EIO until set (ipv6 stable_secret)
        return f"<{err.strerror or err}>"


def sysctls(proc_net: Path = PROC_NET) -> dict[str, str]:
    """The guarded sysctls under ``proc_net``, by dotted name, and the conntrack hash
    size."""
    out: dict[str, str] = {}
    files: list[Path] = []
    for tree in TREES:
        files.extend(p for p in (proc_net / tree).rglob("*") if p.is_file())
    for flat in FLAT:
        with contextlib.suppress(OSError):
            files.extend(p for p in (proc_net / flat).iterdir() if p.is_file())
    for path in files:
        relative = path.relative_to(proc_net).as_posix()
        if relative not in MOVING:
            out["net." + relative.replace("/", ".")] = _read(path)
    if HASHSIZE.exists():
        out[str(HASHSIZE)] = _read(HASHSIZE)
    return out


def _listing(command: list[str]) -> str | None:
    """A command's output, counters and comments taken out; None if it cannot run."""
    if shutil.which(command[0]) is None:
        return None
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        return f"<exit {done.returncode}: {done.stderr.strip()}>"
    return COMMENT.sub("", COUNTERS.sub("", done.stdout)).strip()


def rulesets() -> dict[str, str]:
    out = {}
    for name, command, _ in RULESETS:
        text = _listing(command)
        if text is not None:
            out[f"rules {name}"] = text
    return out


def links() -> dict[str, str]:
    """The root namespace's links by name (a veth end left behind by a test)."""
    text = _listing(["ip", "-o", "link", "show"]) or ""
    names = sorted(m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", text, re.MULTILINE))
    return {"links": " ".join(names)}


def cache_files() -> dict[str, str]:
    names = sorted(p.name for p in PARSE_CACHE.glob("*")) if PARSE_CACHE.is_dir() else []
    return {str(PARSE_CACHE): " ".join(names)}


def mounts() -> dict[str, str]:
    """The host's BPF filesystem and cgroup mount points (one a test mounted and left).
    Other types are left out: the machine's own come and go (a sandbox's tools), and
    ``ip netns add`` mounts /run/netns the first time (leaked namespaces are reported
    at the end, by name)."""
    points = set()
    for line in _read(MOUNTINFO).splitlines():
        fields = line.split()
        if " - " in line and len(fields) > 4:
            fstype = line.split(" - ", 1)[1].split()[0]
            if fstype in WATCHED_MOUNTS:
                points.add(fields[4])
    return {"mounts": " ".join(sorted(points))}


def host_files() -> dict[str, str]:
    """Pins in the host's BPF filesystem, and kubeproxy's entries in /run."""
    pins = sorted(str(p) for p in BPFFS.rglob("*")) if BPFFS.is_dir() else []
    ours = sorted(p.name for p in RUN.glob("kubeproxy*"))
    return {str(BPFFS): " ".join(pins), RUN_KEY: " ".join(ours)}


def snapshot(proc_net: Path = PROC_NET) -> dict[str, str]:
    return {
        **sysctls(proc_net),
        **rulesets(),
        **links(),
        **cache_files(),
        **mounts(),
        **host_files(),
    }


def namespaces() -> set[str]:
    text = _listing(["ip", "netns", "list"]) or ""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """One line per changed entry (a ruleset's by its first differing line)."""
    out = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, "<absent>"), after.get(key, "<absent>")
        if old == new:
            continue
        lists = key in LISTS
        if "\n" in old or "\n" in new or lists:
            split = str.split if lists else str.splitlines
            gone = sorted(set(split(old)) - set(split(new)))
            added = sorted(set(split(new)) - set(split(old)))
            what = "; ".join(
                [f"+ {line.strip()}" for line in added[:3]]
                + [f"- {line.strip()}" for line in gone[:3]]
            )
            out.append(f"{key} changed: {what or 'order only'}")
        else:
            out.append(f"{key}: {old!r} -> {new!r}")
    return out


def _run(command: list[str], stdin: str | None = None) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            command, input=stdin, capture_output=True, text=True, timeout=60, check=False
        )


def restore(
    before: dict[str, str],
    after: dict[str, str],
    saved: dict[str, str],
    proc_net: Path = PROC_NET,
) -> None:
    """Put back what changed: sysctls written back, iptables tables restored from what
    was saved at the start (``saved``: raw saves), nftables tables the run added deleted,
    links the run added deleted."""
    for key, old in before.items():
        if after.get(key) == old or old.startswith("<"):
            continue
        if key.startswith("net."):
            path = proc_net / key.removeprefix("net.").replace(".", "/")
            with contextlib.suppress(OSError):
                path.write_text(old)
        elif key == str(HASHSIZE):
            with contextlib.suppress(OSError):
                HASHSIZE.write_text(old)
    for name, _, restore_command in RULESETS:
        key = f"rules {name}"
        if before.get(key) == after.get(key):
            continue
        if restore_command is not None and key in saved:
            _run(restore_command, saved[key])
    old_tables = set(re.findall(r"^table (\S+ \S+)", before.get("rules nftables", ""), re.M))
    for table in re.findall(r"^table (\S+ \S+)", after.get("rules nftables", ""), re.M):
        if table not in old_tables:
            _run(["nft", "delete", "table", *table.split()])
    old_links = set(before.get("links", "").split())
    for name in set(after.get("links", "").split()) - old_links:
        _run(["ip", "link", "delete", name])
    old_files = set(before.get(str(PARSE_CACHE), "").split())
    for name in set(after.get(str(PARSE_CACHE), "").split()) - old_files:
        (PARSE_CACHE / name).unlink(missing_ok=True)
    old_mounts = set(before.get("mounts", "").split())
    # The deepest first: a pin or cgroup mounted below another mount the test made.
    for point in sorted(set(after.get("mounts", "").split()) - old_mounts, reverse=True):
        _run(["umount", "--lazy", point])
    old_pins = set(before.get(str(BPFFS), "").split())
    for pin in sorted(set(after.get(str(BPFFS), "").split()) - old_pins, reverse=True):
        _remove(Path(pin))
    old_run = set(before.get(RUN_KEY, "").split())
    for name in set(after.get(RUN_KEY, "").split()) - old_run:
        _remove(RUN / name)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def raw_saves() -> dict[str, str]:
    """The iptables tables as saved (counters included), for :func:`restore`."""
    out = {}
    for name, command, restore_command in RULESETS:
        if restore_command is None or shutil.which(command[0]) is None:
            continue
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode == 0:
            out[f"rules {name}"] = done.stdout
    return out


@dataclass(eq=False)  # a plugin is registered by identity (pluggy hashes it)
class HostGuard:
    """The pytest plugin: see the module docstring."""

    proc_net: Path = PROC_NET
    before: dict[str, str] = field(default_factory=dict)
    saved: dict[str, str] = field(default_factory=dict)
    netns: set[str] = field(default_factory=set)
    # module (node id) -> what changed after it
    changes: dict[str, list[str]] = field(default_factory=dict)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.before = snapshot(self.proc_net)
        self.saved = raw_saves()
        self.netns = namespaces()

    def check(self, where: str) -> None:
        after = snapshot(self.proc_net)
        found = differences(self.before, after)
        if found:
            self.changes.setdefault(where, []).extend(found)
            restore(self.before, after, self.saved, self.proc_net)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
        yield
        # After the teardown: the module's fixtures are gone when the next test is in
        # another module (or there is none).
        if nextitem is None or nextitem.path != item.path:
            self.check(item.nodeid.split("::")[0])
        if nextitem is None:
            mine = str(os.getpid() % 10000)  # "% 100000" names contain it too
            leaked = {n for n in namespaces() - self.netns if mine in n}
            if leaked:
                self.changes.setdefault("the session", []).append(
                    f"network namespaces left behind: {' '.join(sorted(leaked))}"
                )
                for name in leaked:
                    _run(["ip", "netns", "delete", name])

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.changes and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.changes:
            return
        write = terminalreporter.write_line
        write("=" * 78, red=True, bold=True)
        write(
            "FAILED: the run changed the host's own network namespace (restored; "
            "tests/hostguard.py):",
            red=True,
            bold=True,
        )
        for where, found in self.changes.items():
            write(f"  after {where}:", red=True)
            for line in found:
                write(f"    {line[:300]}", red=True)
        write("=" * 78, red=True, bold=True)
