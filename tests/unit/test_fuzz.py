"""Hostile input, unit level (issue 12 part 1): see :mod:`tests.fuzz_objects`.

A few hundred examples in CI; ``python -m bench.fuzz --examples 10000`` runs the same
properties longer and RELIABILITY.md records its figures.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tests.fuzz_objects import (
    Doc,
    check_config,
    check_mixed,
    check_parse,
    config_document,
    mixed_objects,
    one_mutated,
)

FAST = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(one_mutated())
def test_parsing_raises_only_invalid_object_error(doc: Doc) -> None:
    check_parse(doc)


@settings(FAST, max_examples=60)
@given(mixed_objects())
def test_bad_objects_cost_one_line_and_only_themselves(
    objects: tuple[list[Doc], list[Doc]],
) -> None:
    check_mixed(*objects)


@settings(FAST, max_examples=60)
@given(config_document())
def test_config_files_fail_only_with_a_config_error(text: str) -> None:
    check_config(text)
