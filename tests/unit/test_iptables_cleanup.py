"""The cleanup helper (``kubeproxy cleanup`` in iptables mode) on the strict fake: our
chains and jumps go, in one restore per table, everything else stays; a table that
cannot be cleaned does not stop the others."""

from __future__ import annotations

import pytest

from kubeproxy.dataplane.iptables.cleanup import CleanupError, cleanup_chains
from kubeproxy.dataplane.iptables.fake import FakeIptables
from tests.iptables_fake_cases import restore

OURS = ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-MARK-MASQ")


def _is_ours(name: str) -> bool:
    return name in OURS or name.startswith(("KUBE-SVC-", "KUBE-SEP-"))


JUMPS = [
    (
        "nat",
        "PREROUTING",
        ("-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"),
    ),
    (
        "nat",
        "OUTPUT",
        ("-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"),
    ),
    ("nat", "POSTROUTING", ("-j", "KUBE-POSTROUTING")),
    ("filter", "INPUT", ("-j", "KUBE-SERVICES")),
]


def _programmed() -> FakeIptables:
    fake = FakeIptables()
    fake.restore(
        restore(
            filter=[
                ":KUBE-SERVICES",
                ":OTHER",
                "-A KUBE-SERVICES -j RETURN",
                "-A INPUT -j KUBE-SERVICES",
                "-A INPUT -j OTHER",
            ],
            nat=[
                ":KUBE-SERVICES",
                ":KUBE-SVC-A",
                ":KUBE-SEP-B",
                ":KUBE-POSTROUTING",
                ":KUBE-MARK-MASQ",
                "-A KUBE-SERVICES -j KUBE-SVC-A",
                "-A KUBE-SVC-A -j KUBE-SEP-B",
                "-A KUBE-SEP-B -j KUBE-MARK-MASQ",
                "-A KUBE-POSTROUTING -j MASQUERADE",
                '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
                '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
                "-A POSTROUTING -j KUBE-POSTROUTING",
                "-A POSTROUTING -j KUBE-POSTROUTING",
            ],
        )
    )
    return fake


def test_cleanup_removes_ours_and_nothing_else() -> None:
    fake = _programmed()
    removed = cleanup_chains(fake, _is_ours, JUMPS)
    assert removed == [
        "rule nat PREROUTING -m comment --comment kubernetes service portals -j KUBE-SERVICES",
        "rule nat OUTPUT -m comment --comment kubernetes service portals -j KUBE-SERVICES",
        "rule nat POSTROUTING -j KUBE-POSTROUTING",
        "rule nat POSTROUTING -j KUBE-POSTROUTING",
        "rule filter INPUT -j KUBE-SERVICES",
        "chain filter KUBE-SERVICES",
        "chain nat KUBE-MARK-MASQ",
        "chain nat KUBE-POSTROUTING",
        "chain nat KUBE-SEP-B",
        "chain nat KUBE-SERVICES",
        "chain nat KUBE-SVC-A",
    ]
    assert fake.dump() == (
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n"
        ":OTHER - [0:0]\n-A INPUT -j OTHER\nCOMMIT\n"
    )
    # One restore per table that held something of ours.
    assert fake.calls["restore"] == 3  # the setup, filter, nat
    assert cleanup_chains(fake, _is_ours, JUMPS) == []


def test_cleanup_goes_on_after_a_failing_table() -> None:
    fake = _programmed()
    # A jump nobody told us about keeps KUBE-SERVICES in use in filter.
    fake.ensure_rule("filter", "OTHER", ["-j", "KUBE-SERVICES"])
    with pytest.raises(CleanupError) as err:
        cleanup_chains(fake, _is_ours, JUMPS)
    assert len(err.value.errors) == 1
    assert "KUBE-SERVICES is still jumped to" in err.value.errors[0]
    assert "chain nat KUBE-SERVICES" in err.value.removed
    assert "KUBE-SERVICES" in fake.chains("filter")
    assert "KUBE-SERVICES" not in fake.chains("nat")
