"""A failed apply keeps the previous rules in place, is logged, and is retried."""

from __future__ import annotations

import time
from pathlib import Path

from kubeproxy.lab.cluster import NODE, Lab
from kubeproxy.lab.echo import tally, tcp_ask
from kubeproxy.lab.objects import Ep, ManifestDir, endpoint_slice, service
from tests.kernel.conftest import ip

ROOT = Path(__file__).resolve().parents[2]


def test_refused_apply_keeps_old_rules_and_retries(
    lab: Lab, manifests: ManifestDir, tmp_path: Path
) -> None:
    manifests.write(
        "svc.yaml",
        service("web", "10.96.8.1"),
        endpoint_slice("web", [Ep(ip("local-1"), node=NODE)]),
    )
    first = lab.sync_once(manifests.path)
    assert first.returncode == 0, first.stderr

    # Now a kubeproxy without CAP_NET_ADMIN: the kernel refuses every transaction, for
    # real. It must log the failure, keep running and retry with backoff.
    manifests.write(
        "svc.yaml",
        service("web", "10.96.8.1"),
        endpoint_slice("web", [Ep(ip("remote-1"), node="node-b")]),
    )
    log = tmp_path / "kubeproxy.log"
    # Same uid, no capability at all (so no CAP_NET_ADMIN).
    unprivileged = ("setpriv", "--bounding-set=-all", "--inh-caps=-all")
    proc = lab.spawn(lab.kubeproxy_args(manifests.path, prefix=unprivileged), log=log)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and log.read_text().count("Sync failed after") < 2:
            time.sleep(0.2)
        text = log.read_text()
        assert text.count("Sync failed after") >= 2, text
        assert "retrying in 1.0s" in text and "retrying in 2.0s" in text, text
        assert proc.poll() is None, "a failed sync must not stop the proxy"
        # The rules of the last good sync still carry traffic.
        assert lab.in_pod("client").call(tally, tcp_ask, "10.96.8.1", 80, count=5) == {"local-1": 5}
    finally:
        proc.terminate()
        proc.wait(10)
