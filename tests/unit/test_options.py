"""The KubeproxyOptions document of a --config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.config.options import OptionsError, split_config

UPSTREAM = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"


def test_a_single_document_is_left_alone() -> None:
    text, options = split_config(UPSTREAM, "/etc/kp/config.yaml")
    assert text == UPSTREAM
    assert options.manifests is None and options.service_cluster_ip_ranges == ()


def test_options_document_is_split_off_and_paths_are_relative_to_the_file() -> None:
    text, options = split_config(
        UPSTREAM + "---\napiVersion: kubeproxy.dev/v1alpha1\nkind: KubeproxyOptions\n"
        "manifests: objects\nserviceClusterIPRanges: [10.96.0.0/12]\n",
        "/etc/kp/config.yaml",
    )
    assert "KubeproxyOptions" not in text and "KubeProxyConfiguration" in text
    assert options.manifests == Path("/etc/kp/objects")
    assert options.service_cluster_ip_ranges == ("10.96.0.0/12",)


@pytest.mark.parametrize(
    "extra",
    [
        "apiVersion: v1\nkind: KubeproxyOptions\n",
        "apiVersion: kubeproxy.dev/v1alpha1\nkind: KubeproxyOptions\nbogus: 1\n",
        "apiVersion: kubeproxy.dev/v1alpha1\nkind: KubeproxyOptions\nmanifests: [a]\n",
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
    ],
)
def test_bad_options_are_errors(extra: str) -> None:
    with pytest.raises(OptionsError, match=r"c\.yaml.*: (apiVersion|bogus|manifests|expected one)"):
        split_config(UPSTREAM + "---\n" + extra, "c.yaml")
