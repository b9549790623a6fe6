"""tests/lint_tests.py: what counts as a check, on small tests written for it, and the
whole suite passing it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.lint_tests import TESTS, lint


def findings(tmp_path: Path, source: str, helpers: str = "") -> list[str]:
    """The findings on one test module (and a helper module beside it), as
    ``rule: function`` strings."""
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(source))
    (tmp_path / "helpers.py").write_text(textwrap.dedent(helpers))
    return [f"{f.rule}: {f.message.split(':')[0]}" for f in lint([tmp_path], [tmp_path])]


CHECKED = [
    "def test_x():\n    assert f()\n",
    "def test_x():\n    with pytest.raises(E, match='m'):\n        f()\n",
    "def test_x():\n    with pytest.raises(E) as e:\n        f()\n    assert e.value.code == 1\n",
    "def test_x():\n    pytest.raises(E, f)\n",
    "def test_x():\n    if a:\n        assert f()\n    else:\n        raise ValueError\n",
    "def test_x():\n    if a:\n        pytest.skip('no')\n    assert f()\n",
    "def test_x():\n    check_it(1)\n",
    "def test_x(m):\n    m.assert_called_once_with(1)\n",
    "def test_x():\n    for i in (1, 2):\n        assert i\n",
    "def test_x():\n    for i in range(3):\n        assert i\n",
    "def test_x():\n    while True:\n        assert f()\n        break\n",
    "def test_x():\n    try:\n        f()\n    finally:\n        assert g()\n",
    "def test_x():\n    async def go():\n        assert await f()\n    asyncio.run(go())\n",
    "def test_x():\n    def scenario():\n        assert f()\n    run(scenario)\n",
    "def test_x():\n    x = [f(i) for i in y]\n    assert x\n",
    "@relies_on_exception('f raises ValueError on a bad input')\ndef test_x():\n    f()\n",
    "class TestX:\n    def test_x(self):\n        assert f()\n",
]


@pytest.mark.parametrize("source", CHECKED)
def test_a_test_that_checks_on_every_path_passes(tmp_path: Path, source: str) -> None:
    assert findings(tmp_path, source) == []


HOLLOW = [
    "def test_x():\n    f()\n",
    "def test_x():\n    if a:\n        return\n    assert f()\n",  # the early return
    "def test_x():\n    if a:\n        assert f()\n",  # no else
    "def test_x():\n    for i in items:\n        assert i\n",  # items may be empty
    "def test_x():\n    for i in []:\n        assert i\n",
    "def test_x():\n    while a:\n        assert f()\n",
    "def test_x():\n    try:\n        assert f()\n    except E:\n        pass\n",
    "def test_x():\n    x = [check_it(i) for i in y]\n",  # may run zero times
    "def test_x():\n    x = a or check_it()\n",  # may not run
    "def test_x():\n    def scenario():\n        f()\n    run(scenario)\n",
    "def test_x():\n    def unused():\n        assert f()\n    g()\n",
    "def test_x():\n    match a:\n        case 1:\n            assert f()\n",
    "class TestX:\n    def test_x(self):\n        f()\n",
]


@pytest.mark.parametrize("source", HOLLOW)
def test_a_test_with_a_path_without_a_check_is_hollow(tmp_path: Path, source: str) -> None:
    assert findings(tmp_path, source) == ["hollow: test_x"]


def test_helpers_count_when_every_path_of_them_checks(tmp_path: Path) -> None:
    helpers = """
        def sync(x):
            assert x.run() == 0

        def half(x):
            if x:
                assert x

        def via(x):
            sync(x)

        @relies_on_exception("raises when it does not converge")
        def wait_for(p):
            while not p():
                pass

        class Machine:
            def settle(self):
                assert self.ok
    """
    source = """
        def test_a():
            sync(1)

        def test_b():
            via(1)

        def test_c():
            wait_for(f)

        def test_d(m):
            m.settle()

        def test_e():
            half(1)

        def test_f(m):
            m.sync(1)  # a method call matches methods only: backend.sync is no check
    """
    assert findings(tmp_path, source, helpers) == ["hollow: test_e", "hollow: test_f"]


def test_a_helper_named_as_a_check_must_check(tmp_path: Path) -> None:
    helpers = "def check_thing(x):\n    if x:\n        return 1\n    assert x\n"
    assert findings(tmp_path, "def test_x():\n    assert 1\n", helpers) == [
        "helper-without-check: check_thing"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "def test_x():\n    with pytest.raises(E):\n        f()\n",
        "def test_x():\n    with pytest.raises(E) as e:\n        f()\n",  # never looked at
    ],
)
def test_raises_without_match_is_a_finding(tmp_path: Path, source: str) -> None:
    assert findings(tmp_path, source) == ["raises-without-match: test_x"]


def test_the_marker_needs_a_reason(tmp_path: Path) -> None:
    source = "@relies_on_exception('')\ndef test_x():\n    f()\n"
    assert findings(tmp_path, source) == ["hollow: test_x"]


def test_the_whole_suite_passes_the_lint() -> None:
    assert [str(f) for f in lint([TESTS])] == []
