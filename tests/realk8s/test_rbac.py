"""deploy/base/rbac.yaml's ClusterRole is exactly what kubeproxy needs, on the real API
server and its RBAC authorizer.

* **Enough**: a kubeproxy holding a token of deploy/'s ServiceAccount lists, watches,
  programs a change and records its Event with not one 403 in its log.
* **Nothing superfluous**: for every verb the ClusterRole grants, a copy of it without
  that verb, bound to a second ServiceAccount, gets kubeproxy refused exactly that verb
  (``list``: the one-shot ``kubeproxy list`` exits 1 naming verb and resource; ``watch``
  and ``create``: the proxy logs the 403), and nothing else.
* **Nothing more**: ``kubectl auth can-i --list`` for the ServiceAccount shows those verbs
  and what every authenticated user may do, no more.

Found here: the ClusterRole was upstream's ``system:node-proxier`` (without Endpoints),
and three of its grants are upstream kube-proxy's, not kubeproxy's: ``get`` on nodes
(kube-proxy reads its Node once at start; kubeproxy lists and watches it), ``patch`` and
``update`` on events (client-go's recorder patches a repeated event's series; kubeproxy
posts one event per start), and events in the core API group (client-go falls back to
it; kubeproxy posts events.k8s.io/v1). They were removed from deploy/.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.kube.cluster import DEPLOY, KubeLab, wait_for
from tests.realk8s.opslab import (
    allowed,
    can_i,
    events_about,
    kubeproxy,
    service_account_kubeconfig,
    service_account_token,
    spare_host,
    start_proxy,
)

ROLE = next(
    d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d["kind"] == "ClusterRole"
)
PROXY_USER = "system:serviceaccount:kube-system:kubeproxy"
PROBE = "kubeproxy-rbac-probe"  # the second ServiceAccount, its ClusterRole and binding
PROBE_USER = f"system:serviceaccount:kube-system:{PROBE}"
# (API group, resource, verb) for every verb the ClusterRole grants.
GRANTS = [
    (group, resource, verb)
    for rule in ROLE["rules"]
    for group in rule["apiGroups"]
    for resource in rule["resources"]
    for verb in rule["verbs"]
]
# What kubeproxy does with the API: list+watch its four resources, post one Event.
NEEDED = {
    ("services", "list"), ("services", "watch"),
    ("nodes", "list"), ("nodes", "watch"),
    ("endpointslices.discovery.k8s.io", "list"), ("endpointslices.discovery.k8s.io", "watch"),
    ("servicecidrs.networking.k8s.io", "list"), ("servicecidrs.networking.k8s.io", "watch"),
    ("events.events.k8s.io", "create"),
}  # fmt: skip


def denial(verb: str, resource: str, group: str) -> str:
    """How the API server's 403 names what it refused."""
    return f'cannot {verb} resource "{resource}" in API group "{group}"'


def rules_without(missing: tuple[str, str, str]) -> list[dict[str, Any]]:
    """The ClusterRole's rules with one (group, resource, verb) taken out."""
    kept: dict[tuple[str, str], list[str]] = {}
    for group, resource, verb in GRANTS:
        if (group, resource, verb) != missing:
            kept.setdefault((group, resource), []).append(verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": verbs}
        for (group, resource), verbs in kept.items()
    ]


@pytest.fixture(scope="module")
def probe_account(kube: KubeLab) -> Iterator[Path]:
    """ServiceAccount kube-system/kubeproxy-rbac-probe bound to ClusterRole
    kubeproxy-rbac-probe (whose rules each test sets); a kubeconfig with its token."""
    api = kube.api()
    api.create({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": PROBE, "namespace": "kube-system"},
    })  # fmt: skip
    api.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": PROBE}, "rules": [],
    })  # fmt: skip
    api.create({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": PROBE},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": PROBE},
        "subjects": [{"kind": "ServiceAccount", "name": PROBE, "namespace": "kube-system"}],
    })  # fmt: skip
    try:
        token = service_account_token(kube, PROBE, "kube-system")
        yield service_account_kubeconfig(kube, kube.workdir / f"{PROBE}.kubeconfig", token)
    finally:
        api.delete("ClusterRoleBinding", PROBE)
        api.delete("ClusterRole", PROBE)
        api.delete("ServiceAccount", PROBE, "kube-system")


@pytest.fixture(scope="module")
def host(kube: KubeLab) -> Iterator[str]:
    with spare_host(kube, "rbac", 50) as ns:
        yield ns


def test_with_its_cluster_role_kubeproxy_is_never_refused_and_records_its_event(
    kube: KubeLab, namespace: str, host: str
) -> None:
    token = kube.kubeproxy_token()  # deploy/'s ServiceAccount, bound to deploy/'s role
    config = service_account_kubeconfig(kube, kube.workdir / "rbac-full.kubeconfig", token)
    node = f"{namespace}-rbac"  # no Node object: the Event names it all the same
    log = kube.workdir / f"{node}.log"
    proc = start_proxy(kube, host, config, node, log)
    try:
        wait_for(lambda: "Synced full rules" in log.read_text(), timeout=60, what="a sync")
        # Watching works: a Service made now is programmed through the watch.
        kube.kubectl("-n", namespace, "create", "service", "clusterip", "web", "--tcp=80:8080")
        wait_for(
            lambda: f"changed: {namespace}/web:" in log.read_text(),
            timeout=60,
            what="the new Service programmed",
        )
        (event,) = wait_for(lambda: events_about(kube, node), what="its Starting event")
        assert event["action"] == "StartKubeProxy"
    finally:
        stop_process(proc)
    text = log.read_text()
    assert "403" not in text and "orbidden" not in text, text


@pytest.mark.parametrize(
    "missing",
    GRANTS,
    ids=[f"{verb}-{resource}.{group or 'core'}" for group, resource, verb in GRANTS],
)
def test_every_verb_of_the_cluster_role_is_needed(
    kube: KubeLab, probe_account: Path, host: str, missing: tuple[str, str, str]
) -> None:
    group, resource, verb = missing
    kube.api().apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": PROBE}, "rules": rules_without(missing),
    })  # fmt: skip
    kept = next(g for g in GRANTS if g != missing)
    wait_for(
        lambda: (
            not allowed(kube, PROBE_USER, verb, resource, group)
            and allowed(kube, PROBE_USER, kept[2], kept[1], kept[0])
        ),
        what="the ClusterRole without that verb in force",
    )
    refused = denial(verb, resource, group)
    node = f"rbac-{os.getpid() % 10000}"
    if verb == "list":
        # A one-shot gives up at once on a 403, naming what was refused.
        out = kubeproxy(
            kube.nodes["node-a"].netns, "list", "--kubeconfig", str(probe_account),
            "--hostname-override", node, "--request-timeout", "60s",
        )  # fmt: skip
        assert out.returncode == 1, out
        assert refused in out.stderr, out.stderr
        return
    log = kube.workdir / f"rbac-without-{verb}-{resource}-{group}.log"
    proc = start_proxy(kube, host, probe_account, node, log)
    try:
        wait_for(lambda: refused in log.read_text(), timeout=60, what=f"the {verb} refused")
    finally:
        stop_process(proc)
    # Refused that and nothing else.
    denials = [line for line in log.read_text().splitlines() if "403" in line]
    assert denials and all(refused in line for line in denials), denials


def test_auth_can_i_lists_nothing_more_than_needed(kube: KubeLab, namespace: str) -> None:
    # What any authenticated user may do: a ServiceAccount without any binding.
    everyone = can_i(kube, f"system:serviceaccount:{namespace}:default")
    assert ("selfsubjectaccessreviews.authorization.k8s.io", "create") in everyone
    assert can_i(kube, PROXY_USER) - everyone == NEEDED
