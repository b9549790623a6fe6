"""A bench module run again inside the user-mode-Linux guest (:mod:`kubeproxy.lab.uml`).

The host kernel has no IPVS, the guest's has: ``--modes ipvs`` benches re-run
themselves there, the whole lab included (control plane, nodes, proxies, probes), with
this source tree, the upstream binaries found (or built) here, and the directories they
write through to the host. Inside, ``iptables`` is the legacy variant (the guest's
nf_tables has no ip families).
"""

from __future__ import annotations

import compileall
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kubeproxy.lab import uml
from kubeproxy.lab.kube.binaries import find

ROOT = Path(__file__).resolve().parents[1]
# The guest runs the control plane too (about 1 GB with the proxies and echo servers).
MEMORY = "3G"
TIMEOUT = 6 * 3600.0


def rerun(
    module: str,
    argv: Sequence[str],
    rw_dirs: Sequence[Path],
    *,
    timeout: float = TIMEOUT,
) -> int:
    """``python -m module argv`` in a fresh guest; its exit status. The tree is
    byte-compiled here first: the guest sees it read-only."""
    compileall.compile_dir(ROOT / "src", quiet=1)
    env = uml.guest_env(
        {
            "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}",
            "KUBEPROXY_UPSTREAM_BIN": str(find().directory),
        }
    )
    command = [sys.executable, "-m", module, *argv]
    return uml.run(command, cwd=ROOT, env=env, rw_dirs=list(rw_dirs), timeout=timeout, mem=MEMORY)


def inside() -> None:
    """In the guest (a no-op elsewhere): ``iptables`` names the legacy variant from here
    on, for this process and its children."""
    if uml.in_guest():
        uml.legacy_iptables_first()
