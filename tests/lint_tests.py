"""A lint of the test suite itself: every test checks what it runs (issue 27).

``python -m tests.lint_tests [FILE_OR_DIR...]`` (default: ``tests/``); exit status 1
with one line per finding. ``scripts/test`` runs it before pytest, and
tests/unit/test_lint_tests.py runs it over the whole suite too.

The rules:

* **hollow** — a test (a ``test*`` function at module level, or a method of a ``Test*``
  class, in ``test_*.py``) has a path from its start to its end (falling off the end,
  or a ``return``) on which no *check* happens.
* **raises-without-match** — a ``pytest.raises(...)`` without ``match=`` whose exception
  is not looked at afterwards (``as NAME`` with ``NAME`` read later in the function):
  it passes on any error of that type, the wrong one included.
* **helper-without-check** — a function defined under tests/ whose name says it checks
  (``assert_``, ``check_``, ``expect_``, ``verify_``) has a path without a check, so
  calls to it would count as checks when they are not.

A *check* on a path is one of:

* an ``assert`` statement;
* ``with pytest.raises(...)`` / ``pytest.warns(...)`` / ``pytest.deprecated_call()``, or
  those called directly;
* the end of the path in an exception: a ``raise`` statement, or a call of
  ``pytest.fail`` / ``pytest.skip`` / ``pytest.xfail`` / ``pytest.exit`` (a skip is then
  the skip policy's business: tests/conftest.py);
* a call of a checking helper: a name starting with ``assert_``, ``check_``,
  ``expect_`` or ``verify_`` (mock's ``assert_called_once_with`` too), or a function
  defined under tests/ every path of which has a check (found by fixed point, so
  helpers calling helpers count). A bare-name call matches module-level functions, an
  attribute call (``obj.name(...)``) methods of classes under tests/; every definition
  of that name must check.

A call counts wherever it stands in a statement, except inside a ``lambda``, a
comprehension, either branch of a conditional expression, or after the first operand
of ``and`` / ``or`` (those may not run). Paths: both ways of an ``if`` (no ``else`` is
a path); a loop may run zero times, so its body counts only when it certainly runs
(``while True``; ``for`` over a non-empty literal list, tuple, set or string, or
``range(N)`` with a constant N > 0); an exception handler is a path of its own, which
starts before anything the ``try`` body checked; a ``finally`` that checks covers
every path through it; each ``case`` of a ``match`` is a path, and so is matching none
(unless one is irrefutable); nested functions and classes do not run.

A test that checks by *not raising* (its calls raise on what it guards against) says so
with ``@relies_on_exception("which call raises, on what")`` from tests/conftest.py: the
reason is required and the lint skips that test. On a helper the same marker says that
calling it is a check (it raises when what it checks does not hold, like
``wait_for``): calls to it count as checks.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CHECK_PREFIXES = ("assert_", "check_", "expect_", "verify_")
CHECKING_PYTEST = {"raises", "warns", "deprecated_call"}
ENDING_PYTEST = {"fail", "skip", "xfail", "exit"}
MARKER = "relies_on_exception"


class Paths(Enum):
    """The paths leaving a piece of code one way: none, all checked, or some not."""

    NONE = 0
    CHECKED = 1
    UNCHECKED = 2


def join(a: Paths, b: Paths) -> Paths:
    if a is Paths.NONE:
        return b
    if b is Paths.NONE:
        return a
    return Paths.CHECKED if a is b is Paths.CHECKED else Paths.UNCHECKED


@dataclass
class Flow:
    """Where the paths through a block go, given they enter it unchecked."""

    end: Paths = Paths.UNCHECKED  # falling off the end
    returns: int | None = None  # the line of a return some unchecked path takes
    breaks: Paths = Paths.NONE
    continues: Paths = Paths.NONE

    def merge(self, other: Flow) -> None:
        self.returns = self.returns or other.returns
        self.breaks = join(self.breaks, other.breaks)
        self.continues = join(self.continues, other.continues)


@dataclass(frozen=True)
class Finding:
    path: Path
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        try:
            where = self.path.relative_to(TESTS.parent)
        except ValueError:
            where = self.path
        return f"{where}:{self.line}: {self.rule}: {self.message}"


def _callee(call: ast.Call) -> tuple[str | None, str]:
    """(``"name"`` for a bare call, else the object's dotted text or None; the name)."""
    func = call.func
    if isinstance(func, ast.Name):
        return "", func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    return None, ""


def _is_pytest(call: ast.Call, names: set[str]) -> bool:
    owner, name = _callee(call)
    return owner == "pytest" and name in names


def _calls(node: ast.AST) -> Iterator[ast.Call]:
    """The calls of an expression that run whenever it does (see the module docstring)."""
    if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return
    if isinstance(node, ast.IfExp):
        yield from _calls(node.test)
        return
    if isinstance(node, ast.BoolOp):
        yield from _calls(node.values[0])
        return
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    if isinstance(node, ast.Call):
        yield node
    for child in ast.iter_child_nodes(node):
        yield from _calls(child)


@dataclass
class Helpers:
    """Which functions defined under tests/ check on every path (by name)."""

    functions: set[str] = field(default_factory=set)
    methods: set[str] = field(default_factory=set)

    def checks(self, call: ast.Call) -> bool:
        owner, name = _callee(call)
        if owner is None and not name:
            return False
        if name.startswith(CHECK_PREFIXES) or (owner == "pytest" and name in CHECKING_PYTEST):
            return True
        return name in (self.functions if owner == "" else self.methods)


class Analyzer:
    def __init__(self, helpers: Helpers, local: frozenset[str] = frozenset()) -> None:
        self.helpers = helpers
        # Functions defined in the function analysed that check on every path.
        self.local = local

    def _checks(self, call: ast.Call) -> bool:
        if self.helpers.checks(call):
            return True
        owner, name = _callee(call)
        if owner == "" and name in self.local:
            return True
        # A checking local function handed to a call is run by it (asyncio.run(...),
        # a test's run(scenario), a thread's target).
        args = [*call.args, *(k.value for k in call.keywords)]
        return any(isinstance(a, ast.Name) and a.id in self.local for a in args)

    def _expression(self, nodes: Iterable[ast.AST | None]) -> Paths:
        """CHECKED if a check runs in these expressions, NONE if they end the path."""
        out = Paths.UNCHECKED
        for node in nodes:
            if node is None:
                continue
            for call in _calls(node):
                if _is_pytest(call, ENDING_PYTEST):
                    return Paths.NONE
                if self._checks(call):
                    out = Paths.CHECKED
        return out

    def block(self, body: list[ast.stmt], entry: Paths = Paths.UNCHECKED) -> Flow:
        flow = Flow(end=entry)
        for stmt in body:
            if flow.end is not Paths.UNCHECKED:
                break  # unreachable, or every path here has checked already
            step = self.statement(stmt)
            flow.merge(step)
            flow.end = step.end
        return flow

    def statement(self, stmt: ast.stmt) -> Flow:
        if isinstance(stmt, ast.Assert):
            return Flow(end=Paths.CHECKED)
        if isinstance(stmt, ast.Raise):
            return Flow(end=Paths.NONE)
        if isinstance(stmt, ast.Return):
            done = self._expression([stmt.value])
            return Flow(end=Paths.NONE, returns=stmt.lineno if done is Paths.UNCHECKED else None)
        if isinstance(stmt, ast.Break):
            return Flow(end=Paths.NONE, breaks=Paths.UNCHECKED)
        if isinstance(stmt, ast.Continue):
            return Flow(end=Paths.NONE, continues=Paths.UNCHECKED)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return Flow()
        if isinstance(stmt, ast.If):
            return self._if(stmt)
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            return self._loop(stmt)
        if isinstance(stmt, (ast.With, ast.AsyncWith)):
            return self._with(stmt)
        if isinstance(stmt, (ast.Try, ast.TryStar)):
            return self._try(stmt)
        if isinstance(stmt, ast.Match):
            return self._match(stmt)
        return Flow(end=self._expression([stmt]))

    def _if(self, stmt: ast.If) -> Flow:
        test = self._expression([stmt.test])
        if test is not Paths.UNCHECKED:
            return Flow(end=test)
        body, orelse = self.block(stmt.body), self.block(stmt.orelse)
        body.merge(orelse)
        body.end = join(body.end, orelse.end)
        return body

    def _loop(self, stmt: ast.For | ast.AsyncFor | ast.While) -> Flow:
        head = self._expression([stmt.iter if not isinstance(stmt, ast.While) else stmt.test])
        if head is not Paths.UNCHECKED:
            return Flow(end=head)
        body = self.block(stmt.body)
        flow = Flow(returns=body.returns)
        if isinstance(stmt, ast.While) and _truthy_constant(stmt.test):
            flow.end = body.breaks  # only a break leaves it
            return flow
        normal = join(body.end, body.continues) if _runs(stmt) else Paths.UNCHECKED
        orelse = self.block(stmt.orelse, normal)
        flow.merge(orelse)
        flow.end = join(orelse.end, body.breaks)
        return flow

    def _with(self, stmt: ast.With | ast.AsyncWith) -> Flow:
        for item in stmt.items:
            call = item.context_expr
            if isinstance(call, ast.Call) and _is_pytest(call, CHECKING_PYTEST):
                return Flow(end=Paths.CHECKED)
        items = self._expression([i.context_expr for i in stmt.items])
        if items is not Paths.UNCHECKED:
            return Flow(end=items)
        return self.block(stmt.body)

    def _try(self, stmt: ast.Try | ast.TryStar) -> Flow:
        body = self.block(stmt.body)
        flow = self.block(stmt.orelse, body.end)
        flow.merge(body)
        for handler in stmt.handlers:
            caught = self.block(handler.body)
            flow.merge(caught)
            flow.end = join(flow.end, caught.end)
        if stmt.finalbody:
            final = self.block(stmt.finalbody)
            if final.end is Paths.NONE:
                return final
            if final.end is Paths.CHECKED:
                return Flow(
                    end=Paths.CHECKED if flow.end is not Paths.NONE else Paths.NONE,
                    breaks=Paths.CHECKED if flow.breaks is not Paths.NONE else Paths.NONE,
                    continues=Paths.CHECKED if flow.continues is not Paths.NONE else Paths.NONE,
                )
            flow.merge(final)
        return flow

    def _match(self, stmt: ast.Match) -> Flow:
        subject = self._expression([stmt.subject])
        if subject is not Paths.UNCHECKED:
            return Flow(end=subject)
        flow = Flow(end=Paths.NONE)
        irrefutable = False
        for case in stmt.cases:
            branch = self.block(case.body)
            flow.merge(branch)
            flow.end = join(flow.end, branch.end)
            pattern = case.pattern
            if case.guard is None and isinstance(pattern, ast.MatchAs) and pattern.pattern is None:
                irrefutable = True
        if not irrefutable:
            flow.end = join(flow.end, Paths.UNCHECKED)
        return flow

    def checks_always(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[bool, str]:
        """Whether every path through ``fn`` has a check; if not, where one does not."""
        nested = list(_nested_functions(fn.body))
        local: set[str] = set()
        changed = True
        while changed:  # nested functions may call each other
            changed = False
            inner = Analyzer(self.helpers, self.local | local)
            for child in nested:
                if child.name not in local and inner.checks_always(child)[0]:
                    local.add(child.name)
                    changed = True
        flow = Analyzer(self.helpers, self.local | local).block(fn.body)
        if flow.returns is not None:
            return False, f"the return on line {flow.returns} comes before any check"
        if flow.end is Paths.UNCHECKED:
            return False, "a path reaches the end without a check"
        return True, ""


def _nested_functions(body: list[ast.stmt]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions defined directly in a function's body (in its blocks too)."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield stmt
        elif not isinstance(stmt, ast.ClassDef):
            for field_name in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(stmt, field_name, ()):
                    yield from _nested_functions(
                        child.body
                        if isinstance(child, (ast.ExceptHandler, ast.match_case))
                        else [child]
                    )


def _truthy_constant(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and bool(node.value)


def _runs(loop: ast.For | ast.AsyncFor | ast.While) -> bool:
    """Whether the loop's body certainly runs at least once."""
    if isinstance(loop, ast.While):
        return _truthy_constant(loop.test)
    it = loop.iter
    if isinstance(it, (ast.List, ast.Tuple, ast.Set)):
        return bool(it.elts) and not any(isinstance(e, ast.Starred) for e in it.elts)
    if isinstance(it, ast.Constant):
        return isinstance(it.value, (str, bytes)) and bool(it.value)
    if (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
    ):
        (arg,) = it.args
        return isinstance(arg, ast.Constant) and isinstance(arg.value, int) and arg.value > 0
    return False


# ------------------------------------------------------------------------ the files


@dataclass
class Module:
    path: Path
    tree: ast.Module

    def functions(self) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
        """Module-level functions and methods of module-level classes (is it a method)."""
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield node, False
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield item, True

    def tests(self) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
        if not self.path.name.startswith("test_"):
            return
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("test"):
                    yield node
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                yield from (
                    item
                    for item in node.body
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and item.name.startswith("test")
                )


def python_files(paths: Iterable[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def find_helpers(modules: list[Module]) -> Helpers:
    """The checking helpers, by fixed point over every function under tests/."""
    by_name: dict[tuple[bool, str], list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for module in modules:
        for fn, method in module.functions():
            by_name.setdefault((method, fn.name), []).append(fn)
    helpers = Helpers()
    changed = True
    while changed:
        changed = False
        analyzer = Analyzer(helpers)
        for (method, name), defs in by_name.items():
            known = helpers.methods if method else helpers.functions
            if name in known:
                continue
            if all(_marked(fn) or analyzer.checks_always(fn)[0] for fn in defs):
                known.add(name)
                changed = True
    return helpers


def _marked(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The reason of ``@relies_on_exception("...")``; "" when it has none."""
    for decorator in fn.decorator_list:
        if isinstance(decorator, ast.Call) and _callee(decorator)[1] == MARKER:
            args = decorator.args
            if len(args) == 1 and isinstance(args[0], ast.Constant):
                return str(args[0].value).strip()
            return ""
    return None


def _raises_without_match(
    path: Path, fn: ast.FunctionDef | ast.AsyncFunctionDef
) -> Iterator[Finding]:
    reads = [
        (n.lineno, n.id)
        for n in ast.walk(fn)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    ]
    for node in ast.walk(fn):
        if not isinstance(node, (ast.With, ast.AsyncWith)):
            continue
        for item in node.items:
            call = item.context_expr
            if not (isinstance(call, ast.Call) and _is_pytest(call, {"raises"})):
                continue
            if any(k.arg == "match" for k in call.keywords):
                continue
            var = item.optional_vars
            if isinstance(var, ast.Name) and any(
                name == var.id and line >= node.lineno for line, name in reads
            ):
                continue
            yield Finding(
                path,
                call.lineno,
                "raises-without-match",
                f"{fn.name}: pytest.raises without match= and its exception never looked at "
                "(it would pass on the wrong error of that type)",
            )


def lint(
    paths: Iterable[Path] = (TESTS,), helper_paths: Iterable[Path] = (TESTS,)
) -> list[Finding]:
    """Every finding in ``paths``; checking helpers are looked for in ``helper_paths``."""

    def parse(files: list[Path]) -> list[Module]:
        return [Module(p, ast.parse(p.read_text(), str(p))) for p in files]

    modules = parse(python_files(paths))
    helpers = find_helpers(parse(python_files(helper_paths)))
    analyzer = Analyzer(helpers)
    findings: list[Finding] = []
    for module in modules:
        for fn, _ in module.functions():
            if fn.name.startswith(CHECK_PREFIXES) and _marked(fn) is None:
                ok, why = analyzer.checks_always(fn)
                if not ok:
                    findings.append(
                        Finding(module.path, fn.lineno, "helper-without-check", f"{fn.name}: {why}")
                    )
        for fn in module.tests():
            findings.extend(_raises_without_match(module.path, fn))
            reason = _marked(fn)
            if reason == "":
                findings.append(
                    Finding(module.path, fn.lineno, "hollow", f"{fn.name}: {MARKER} needs a reason")
                )
            if reason is not None:
                continue
            ok, why = analyzer.checks_always(fn)
            if not ok:
                findings.append(Finding(module.path, fn.lineno, "hollow", f"{fn.name}: {why}"))
    return sorted(findings, key=lambda f: (str(f.path), f.line))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    findings = lint([Path(a).resolve() for a in args] or [TESTS])
    for finding in findings:
        print(finding)
    if findings:
        print(
            f"{len(findings)} finding(s): make each test check what it runs, give "
            "pytest.raises a match=, or mark a test that checks by not raising with "
            f"@{MARKER}('why') (tests/lint_tests.py says what counts)",
            file=sys.stderr,
        )
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
