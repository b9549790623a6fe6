"""Run a command inside a user-mode-linux guest: a real Linux 6.1 kernel with IPVS.

The host's kernel may lack IPVS (this project's CI machines do); Debian's
``user-mode-linux`` package is a kernel built to run as an ordinary process, with every
IPVS scheduler, ipsets, conntrack and network namespaces as modules. :func:`run` boots
it with the host's ``/`` as a read-only root under a tmpfs overlay (so the guest can
write anywhere and the host never changes), loads :data:`GUEST_MODULES`, mounts the
directories the caller names read-write from the host (results, logs), runs one command
and powers off. The command's stdout and stderr arrive on the caller's descriptors
byte-exact, as it writes them; its exit status is :func:`run`'s result.

* :func:`run` — boot, run, power off; a timeout kills the guest's whole process group,
  which is also killed whenever :func:`run` returns or raises.
* :func:`in_guest` — whether this process runs inside such a guest;
  :func:`legacy_iptables_first` — inside it, ``iptables`` is the legacy variant
  (:func:`legacy_iptables_dir` the same for one command, on the host too).
* ``python -m kubeproxy.lab.uml [--rw DIR]... -- COMMAND...`` — the same, by hand.

The guest side is ``uml_init.sh`` next to this file (PID 1). The guest has no network
card: its traffic never leaves it. Facts behind the choices (boot line, timings, why the
interpreter must be an absolute path rather than a pyenv shim) are in
docs/testing-ipvs.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

UML_KERNEL = "linux.uml"
INIT_SCRIPT = Path(__file__).with_name("uml_init.sh")
# Set in the guest's command environment (and only there).
GUEST_MARKER = "KUBEPROXY_UML_GUEST"

# Loaded before the command starts: sysctls (net.ipv4.vs.*, net.ipv6.*) exist only once
# their module is in, and loading every scheduler up front keeps a test from depending on
# module autoload timing. veth/dummy/ip_set would autoload; listing them costs nothing.
GUEST_MODULES = (
    "ipv6",
    "ip_vs",
    *(
        f"ip_vs_{s}"
        for s in ("rr", "wrr", "lc", "wlc", "lblc", "lblcr", "sh", "dh", "sed", "nq", "mh")
    ),
    "nf_conntrack_netlink",
    "ip_set",
    "veth",
    "dummy",
)

DEFAULT_TIMEOUT = 300.0
# The kernel's own paths, before the command's environment applies.
_SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class GuestError(RuntimeError):
    """The guest ended without reporting the command's exit status (boot failure, crash)."""


class GuestTimeoutError(GuestError):
    """The guest did not power off in time; it was killed."""


def in_guest() -> bool:
    return os.environ.get(GUEST_MARKER) == "1"


# The guest's nf_tables has no ip/ip6/inet families: ``iptables`` must be the legacy one
# there, for every program that runs it by that name (upstream kube-proxy does).
LEGACY_IPTABLES = {
    f"{family}{tool}": f"{family}-legacy{tool}"
    for family in ("iptables", "ip6tables")
    for tool in ("", "-save", "-restore")
}


def legacy_iptables_dir(directory: Path = Path("/run/kubeproxy-legacy")) -> Path:
    """``directory``, holding ``iptables`` and friends as links to their legacy variants:
    first on a PATH, it makes a program that runs plain ``iptables`` (upstream
    kube-proxy) use the legacy flavour."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, target in LEGACY_IPTABLES.items():
        link = directory / name
        if not link.is_symlink():
            link.symlink_to(shutil.which(target) or f"/usr/sbin/{target}")
    return directory


def legacy_iptables_first() -> None:
    """In the guest: ``iptables`` and friends on this process's PATH (inherited by its
    children) name the legacy variants."""
    os.environ["PATH"] = f"{legacy_iptables_dir()}{os.pathsep}{os.environ.get('PATH', '')}"


def guest_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: a clean one, the venv's bin first on PATH.

    Nothing is inherited from the host: the guest is another machine. pyenv shims are
    left out of PATH because each one costs seconds in the guest (fork+exec is ~25x
    slower there).
    """
    env = {
        "PATH": f"{Path(sys.executable).parent}:{_SYSTEM_PATH}",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        GUEST_MARKER: "1",
    }
    env.update(extra or {})
    return env


def run(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] = ".",
    env: Mapping[str, str] | None = None,
    rw_dirs: Sequence[str | os.PathLike[str]] = (),
    timeout: float = DEFAULT_TIMEOUT,
    stdout: int | IO[bytes] | IO[str] | None = None,
    stderr: int | IO[bytes] | IO[str] | None = None,
    modules: Sequence[str] = GUEST_MODULES,
    mem: str = "1024M",
) -> int:
    """Run ``argv`` in a fresh guest; its exit status.

    ``cwd`` and every ``rw_dirs`` entry are host paths, seen at the same path in the guest;
    only ``rw_dirs`` (and nothing else) are writable through to the host. ``env`` defaults
    to :func:`guest_env`. ``stdout``/``stderr`` (descriptors or files, as for
    :class:`subprocess.Popen`; ``None`` means ours) receive the command's output.
    ``argv[0]`` should be an absolute path (e.g. ``sys.executable``) or on PATH.

    Raises :class:`GuestTimeoutError` when the guest is still up after ``timeout`` seconds,
    :class:`GuestError` when it ends without an exit status; both carry the end of the
    guest's console log.
    """
    if shutil.which(UML_KERNEL) is None:
        raise GuestError(f"{UML_KERNEL} is missing: install user-mode-linux (scripts/bootstrap)")
    if not argv:
        raise ValueError("run: empty command")
    rw = [_host_dir(d) for d in rw_dirs]
    workdir = _host_dir(cwd)
    ctl = Path(tempfile.mkdtemp(prefix="kpuml-"))
    try:
        _host_dir(ctl)  # it goes on the kernel command line too
        env = guest_env() if env is None else env
        (ctl / "run.sh").write_text(
            f"cd {shlex.quote(str(workdir))} || exit 125\n"
            f"exec env -i {shlex.join(f'{k}={v}' for k, v in env.items())} {shlex.join(argv)}\n"
        )
        command = [
            UML_KERNEL,
            f"mem={mem}",
            "root=/dev/root",
            "rootfstype=hostfs",
            "rootflags=/",
            "ro",
            f"init={INIT_SCRIPT}",
            # Console on fd 3 (console.log); serial lines 0 and 1 on our stdout/stderr.
            "con=null",
            "ssl=null",
            "con0=null,fd:3",
            "ssl0=null,fd:1",
            "ssl1=null,fd:2",
            f"uml_dir={ctl}",
            "umid=guest",
            "quiet",
            f"kp_ctl={ctl}",
            # The guest's own deadline, a little after ours: for when we die first.
            f"kp_timeout={int(timeout) + 10}",
        ]
        if rw:
            command.append(f"kp_rw={','.join(map(str, rw))}")
        if modules:
            command.append(f"kp_modules={','.join(modules)}")
        return _boot(command, ctl, timeout, stdout, stderr)
    finally:
        shutil.rmtree(ctl, ignore_errors=True)


def _boot(
    command: list[str],
    ctl: Path,
    timeout: float,
    stdout: int | IO[bytes] | IO[str] | None,
    stderr: int | IO[bytes] | IO[str] | None,
) -> int:
    console = ctl / "console.log"
    proc = subprocess.Popen(
        # The boot line wants the console on descriptor 3; the shell puts it there.
        ["sh", "-c", 'exec "$@" 3>console.log', "sh", *command],
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        cwd=ctl,
    )
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        raise GuestTimeoutError(
            f"the guest was still running after {timeout:.0f}s and was killed; console:\n"
            + _tail(console)
        ) from None
    finally:
        _kill_group(proc)
    status = ctl / "rc"
    if not status.exists():
        raise GuestError(
            f"the guest ended (status {proc.returncode}) without running the command to "
            "its end; console:\n" + _tail(console)
        )
    return int(status.read_text().strip())


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the guest's process group and wait until it is gone (UML runs as several
    processes, all in the session it leads)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def _host_dir(path: str | os.PathLike[str]) -> Path:
    """An absolute host directory that can be named on the kernel command line."""
    resolved = Path(path).resolve()
    if not resolved.is_dir():
        raise ValueError(f"{path}: not a directory")
    if any(c.isspace() or c == "," for c in str(resolved)):
        raise ValueError(f"{resolved}: a guest mount path cannot contain spaces or commas")
    return resolved


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no console log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty console log)"


def main(args: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kubeproxy.lab.uml",
        description="Run a command inside a user-mode-linux guest with a real IPVS kernel.",
    )
    parser.add_argument(
        "--rw", action="append", default=[], metavar="DIR", help="a host directory to write to"
    )
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS")
    parser.add_argument("command", nargs="+", help="the command (after --)")
    opts = parser.parse_args(args)
    try:
        return run(opts.command, rw_dirs=opts.rw, timeout=opts.timeout)
    except (GuestError, ValueError) as err:
        print(f"kubeproxy.lab.uml: {err}", file=sys.stderr)
        return 125


if __name__ == "__main__":
    sys.exit(main())
