"""The nft runners' failure modes: a missing binary found at start, a hung nft killed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.backends.base import BackendError
from kubeproxy.backends.nftables.proxier import NftablesBackend
from kubeproxy.config.runtime import ProxyConfig
from kubeproxy.dataplane.nftables.runner import NftCommand, NftError
from kubeproxy.dataplane.nftables.transaction import TableRef, Transaction


def test_a_missing_nft_is_reported_when_the_backend_starts(tmp_path: Path) -> None:
    backend = NftablesBackend(
        ProxyConfig(hostname="node-a"), NftCommand(binary=str(tmp_path / "no-nft"))
    )
    with pytest.raises(BackendError, match=r"nftables mode cannot run: .*no-nft not found"):
        backend.start()


def test_a_hung_nft_is_killed_and_the_call_fails(tmp_path: Path) -> None:
    hung = tmp_path / "nft"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    tx = Transaction()
    tx.add_table(TableRef("ip", "kube-proxy"))
    # Without the timeout, sleep would end and the call succeed: no NftError.
    with pytest.raises(NftError, match=r"did not finish within 0\.5s") as err:
        NftCommand(binary=str(hung), timeout=0.5).apply(tx)
    assert err.value.incomplete  # no answer: not a refusal of this transaction
