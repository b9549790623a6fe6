"""Partial syncs end exactly where a full sync would: the state machine of
tests/partial_sync_machine.py on the strict fake, at a scale the kernel test cannot
afford (more Services, more steps, more examples)."""

from __future__ import annotations

from typing import ClassVar

from hypothesis import HealthCheck, settings

from kubeproxy.dataplane.nftables.fake import FakeNftables
from kubeproxy.dataplane.nftables.runner import NftRunner
from tests.partial_sync_machine import PartialVersusFull


class OnTheFake(PartialVersusFull):
    SERVICES: ClassVar[int] = 40

    def runner(self, role: str) -> NftRunner:
        return FakeNftables()

    def state(self, runner: NftRunner) -> object:
        assert isinstance(runner, FakeNftables)
        return runner.dump()


def test_partial_syncs_match_a_full_sync_on_the_fake() -> None:
    machine = settings(
        max_examples=150,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )(OnTheFake)
    machine.TestCase().runTest()
