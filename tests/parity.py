"""One table of cases, run against a fake without root and against the real thing as
root: the pattern of tests/nft_fake_cases.py and tests/iptables_fake_cases.py, for the
smaller fakes (IPVS and its dummy link, ipset, BPF maps, nfacct).

A :class:`Case` is a sequence of :class:`Step`\\ s applied to a fresh system (a fake, or
the real wrapper on an empty namespace or map). Each step is an operation (an object
with ``apply(system)`` and a readable ``str``: usually a :class:`Call`, a text and a
function of the system) that is accepted, returning ``result``,
or refused (``error``: a regular expression searched in the error as the table's
``describe`` writes it, e.g. the errno's name). ``kernel_accepts`` marks a place where
the fake is deliberately stricter than the kernel (the reason says why): the real run
checks the kernel does accept it, so the note stays true, and the case ends there since
the states part.

:func:`check_fake` runs a case on a fake (the unit tests); :func:`check_both` runs it
on the real thing and a fake side by side, step by step, and compares their states
after each step (the kernel tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

S = TypeVar("S")
S_contra = TypeVar("S_contra", contravariant=True)


class Op(Protocol[S_contra]):
    def apply(self, system: S_contra) -> object: ...


@dataclass(frozen=True)
class Call(Generic[S]):
    """An operation: what it says it does, and the function that does it."""

    text: str
    run: Callable[[S], object]

    def apply(self, system: S) -> object:
        return self.run(system)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Step(Generic[S]):
    op: Op[S]
    error: str | None = None  # a regex the refusal's description matches; None: accepted
    result: object = None  # what an accepted operation returns
    kernel_accepts: str | None = None  # why the fake refuses what the kernel accepts


@dataclass(frozen=True)
class Case(Generic[S]):
    name: str
    steps: tuple[Step[S], ...]

    def __str__(self) -> str:
        """A test id: the name in lower case, with dashes."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


@dataclass(frozen=True)
class Table(Generic[S]):
    """How to run one table's cases: which errors are refusals and how to describe them,
    and the state to compare (``refused``: after a refused step, when a table's real
    side may have applied only part of it)."""

    errors: tuple[type[Exception], ...]
    describe: Callable[[Exception], str]
    state: Callable[[S, bool], object]


@dataclass(frozen=True)
class Outcome:
    result: object = None
    error: str | None = None  # the refusal, described

    def __str__(self) -> str:
        return f"refused: {self.error}" if self.error is not None else f"ok: {self.result!r}"


def outcome(table: Table[S], op: Op[S], system: S) -> Outcome:
    try:
        return Outcome(op.apply(system))
    except table.errors as err:
        return Outcome(error=table.describe(err))


def _expected(step: Step[S], got: Outcome, where: str) -> None:
    if step.error is None:
        assert got.error is None, where
        assert got.result == step.result, where
    else:
        assert got.error is not None, where
        assert re.search(step.error, got.error), where


def check_fake(table: Table[S], case: Case[S], fake: S) -> None:
    """Every step of ``case`` does on ``fake`` what the table says."""
    assert case.steps
    for i, step in enumerate(case.steps):
        got = outcome(table, step.op, fake)
        where = f"step {i}: {step.op}\nfake: {got}"
        if step.kernel_accepts is not None:
            assert got.error is not None, where  # the fake's deliberate refusal
            assert step.error is not None and re.search(step.error, got.error), where
            return
        _expected(step, got, where)


def check_both(table: Table[S], case: Case[S], real: S, fake: S) -> None:
    """Every step of ``case`` on the real thing and on the fake: both as the table says,
    and the same state after each step."""
    assert case.steps
    for i, step in enumerate(case.steps):
        from_real = outcome(table, step.op, real)
        from_fake = outcome(table, step.op, fake)
        where = f"step {i}: {step.op}\nreal: {from_real}\nfake: {from_fake}"
        if step.kernel_accepts is not None:
            # A documented place where the fake is stricter; the states part here.
            assert from_real.error is None, where
            assert from_fake.error is not None, where
            return
        _expected(step, from_real, where)
        _expected(step, from_fake, where)
        refused = step.error is not None
        assert table.state(real, refused) == table.state(fake, refused), where
