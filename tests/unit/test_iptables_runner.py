"""The iptables runner without root: missing binaries, a hung iptables-restore, what is
passed to the commands and how their answers are read. Stand-in binaries are small shell
scripts in a temporary directory (``sbin``)."""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.dataplane.iptables.restore import Restore
from kubeproxy.dataplane.iptables.runner import (
    STREAM_RULES,
    IptablesCommand,
    IptablesError,
    chains_from_save,
    command_names,
    detect_flavor,
    locate_failure,
)
from kubeproxy.model.types import IPFamily

V4, V6 = IPFamily.IPv4, IPFamily.IPv6


def restore(**tables: list[str]) -> Restore:
    """Chain lines only: all these tests need."""
    data = Restore()
    for table, chains in tables.items():
        for chain in chains:
            data.chain(table, chain.removeprefix(":"))
    return data


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _stand_ins(tmp_path: Path, body: str, family: IPFamily = V4, flavor: str = "nft") -> Path:
    """The three commands of one family and flavour, all running ``body``; each call's
    arguments and stdin are logged to ``calls``."""
    log = tmp_path / "calls"
    for name in command_names(family, "nft" if flavor == "nft" else "legacy"):
        _script(
            tmp_path / name,
            f'echo "$(basename "$0") $*" >> {log}\ncat > /dev/null\n{body}',
        )
    return log


def test_missing_binaries_are_reported_by_available(tmp_path: Path) -> None:
    ipt = IptablesCommand(V4, "nft", sbin=str(tmp_path))
    reason = ipt.available()
    assert reason is not None
    assert f"{tmp_path}/iptables-nft not found (install the iptables package)" in reason
    # The same sentence when a namespace is involved (ip netns exec would only say
    # "exec failed").
    in_ns = IptablesCommand(V6, "legacy", netns="nowhere", sbin=str(tmp_path))
    assert "ip6tables-legacy not found (install the iptables package)" in str(in_ns.available())
    with pytest.raises(IptablesError, match="iptables-nft-restore not found"):
        ipt.restore(restore(nat=[":KUBE-A"]))


def test_available_checks_the_flavour(tmp_path: Path) -> None:
    _stand_ins(tmp_path, 'echo "iptables v1.8.9 (legacy)"')
    assert "is not the nft flavour" in str(
        IptablesCommand(V4, "nft", sbin=str(tmp_path)).available()
    )
    _stand_ins(tmp_path, 'echo "iptables v1.8.9 (nf_tables)"')
    ipt = IptablesCommand(V4, "nft", sbin=str(tmp_path))
    assert ipt.available() is None
    assert ipt.version == "1.8.9"
    assert ipt.has_random_fully


def test_old_iptables_has_no_random_fully(tmp_path: Path) -> None:
    _stand_ins(tmp_path, 'echo "iptables v1.6.1"', flavor="legacy")
    assert not IptablesCommand(V4, "legacy", sbin=str(tmp_path)).has_random_fully


def test_a_hung_restore_is_killed(tmp_path: Path) -> None:
    _stand_ins(tmp_path, "exec sleep 30")
    ipt = IptablesCommand(V4, "nft", sbin=str(tmp_path), timeout=0.5)
    data = restore(nat=[":KUBE-A"])
    # Without the timeout, sleep would end and the call succeed: the refusal is the kill.
    with pytest.raises(IptablesError, match=r"did not finish within 0\.5s and was killed") as err:
        ipt.restore(data)
    assert err.value.input == str(data)
    assert err.value.incomplete
    assert err.value.committed is None  # unknown: it may have committed a table


def test_restore_arguments_and_nothing_to_do(tmp_path: Path) -> None:
    log = _stand_ins(tmp_path, "exit 0", V6, "legacy")
    ipt = IptablesCommand(V6, "legacy", sbin=str(tmp_path))
    ipt.restore(Restore())
    assert not log.exists()  # nothing to restore: nothing run
    ipt.restore(restore(nat=[":KUBE-A"]))
    assert log.read_text() == "ip6tables-legacy-restore -w 5 --noflush --counters\n"


def test_a_refused_restore_says_where(tmp_path: Path) -> None:
    _stand_ins(
        tmp_path,
        "echo \"iptables-nft-restore v1.8.9 (nf_tables): Chain 'KUBE-X' does not exist\" >&2\n"
        'echo "Error occurred at line: 7" >&2\n'
        'echo "Try \\`iptables-nft-restore -h\' for more information." >&2\n'
        "exit 2",
    )
    data = restore(filter=[":KUBE-F"], nat=[":KUBE-N"])
    data.rule("nat", "KUBE-N", "-j", "KUBE-X")
    with pytest.raises(IptablesError) as err:
        IptablesCommand(sbin=str(tmp_path)).restore(data)
    assert (err.value.line, err.value.table, err.value.committed) == (7, "nat", ("filter",))
    message = str(err.value)
    assert "Chain 'KUBE-X' does not exist" in message
    assert "table nat; filter committed" in message
    assert "Try `" not in message


def test_locate_failure() -> None:
    text = str(restore(mangle=[":KUBE-M"], filter=[":KUBE-F"], nat=[":KUBE-N"]))
    # 1 *mangle 2 :KUBE-M 3 COMMIT 4 *filter 5 :KUBE-F 6 COMMIT 7 *nat 8 :KUBE-N 9 COMMIT
    assert locate_failure(text, 2) == ("mangle", ())
    assert locate_failure(text, 6) == ("filter", ("mangle",))
    assert locate_failure(text, 9) == ("nat", ("mangle", "filter"))


@pytest.mark.parametrize(
    ("status", "stderr", "expected"),
    [
        (0, "", True),
        (1, "iptables: Bad rule (does a matching rule exist in that chain?).", False),
        (
            2,
            "iptables v1.8.9 (legacy): Couldn't load target `KUBE-X':No such file or directory",
            False,
        ),
        (2, "iptables v1.8.9 (nf_tables): Chain 'KUBE-X' does not exist", False),
    ],
)
def test_delete_rule_reads_not_found(
    tmp_path: Path, status: int, stderr: str, expected: bool
) -> None:
    log = _stand_ins(tmp_path, f"echo {shlex.quote(stderr)} >&2\nexit {status}")
    ipt = IptablesCommand(sbin=str(tmp_path))
    assert ipt.delete_rule("nat", "PREROUTING", ["-m", "comment", "--comment", "a b"]) is expected
    assert log.read_text() == "iptables-nft -w 5 -t nat -D PREROUTING -m comment --comment a b\n"


def test_delete_rule_raises_other_failures(tmp_path: Path) -> None:
    _stand_ins(tmp_path, 'echo "Another app is currently holding the xtables lock." >&2\nexit 4')
    with pytest.raises(IptablesError, match="holding the xtables lock"):
        IptablesCommand(sbin=str(tmp_path)).delete_rule("nat", "OUTPUT", ["-j", "KUBE-X"])


def test_ensure_rule_checks_then_inserts(tmp_path: Path) -> None:
    # -C fails (no such rule), -I succeeds.
    log = _stand_ins(tmp_path, 'case "$*" in *" -C "*) exit 1;; esac\nexit 0')
    ipt = IptablesCommand(sbin=str(tmp_path))
    assert ipt.ensure_rule("filter", "INPUT", ["-j", "KUBE-FW"]) is False
    assert ipt.ensure_rule("filter", "INPUT", ["-j", "KUBE-FW"], prepend=False) is False
    assert log.read_text().splitlines() == [
        "iptables-nft -w 5 -t filter -C INPUT -j KUBE-FW",
        "iptables-nft -w 5 -t filter -I INPUT -j KUBE-FW",
        "iptables-nft -w 5 -t filter -C INPUT -j KUBE-FW",
        "iptables-nft -w 5 -t filter -A INPUT -j KUBE-FW",
    ]


def test_chain_commands(tmp_path: Path) -> None:
    _stand_ins(
        tmp_path,
        'case "$*" in *" -N "*) echo "iptables: Chain already exists." >&2; exit 1;; esac\n'
        'case "$*" in *" -S KUBE-GONE"*) exit 1;; esac\nexit 0',
    )
    ipt = IptablesCommand(sbin=str(tmp_path))
    assert ipt.ensure_chain("mangle", "KUBE-PROXY-CANARY") is True
    assert ipt.chain_exists("mangle", "KUBE-PROXY-CANARY") is True
    assert ipt.chain_exists("mangle", "KUBE-GONE") is False


def test_chains_from_save() -> None:
    text = (
        "# Generated by iptables-nft-save v1.8.9\n*nat\n:PREROUTING ACCEPT [12:720]\n"
        ":KUBE-SVC-X - [0:0]\n-A PREROUTING -j KUBE-SVC-X\nCOMMIT\n"
    )
    assert chains_from_save(text) == {"PREROUTING", "KUBE-SVC-X"}


def test_nft_chain_listing_is_used_when_nft_is_there(tmp_path: Path) -> None:
    _stand_ins(tmp_path, "exit 0")
    nft = tmp_path / "nft"
    _script(
        nft,
        'echo \'{"nftables": [{"metainfo": {}},'
        ' {"chain": {"family": "ip", "table": "nat", "name": "KUBE-A"}},'
        ' {"chain": {"family": "ip", "table": "filter", "name": "KUBE-F"}}]}\'',
    )
    ipt = IptablesCommand(sbin=str(tmp_path), nft=str(nft))
    assert ipt.chains("nat") == {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "KUBE-A"}


def test_detect_flavor_from_outputs(tmp_path: Path) -> None:
    def save(name: str, output: str) -> None:
        _script(tmp_path / name, f"cat <<'EOF'\n{output}\nEOF")

    empty = "*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT"
    for name in ("iptables-nft-save", "ip6tables-nft-save"):
        save(name, empty)
    for name in ("iptables-legacy-save", "ip6tables-legacy-save"):
        save(name, "")
    assert detect_flavor(sbin=str(tmp_path)) == "nft"
    save("ip6tables-legacy-save", "*filter\n-A INPUT -j ACCEPT\nCOMMIT")
    assert detect_flavor(sbin=str(tmp_path)) == "legacy"
    save("iptables-nft-save", "*filter\n-A INPUT -j ACCEPT\n-A OUTPUT -j ACCEPT\nCOMMIT")
    assert detect_flavor(sbin=str(tmp_path)) == "nft"
    save("iptables-legacy-save", "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT")
    assert detect_flavor(sbin=str(tmp_path)) == "legacy"
    save("ip6tables-nft-save", "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT")
    assert detect_flavor(sbin=str(tmp_path)) == "nft"


def big_restore(rules: int) -> tuple[Restore, list[int]]:
    """A restore over STREAM_RULES rules, from a source; and how often it was printed."""
    data = restore(nat=[":KUBE-A"])
    printed: list[int] = []

    def source() -> Iterator[tuple[str, tuple[str, ...]]]:
        printed.append(1)
        for i in range(rules):
            yield "KUBE-A", ("-s", f"10.0.{i // 256}.{i % 256}", "-j", "RETURN")

    data.lazy_rules("nat", rules, source)
    return data, printed


def test_a_big_restore_is_streamed_as_it_is_printed(tmp_path: Path) -> None:
    got = tmp_path / "stdin"
    for name in command_names(V4, "legacy"):
        _script(tmp_path / name, f"cat > {got}")
    data, printed = big_restore(STREAM_RULES + 1)
    IptablesCommand(V4, "legacy", sbin=str(tmp_path)).restore(data)
    assert printed == [1]  # printed once, straight into the pipe
    assert got.read_text() == str(data)
    assert got.read_text().count("\n-A KUBE-A ") == STREAM_RULES + 1


def test_a_refused_streamed_restore_says_where(tmp_path: Path) -> None:
    _stand_ins(tmp_path, 'echo "Error occurred at line: 3" >&2\nexit 2', flavor="legacy")
    data, printed = big_restore(STREAM_RULES + 1)
    with pytest.raises(IptablesError) as err:
        IptablesCommand(V4, "legacy", sbin=str(tmp_path)).restore(data)
    assert (err.value.line, err.value.table) == (3, "nat")
    assert err.value.input == str(data)  # printed again for the error
    assert len(printed) == 3


def test_a_streamed_restore_the_tool_stops_reading_is_killed(tmp_path: Path) -> None:
    # The tool never reads: the pipe fills, the write waits, the timeout kills it.
    for name in command_names(V4, "nft"):
        _script(tmp_path / name, "exec sleep 30")
    data, _ = big_restore(20 * STREAM_RULES)
    ipt = IptablesCommand(V4, "nft", sbin=str(tmp_path), timeout=0.5)
    # Only the timeout's kill gives this message (the stand-in would have ended in 30 s).
    with pytest.raises(IptablesError, match=r"did not finish within 0\.5s and was killed") as err:
        ipt.restore(data)
    assert err.value.incomplete
    assert err.value.input == str(data)


def test_a_tool_that_stops_reading_early_reports_its_failure(tmp_path: Path) -> None:
    # It refuses the first line and exits: the rest of the input meets a closed pipe.
    for name in command_names(V4, "nft"):
        _script(tmp_path / name, 'head -c 10 > /dev/null\necho "line 1 failed" >&2\nexit 2')
    data, _ = big_restore(20 * STREAM_RULES)
    with pytest.raises(IptablesError, match="line 1 failed") as err:
        IptablesCommand(V4, "nft", sbin=str(tmp_path)).restore(data)
    assert err.value.line == 1
    assert not err.value.incomplete
