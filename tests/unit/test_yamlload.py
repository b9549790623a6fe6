"""kubeproxy.sources.yamlload: the same documents (and the same errors) as PyYAML's
``load_all`` with ``CSafeLoader``, on tricky YAML and on generated YAML."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.sources.yamlload import load_all

TRICKY = [
    "",
    "---\n",
    "a: 1\n---\nb: [1, 2]\n...\n---\n",
    "kind: Service\nspec:\n  ports:\n  - port: 80\n    name: http\n",
    # YAML 1.1 implicit types, as PyYAML resolves them.
    "a: yes\nb: No\nc: on\nd: OFF\ne: ~\nf: null\ng:\nh: ''\n",
    "a: 0o17\nb: 017\nc: 0x1F\nd: 0b101\ne: 1_000\nf: 190:20:30\ng: -12\nh: +3\n",
    "a: 1.5\nb: .inf\nc: -.Inf\nd: .nan\ne: 1e3\nf: 6.8523015e+5\ng: 190:20:30.15\n",
    "a: 2001-12-14t21:59:43.10-05:00\nb: 2002-12-14\nc: 2024-13-45\n",
    "a: '10.0.0.1'\nb: 10.0.0.1\nc: \"yes\"\nd: !!str 12\ne: !!int '12'\n",
    # Merge keys, aliases, explicit collection tags: PyYAML's constructor.
    "base: &b {x: 1}\nderived:\n  <<: *b\n  y: 2\n",
    "a: &x [1, 2]\nb: *x\n",
    "a: !!set {x, y}\nb: !!omap [{x: 1}, {y: 2}]\nc: !!pairs [{x: 1}]\n",
    "a: !!binary aGVsbG8=\n",
    "? [a, b]\n: c\n",
    "? {a: 1}\n: c\n",
    "=: x\n",
    "a: =\n",
    "<<: 1\n",
    # Errors: PyYAML checks merge keys before building any value.
    "<<: 2024-13-45\n",
    "a: 2024-13-45\n<<: 1\n",
    "a: !custom x\n",
    "1: one\ntrue: yes\n~: nothing\n1.5: f\n2002-12-14: d\n",
    "a: 1\na: 2\n",
    "a: |\n  line\n  two\nb: >\n  folded\n  text\n",
    "[" * 200 + "]" * 200,
    "a: [1, 2\n",
    "a: b: c\n",
    "\t- x\n",
    "a: !!int x\n",
    "a: !!float x\n",
    "- 1\n- - 2\n  - {a: [3]}\n",
]


def outcome(load: Any, text: str) -> tuple[str, Any]:
    try:
        return "ok", load(text)
    except Exception as err:
        return "error", (type(err), str(err))


def pyyaml(text: str) -> list[Any]:
    return list(yaml.load_all(text, Loader=yaml.CSafeLoader))


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 == 1.0 == True is not enough);
    NaN equals NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            k in b and same(k, next(k2 for k2 in b if k2 == k)) and same(v, b[k])
            for k, v in a.items()
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_yaml_loads_as_pyyaml_loads_it(text: str) -> None:
    ours, theirs = outcome(load_all, text), outcome(pyyaml, text)
    assert ours[0] == theirs[0]
    if ours[0] == "ok":
        assert same(ours[1], theirs[1])
    else:
        assert ours[1] == theirs[1]


def test_aliases_share_one_object_as_in_pyyaml() -> None:
    (doc,) = load_all("a: &x [1]\nb: *x\n")
    assert doc["a"] is doc["b"]


SCALARS = st.sampled_from(
    ["yes", "no", "on", "Off", "~", "null", "", "0", "017", "0x1f", "1_0", "1:20", "1.5",
     ".inf", "2024-01-02", "2024-13-45", "10.0.0.1", "node-a", "<<", "=", "a b", "'q'",
     '"d"', "!!str 1", "!!int 2", "-", "x: y", "#c", "[1]", "{}", "12e3", "+1", "True"]
)  # fmt: skip
KEYS = st.sampled_from(["a", "name", "1", "yes", "~", "<<", "=", "port", "2024-01-02"])


def render(value: Any, indent: int) -> str:
    """YAML text from a tree of dicts/lists whose leaves are raw scalar texts."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "\n" + "".join(
            f"{pad}{k}:{' ' if not isinstance(v, dict | list) or not v else ''}"
            f"{render(v, indent + 1)}\n".replace(":\n\n", ":\n")
            for k, v in value.items()
        ).rstrip("\n")
    if isinstance(value, list):
        if not value:
            return "[]"
        return "\n" + "\n".join(f"{pad}- {render(v, indent + 1).lstrip()}" for v in value)
    return str(value)


TREES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(st.lists(TREES, min_size=1, max_size=3))
def test_generated_yaml_loads_as_pyyaml_loads_it(docs: list[Any]) -> None:
    text = "---\n".join(f"{render(doc, 0).lstrip(chr(10))}\n" for doc in docs)
    ours, theirs = outcome(load_all, text), outcome(pyyaml, text)
    assert ours[0] == theirs[0], text
    if ours[0] == "ok":
        assert same(ours[1], theirs[1]), text
    else:
        assert ours[1] == theirs[1], text


@settings(max_examples=200, deadline=None)
@given(TREES)
def test_dumped_yaml_loads_as_pyyaml_loads_it(tree: Any) -> None:
    text = yaml.safe_dump_all([tree, {"k": tree}])
    assert same(load_all(text), pyyaml(text))
