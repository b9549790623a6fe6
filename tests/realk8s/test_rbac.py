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

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.lab.cluster import stop_process
from kubeproxy.lab.kube.cluster import DEPLOY, KubeLab, wait_for
from kubeproxy.lab.netns import ns_exec
from tests.realk8s.conftest import service_ip
from tests.realk8s.opslab import (
    allowed,
    can_i,
    events_about,
    kubeproxy_command,
    service_account_kubeconfig,
    service_account_token,
    spare_host,
    start_proxy,
)

ROLE = next(
    d for d in yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()) if d["kind"] == "ClusterRole"
)
PROXY_USER = "system:serviceaccount:kube-system:kubeproxy"
Grant = tuple[str, str, str]  # (API group, resource, verb)
# Every verb the ClusterRole grants.
GRANTS: list[Grant] = [
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


def denial(group: str, resource: str, verb: str) -> str:
    """How the API server's 403 names what it refused."""
    return f'cannot {verb} resource "{resource}" in API group "{group}"'


def rules_without(missing: Grant) -> list[dict[str, Any]]:
    """The ClusterRole's rules with one (group, resource, verb) taken out."""
    kept: dict[tuple[str, str], list[str]] = {}
    for group, resource, verb in GRANTS:
        if (group, resource, verb) != missing:
            kept.setdefault((group, resource), []).append(verb)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": verbs}
        for (group, resource), verbs in kept.items()
    ]


@contextlib.contextmanager
def account(kube: KubeLab, name: str, rules: list[dict[str, Any]]) -> Iterator[Path]:
    """ServiceAccount kube-system/``name`` bound to a ClusterRole ``name`` with ``rules``
    (deleted on exit); a kubeconfig with its token."""
    api = kube.api()
    api.create({
        "apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": "kube-system"},
    })  # fmt: skip
    try:
        api.create({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name}, "rules": rules,
        })  # fmt: skip
        api.create({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
        })  # fmt: skip
        token = service_account_token(kube, name, "kube-system")
        yield service_account_kubeconfig(kube, kube.workdir / f"{name}.kubeconfig", token)
    finally:
        api.delete("ClusterRoleBinding", name)
        api.delete("ClusterRole", name)
        api.delete("ServiceAccount", name, "kube-system")


@dataclass(frozen=True)
class Outcome:
    """What kubeproxy said without one grant: the one-shot's exit status and output, or
    the proxy's log (``returncode`` None: it ran until stopped)."""

    returncode: int | None
    output: str


@pytest.fixture(scope="module")
def without_each_grant(kube: KubeLab) -> Iterator[dict[Grant, Outcome]]:
    """For every grant of the ClusterRole at once (one account each, in parallel: each
    case is a process start): ``kubeproxy list`` (for ``list``) or ``kubeproxy run`` (for
    the verbs only the proxy uses, each on a spare host) with a role lacking it."""
    node = f"rbac-{os.getpid() % 10000}"  # no Node object: kubeproxy runs all the same
    outcomes: dict[Grant, Outcome] = {}
    with contextlib.ExitStack() as stack:
        configs = {
            grant: stack.enter_context(
                account(kube, f"kubeproxy-without-{i}", rules_without(grant))
            )
            for i, grant in enumerate(GRANTS)
        }
        for i, grant in enumerate(GRANTS):
            # The authorizer sees RBAC objects a moment after they are written: wait
            # until the binding is in force (the first other grant allowed).
            user = f"system:serviceaccount:kube-system:kubeproxy-without-{i}"
            other = next(g for g in GRANTS if g != grant)
            wait_for(
                lambda u=user, g=grant, o=other: allowed(kube, u, *o) and not allowed(kube, u, *g),
                what=f"{user}'s role in force",
            )
        procs: dict[Grant, tuple[subprocess.Popen[str], Path]] = {}
        for i, grant in enumerate(GRANTS):
            log = kube.workdir / f"kubeproxy-without-{i}.log"
            if grant[2] == "list":
                # A one-shot gives up at once on a 403 (--request-timeout only bounds
                # the wait for a server that does not answer).
                command = kubeproxy_command(
                    kube.nodes["node-a"].netns, "list", "--kubeconfig", str(configs[grant]),
                    "--hostname-override", node, "--request-timeout", "60s",
                )  # fmt: skip
                procs[grant] = (kube.spawn(command, log), log)
            else:
                host = stack.enter_context(spare_host(kube, f"rbac{i}", 60 + i))
                procs[grant] = (start_proxy(kube, host, configs[grant], node, log), log)
        for grant, (proc, log) in procs.items():
            if grant[2] == "list":
                proc.wait(90)
                outcomes[grant] = Outcome(proc.returncode, log.read_text())
                continue
            with contextlib.suppress(TimeoutError):
                wait_for(
                    lambda g=grant, f=log: denial(*g) in f.read_text(),
                    timeout=60,
                    what="the refusal",
                )
            stop_process(proc)
            outcomes[grant] = Outcome(None, log.read_text())
        yield outcomes


def test_with_its_cluster_role_kubeproxy_is_never_refused_and_records_its_event(
    kube: KubeLab, namespace: str
) -> None:
    token = kube.kubeproxy_token()  # deploy/'s ServiceAccount, bound to deploy/'s role
    config = service_account_kubeconfig(kube, kube.workdir / "rbac-full.kubeconfig", token)
    node = f"{namespace}-rbac"  # no Node object: the Event names it all the same
    log = kube.workdir / f"{node}.log"
    with spare_host(kube, "rbac", 50) as host:
        proc = start_proxy(kube, host, config, node, log)
        try:
            wait_for(lambda: "Synced full rules" in log.read_text(), timeout=60, what="a sync")
            # Watching works: a Service made now is programmed through the watch.
            kube.kubectl("-n", namespace, "create", "service", "clusterip", "web", "--tcp=80:8080")
            ip = service_ip(kube, namespace, "web")
            wait_for(
                lambda: ip in ns_exec(host, "nft", "list", "table", "ip", "kube-proxy"),
                timeout=60,
                what="the new Service programmed",
            )
            (event,) = wait_for(lambda: events_about(kube, node), what="its Starting event")
            assert event["action"] == "StartKubeProxy"
        finally:
            stop_process(proc)
    text = log.read_text()
    assert "HTTP 403" not in text and "orbidden" not in text, text


@pytest.mark.parametrize("grant", GRANTS, ids=[f"{v}-{r}.{g or 'core'}" for g, r, v in GRANTS])
def test_every_verb_of_the_cluster_role_is_needed(
    without_each_grant: dict[Grant, Outcome], grant: Grant
) -> None:
    outcome = without_each_grant[grant]
    refused = denial(*grant)
    if grant[2] == "list":
        # The one-shot exits 1 naming the verb and the resource refused.
        assert outcome.returncode == 1, outcome.output
        assert refused in outcome.output, outcome.output
        return
    # The proxy logs the refusal, and refuses nothing else.
    denials = [line for line in outcome.output.splitlines() if "HTTP 403" in line]
    assert denials, outcome.output
    assert all(refused in line for line in denials), denials


def test_auth_can_i_lists_nothing_more_than_needed(kube: KubeLab, namespace: str) -> None:
    # What any authenticated user may do: a ServiceAccount without any binding.
    everyone = can_i(kube, f"system:serviceaccount:{namespace}:default")
    assert ("selfsubjectaccessreviews.authorization.k8s.io", "create") in everyone
    assert can_i(kube, PROXY_USER) - everyone == NEEDED
