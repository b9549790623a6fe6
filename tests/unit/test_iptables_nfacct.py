"""iptables mode's nfacct counters: created at start, named in rules only when they
exist, read by the metrics at scrape time, and their absence costs only the metrics."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from kubeproxy.backends.iptables.proxier import IptablesBackend
from kubeproxy.backends.iptables.render import NFACCT_COUNTERS
from kubeproxy.config.modes import ProxyMode
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.iptables.runner import IptablesError
from kubeproxy.dataplane.nfacct import _COUNTER, FakeNfacct
from kubeproxy.metrics import Metrics
from kubeproxy.model.state import Snapshot
from kubeproxy.model.types import IPFamily
from tests.partial_sync_machine import CONFIG, NODE

V4 = replace(CONFIG, mode=ProxyMode.IPTABLES, families=(IPFamily.IPv4,), localhost_nodeports=False)


def started(nfacct: FakeNfacct, tmp_path: Path) -> IptablesBackend:
    kernel = FakeIptables(IPFamily.IPv4)
    kernel.nfacct_counters = nfacct.counters
    backend = IptablesBackend(V4, {IPFamily.IPv4: kernel}, proc=tmp_path, nfacct=nfacct)
    backend.start()
    backend.sync(Snapshot({}, {}, NODE), None)
    return backend


def test_counters_are_created_and_fed(tmp_path: Path) -> None:
    nfacct = FakeNfacct()
    backend = started(nfacct, tmp_path)
    assert set(nfacct.counters) == set(NFACCT_COUNTERS)
    assert "--nfacct-name ct_state_invalid_dropped_pkts" in backend.last_restore
    nfacct.counters["ct_state_invalid_dropped_pkts"] = 7
    assert backend.counters() == {
        "ct_state_invalid_dropped_pkts": 7,
        "localhost_nps_accepted_pkts": 0,
    }


def test_without_nfacct_the_rules_leave_the_match_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = started(FakeNfacct(broken=True), tmp_path)
    assert "nfacct" not in backend.last_restore
    assert "--ctstate INVALID -j DROP" in backend.last_restore
    assert backend.counters() == {}
    assert next(r.message for r in caplog.records if "nfacct" in r.message).startswith(
        "nfacct counters unavailable"
    )


def test_the_metrics_read_the_counters_when_scraped() -> None:
    metrics = Metrics("iptables")
    text = generate_latest(metrics.registry).decode()
    assert "localhost_nodeports_accepted" not in text  # no counters: no series, as upstream
    metrics.counter_reader = lambda: {"localhost_nps_accepted_pkts": 3}
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE kubeproxy_iptables_localhost_nodeports_accepted_packets_total counter" in text
    assert "kubeproxy_iptables_localhost_nodeports_accepted_packets_total 3.0" in text
    assert "ct_state_invalid" not in text


def test_the_tools_output_is_parsed() -> None:
    line = "{ pkts = 00000000000000004321, bytes = 00000000000000259260 } = localhost_nps_accepted_pkts;"  # noqa: E501
    assert _COUNTER.findall(line) == [
        ("00000000000000004321", "00000000000000259260", "localhost_nps_accepted_pkts")
    ]


def test_the_fake_refuses_a_counter_that_does_not_exist() -> None:
    kernel = FakeIptables(IPFamily.IPv4, "legacy")
    restore = Restore()
    restore.chain("filter", "X")
    restore.rule("filter", "X", "-m", "nfacct", "--nfacct-name", "nope", "-j", "ACCEPT")
    with pytest.raises(IptablesError, match="nfacct counter 'nope' does not exist") as err:
        kernel.restore(restore)
    assert err.value.line == 4  # legacy: at COMMIT, as the real one
    kernel.nfacct_counters = {"nope"}
    kernel.restore(restore)
    assert "-A X -m nfacct --nfacct-name  nope -j ACCEPT" in kernel.save("filter")
