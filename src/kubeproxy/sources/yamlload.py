"""YAML documents exactly as ``yaml.load_all(text, Loader=yaml.CSafeLoader)`` returns them,
in about half the time (the manifest source's cold start is mostly this).

With ``CSafeLoader`` libyaml parses and composes the node tree in C, but PyYAML then builds
the Python objects in Python, through a general machinery (a generator per collection, a
memo of every node, tag dispatch) that costs more than the parsing. Manifests are plain
mappings, lists and scalars, so :class:`_FastLoader` builds those directly and asks
PyYAML's own constructors for every scalar that is not a string (ints, booleans, nulls,
floats, timestamps...). Anything it does not handle the plain way, and any error, makes
the whole document go through PyYAML's constructor instead, so the result (and every
error) is PyYAML's: other tags (``!!set``, ``!!omap``, custom ones), merge keys (``<<``), keys that
are not scalars, nesting too deep for a recursive walk. Documents with aliases are
never built here (the text is checked for ``*``): PyYAML gives an aliased node one shared
object, which a tree walk would copy.

The tag of a node depends only on its kind, text and implicitness (SafeLoader has no
path resolvers), so it is remembered for the texts that repeat: keys, kinds, names. Strings
are interned: the same keys and names recur in every file, and a directory's objects
stay in memory (one copy of "nodeName" instead of one per endpoint: ~35 MB less at
10,000 Services x 10 endpoints).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_SEQ = "tag:yaml.org,2002:seq"
# Scalars whose PyYAML constructor is a plain function of the node (no generator).
_SCALARS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "timestamp")
)

_RESOLVER = yaml.resolver.Resolver()

# SafeLoader's resolution of a node's tag, remembered: it depends only on the node's
# kind, text and implicitness (SafeLoader has no path resolvers), and keys, kinds and
# names repeat in every file. A hit is a call into C, not Python.
_resolve = functools.lru_cache(maxsize=8192)(_RESOLVER.resolve)

# The C parser tells the resolver of every node it enters and leaves; without path
# resolvers that does nothing, so these take its arguments and do nothing, in C
# (two Python calls per node saved: ~0.1 s per 10,000 small files).
_NOTHING: dict[Any, Any] = {}
_enter_node = _NOTHING.get  # (parent, index) -> None
_leave_node: Callable[[], object] = tuple  # () -> (), ignored


class _SlowPathError(Exception):
    """This document needs PyYAML's own constructor."""


class _FastLoader(yaml.CSafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        if not self.yaml_path_resolvers:  # SafeLoader has none, unless added globally
            self.resolve = _resolve  # type: ignore[method-assign]
            self.descend_resolver = _enter_node  # type: ignore[assignment]
            self.ascend_resolver = _leave_node  # type: ignore[assignment]

    def construct_document(self, node: Node) -> Any:
        try:
            return self._build(node)
        except Exception:
            # Not plain (_SlowPathError), or an error: PyYAML's constructor decides, so
            # the error is the one it raises (it checks merge keys before any value).
            return super().construct_document(node)

    def _build(self, node: Node) -> Any:
        cls, tag = node.__class__, node.tag
        if cls is ScalarNode:
            if tag == _STR:
                return sys.intern(node.value)
            if tag in _SCALARS:
                return self.yaml_constructors[tag](self, node)
            raise _SlowPathError
        if cls is MappingNode and tag == _MAP:
            data: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                # Not a scalar: unhashable or odd, PyYAML decides; a merge key ("<<")
                # resolves to its own tag and so is not in _SCALARS either.
                if key_node.__class__ is not ScalarNode:
                    raise _SlowPathError
                data[self._build(key_node)] = self._build(value_node)
            return data
        if cls is SequenceNode and tag == _SEQ:
            return [self._build(item) for item in node.value]
        raise _SlowPathError


def load_all(text: str) -> list[Any]:
    """Every document of ``text``, as PyYAML's ``load_all`` with ``CSafeLoader`` gives."""
    loader = yaml.CSafeLoader(text) if "*" in text else _FastLoader(text)
    try:
        documents = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            documents.append(loader.get_data())
        return documents
    finally:
        loader.dispose()
