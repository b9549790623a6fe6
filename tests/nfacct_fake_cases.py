"""nfacct counters, and iptables rules feeding them, and what the nfacct tool, iptables
and the kernel do with them: the cases :class:`~kubeproxy.dataplane.nfacct.FakeNfacct`
(with :class:`~kubeproxy.dataplane.iptables.fake.FakeIptables` sharing its counters) is
checked against, without root (tests/unit/test_fake_parity.py) and as root against
:class:`~kubeproxy.dataplane.nfacct.NfacctCommand` and
:class:`~kubeproxy.dataplane.iptables.runner.IptablesCommand` in a scratch namespace
(tests/kernel/test_fakes_vs_kernel.py), in each iptables flavour. See tests/parity.py.

A refusal is described as ``nfacct: message``, or ``iptables line N: message``. The
state compared after each step is the counters' names (no packet goes through: every
count is 0) and the filter table as iptables-save prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.dataplane.iptables.runner import FLAVORS, Flavor, Iptables, IptablesError
from kubeproxy.dataplane.nfacct import Nfacct, NfacctError
from tests.iptables_fake_cases import normalise, restore
from tests.parity import Call, Case, Op, Step, Table

CHAIN = "KUBE-NFACCT"


@dataclass
class NfacctSystem:
    nfacct: Nfacct
    iptables: Iptables


def _describe(err: Exception) -> str:
    if isinstance(err, IptablesError):
        return f"iptables line {err.line}: {err}"
    return f"nfacct: {err}"


def _state(system: NfacctSystem, refused: bool) -> object:
    return sorted(system.nfacct.packets().items()), normalise(system.iptables.save("filter"))


TABLE = Table[NfacctSystem]((NfacctError, IptablesError), _describe, _state)


# ------------------------------------------------------------------------ operations


def ensure(name: str) -> Call[NfacctSystem]:
    return Call(f"ensure counter {name!r}", lambda s: s.nfacct.ensure(name))


PACKETS = Call[NfacctSystem]("read the counters", lambda s: s.nfacct.packets())


def feed(name: str) -> Call[NfacctSystem]:
    """A rule feeding counter ``name`` (the chain holds only it)."""
    rule = f"-A {CHAIN} -m nfacct --nfacct-name {name} -j ACCEPT"
    return Call(
        f"a rule feeding {name!r}",
        lambda s: s.iptables.restore(restore(filter=[f":{CHAIN}", rule])),
    )


def ok(op: Op[NfacctSystem], result: object = None) -> Step[NfacctSystem]:
    return Step(op, result=result)


def refused(error: str, op: Op[NfacctSystem]) -> Step[NfacctSystem]:
    return Step(op, error=error)


LONG = "c" * 40
CUT = LONG[:31]


def cases(flavor: Flavor) -> list[Case[NfacctSystem]]:
    """The cases for one iptables flavour (they differ in the line a refusal names)."""
    # The missing counter is found at COMMIT (legacy) or at the rule (nft).
    missing = f"^iptables line {4 if flavor == 'legacy' else 3}: "
    return [
        Case(
            "Counters are created once and read back, at 0",
            (
                ok(PACKETS, {}),
                ok(ensure("localhost_nps_accepted_pkts")),
                ok(ensure("localhost_nps_accepted_pkts")),  # there already: fine
                ok(ensure("ct_state_invalid_dropped_pkts")),
                ok(
                    PACKETS,
                    {"localhost_nps_accepted_pkts": 0, "ct_state_invalid_dropped_pkts": 0},
                ),
            ),
        ),
        Case(
            "A name: not empty; cut to 31 characters; spaces and semicolons kept",
            (
                refused("^nfacct: .*Invalid argument", ensure("")),
                ok(ensure(LONG)),
                ok(ensure("a b;c")),
                ok(PACKETS, {CUT: 0, "a b;c": 0}),
            ),
        ),
        Case(
            "A rule may feed only a counter that exists",
            (
                refused(missing, feed("nope")),
                ok(ensure("nope")),
                ok(feed("nope")),
            ),
        ),
        Case(
            "A rule's counter name is cut as the counter's is",
            (
                refused(missing, feed(LONG)),
                ok(ensure(LONG)),
                ok(feed(LONG)),  # names the counter CUT
                ok(feed(CUT)),
            ),
        ),
    ]


# (flavour, case): every case in each flavour.
CASES = [(flavor, c) for flavor in FLAVORS for c in cases(flavor)]
