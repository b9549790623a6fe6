"""Partial syncs end exactly where a full sync would: the state machine of
tests/partial_sync_machine.py on the strict fake, at a scale the kernel test cannot
afford (more Services, more steps, more examples)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, settings

from kubeproxy.backends.iptables.proxier import IptablesBackend
from kubeproxy.config.modes import ProxyMode
from kubeproxy.dataplane.iptables.fake import FakeIptables
from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.runner import NftRunner
from tests.conftest import NO_PROC, relies_on_exception
from tests.partial_sync_machine import CONFIG, PartialVersusFull, any_index


class OnTheFake(PartialVersusFull):
    SERVICES: ClassVar[int] = 40

    def runner(self, role: str) -> NftRunner:
        return FakeNftables()

    def state(self, backend: Any) -> object:
        assert isinstance(backend.runner, FakeNftables)
        return any_index(backend.runner.dump())


class IptablesOnTheFake(PartialVersusFull):
    SERVICES: ClassVar[int] = 40

    def backend(self, role: str) -> Any:
        config = replace(CONFIG, mode=ProxyMode.IPTABLES)
        return IptablesBackend(config, {f: FakeIptables(f) for f in config.families}, proc=NO_PROC)

    def state(self, backend: Any) -> object:
        return {f: r.dump() for f, r in backend.runners.items()}


@pytest.mark.parametrize("machine", [OnTheFake, IptablesOnTheFake], ids=["nftables", "iptables"])
@relies_on_exception("runTest raises on a failed invariant (the machine's checks)")
def test_partial_syncs_match_a_full_sync_on_the_fake(machine: type[PartialVersusFull]) -> None:
    settings(
        max_examples=150,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )(machine).TestCase().runTest()
