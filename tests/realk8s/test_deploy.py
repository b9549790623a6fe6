"""deploy/ applied to the real API server as docs/replacing-kube-proxy.md applies it
(``kubectl apply -k`` / ``-f``), with ``--dry-run=server``: validation, defaulting and
admission run as for a real apply, and nothing is stored (the session's kubeproxy runs
as deploy/'s ServiceAccount; a real apply of an overlay would be a no-op at best).

Found here: the lab's API server refused every DaemonSet with a privileged container
(deploy/'s init container, ``kube-proxy-cleanup``): ``--allow-privileged`` is off unless
set, and kubeadm and kind set it. The lab now does too; the manifests needed no change.

deploy/monitoring needs the Prometheus Operator's CRDs (ServiceMonitor, PrometheusRule),
which this lab does not have (no package here ships them): its plain objects are
accepted and the two custom ones are refused only for their unknown kinds, which
tests/unit/test_monitoring.py checks otherwise.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from kubeproxy.lab.kube.cluster import ROOT, KubeLab

DEPLOY = ROOT / "deploy"
OVERLAYS = sorted(p.name for p in (DEPLOY / "overlays").iterdir() if p.is_dir())


def names(kube: KubeLab, *source: str) -> set[str]:
    """``kind/name`` of every object ``source`` (``-k DIR`` or ``-f PATH``) holds, as
    ``kubectl ... -o name`` prints them, from the manifests themselves."""
    if source[0] == "-k":
        text = kube.kubectl("kustomize", source[1]).stdout
    else:
        paths = sorted((ROOT / source[1]).glob("*.yaml"))
        text = "\n---\n".join(p.read_text() for p in paths)
    out = set()
    for doc in yaml.safe_load_all(text):
        if doc:
            group = doc["apiVersion"].rpartition("/")[0]
            kind = doc["kind"].lower() + (f".{group}" if group else "")
            out.add(f"{kind}/{doc['metadata']['name']}")
    return out


def dry_run(kube: KubeLab, *source: str) -> subprocess.CompletedProcess[str]:
    return kube.kubectl("apply", "--dry-run=server", "-o", "name", *source, check=False)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_is_accepted(kube: KubeLab, overlay: str) -> None:
    source = ("-k", str(DEPLOY / "overlays" / overlay))
    out = dry_run(kube, *source)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == names(kube, *source)
    assert "daemonset.apps/kubeproxy" in out.stdout


@pytest.mark.parametrize("directory", ["cleanup", "preflight"])
def test_the_one_shot_manifests_are_accepted(kube: KubeLab, directory: str) -> None:
    source = ("-f", str(DEPLOY / directory))
    out = dry_run(kube, *source)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == names(kube, *source)


def test_monitoring_needs_only_the_prometheus_operators_crds(kube: KubeLab) -> None:
    source = ("-k", str(DEPLOY / "monitoring"))
    out = dry_run(kube, *source)
    custom = {n for n in names(kube, *source) if ".monitoring.coreos.com/" in n}
    assert custom == {
        "servicemonitor.monitoring.coreos.com/kubeproxy",
        "prometheusrule.monitoring.coreos.com/kubeproxy",
    }
    assert out.returncode != 0
    assert set(out.stdout.split()) == names(kube, *source) - custom
    refusals = [line for line in out.stderr.splitlines() if "resource mapping not found" in line]
    assert len(refusals) == 2, out.stderr
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert any(f'no matches for kind "{kind}"' in line for line in refusals), out.stderr
