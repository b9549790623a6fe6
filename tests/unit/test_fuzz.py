"""Hostile input, unit level (issue 12 part 1): see :mod:`tests.fuzz_objects`.

A few hundred examples in CI; ``python -m bench.fuzz --examples 10000`` runs the same
properties longer and RELIABILITY.md records its figures.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz_objects import (
    Doc,
    big_objects,
    check_config,
    check_mixed,
    check_parse,
    check_standalone,
    config_document,
    mixed_objects,
    one_mutated,
    standalone_objects,
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


@pytest.mark.parametrize(("mode", "outcome"), [("iptables", "accepted"), ("ipvs", "rejected")])
def test_the_ipvs_section_is_read_in_ipvs_mode_only(mode: str, outcome: str) -> None:
    # Found by the fuzzer: an empty excludeCIDRs entry crashed the start in iptables
    # mode, where upstream neither validates nor reads the ipvs section.
    text = (
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        f"mode: {mode}\nipvs:\n  excludeCIDRs: ['']\n"
    )
    assert check_config(text) == outcome


def test_one_bad_port_or_endpoint_costs_only_the_smallest_part() -> None:
    """A duplicate among 1,000 ports rejects that Service whole (the API server would
    refuse it whole, and which of the two ports is meant cannot be known); a zone ID in
    the 10,000th endpoint of a slice costs that endpoint only, as upstream skips an
    endpoint without an address and a port 0, and nothing else changes."""
    big = big_objects()
    wide, deep_slice = copy.deepcopy(big[0]), copy.deepcopy(big[3])
    wide["metadata"]["name"] = "wide-dup"
    wide["spec"]["ports"].append(dict(wide["spec"]["ports"][0], name="again"))
    deep_slice["metadata"]["name"] = "deep-zone"
    deep_slice["endpoints"][-1]["addresses"] = ["fe80::1%eth0"]
    counts = check_mixed(big, [wide, deep_slice])
    assert counts["rejected"] == 1


@settings(FAST, max_examples=60)
@given(standalone_objects())
def test_the_standalone_control_plane_survives_hostile_objects(objects: list[Doc]) -> None:
    check_standalone(objects)
