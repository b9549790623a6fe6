"""Reading many manifest files across processes gives exactly what reading them here gives:
the same objects, the same lines to log in the same order, the same cacheability; and a
helper process that cannot start or dies costs only a log line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from kubeproxy.model.events import Event
from kubeproxy.sources import manifestfile, manifests
from kubeproxy.sources.manifestfile import read_file, read_files
from kubeproxy.sources.manifests import ManifestSource, _stamp
from kubeproxy.sources.standalone import StandaloneSource
from tests.unit.conftest import service_obj, slice_obj
from tests.unit.controlplane_objects import node, pod, service

LOGGER = "kubeproxy.sources.manifestfile"


def write_directory(directory: Path, files: int) -> list[tuple[str, tuple[int, ...]]]:
    """``files`` manifests, with a broken one, a duplicate, JSON and a List among them."""
    directory.mkdir()
    for i in range(files):
        objs = [service_obj(f"svc-{i}"), slice_obj(f"svc-{i}-a", f"svc-{i}")]
        (directory / f"f{i:03}.yaml").write_text(yaml.safe_dump_all(objs))
    (directory / "f003.yaml").write_text("kind: Service\nmetadata: {name: [unclosed\n")
    (directory / "f005.yaml").write_text(yaml.safe_dump_all([service_obj("d"), service_obj("d")]))
    (directory / "f007.yaml").write_text(json.dumps(service_obj("json-one")))
    items = {"kind": "List", "items": [service_obj("l1"), service_obj("l2")]}
    (directory / "f009.yaml").write_text(yaml.safe_dump(items))
    paths = sorted(str(p) for p in directory.iterdir())
    return [(path, stamp) for path in paths if (stamp := _stamp(path)) is not None]


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every list is long enough, and there is one helper, whatever this machine's CPUs."""
    monkeypatch.setattr(manifestfile, "_helper_count", lambda files: 1)


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file has settled, however recently written (cacheable if clean)."""
    monkeypatch.setattr(manifestfile, "SETTLE_NS", -(2**62))


def serial(jobs: list[tuple[str, tuple[int, ...]]]) -> list[manifestfile.ReadResult]:
    return [read_file(path, stamp, True, 2**62) for path, stamp in jobs]


def test_helpers_read_exactly_what_this_process_reads(
    tmp_path: Path, parallel: None, settled: None
) -> None:
    jobs = write_directory(tmp_path / "m", 60)
    assert list(read_files(jobs, raw=True)) == serial(jobs)
    results = list(read_files(jobs, raw=True))
    assert results[3][0] is None and "Cannot read manifest file" in results[3][1][0]
    assert "Skipping duplicate Service default/d" in results[5][1][0]
    assert results[5][0] is not None and not results[5][0].cacheable
    assert all(entry.cacheable for entry, _ in results[10:] if entry is not None)


def test_a_file_still_changing_is_not_cacheable_whoever_read_it(
    tmp_path: Path, parallel: None
) -> None:
    jobs = write_directory(tmp_path / "m", 40)
    assert not any(entry.cacheable for entry, _ in list(read_files(jobs, raw=True)) if entry)


def test_a_helper_that_dies_costs_a_log_line_not_a_file(
    tmp_path: Path,
    parallel: None,
    settled: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = write_directory(tmp_path / "m", 60)

    def dying() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.buffer.read(8); sys.exit(3)"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    # The helper must get a chunk before this process has read them all (on a loaded
    # machine its start can take longer than reading 60 files here): this process
    # reads nothing until the helper's chunk has gone out.
    sent = threading.Event()
    real_send, real_read = manifestfile._send, manifestfile.read_file

    def send(stream: IO[bytes], value: Any) -> None:
        try:
            real_send(stream, value)
        finally:
            sent.set()

    def read_after_the_helper(*args: Any) -> manifestfile.ReadResult:
        sent.wait(30)
        return real_read(*args)

    monkeypatch.setattr(manifestfile, "_start_helper", dying)
    monkeypatch.setattr(manifestfile, "_send", send)
    monkeypatch.setattr(manifestfile, "read_file", read_after_the_helper)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        results = list(read_files(jobs, raw=True))
    assert results == serial(jobs)
    assert [r.getMessage() for r in caplog.records] == [
        "A manifest reading process failed: the other process closed the pipe "
        "(reading its files here)"
    ]


def test_a_helper_that_cannot_start_costs_a_log_line(
    tmp_path: Path,
    parallel: None,
    settled: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = write_directory(tmp_path / "m", 20)

    def refused() -> subprocess.Popen[bytes]:
        raise OSError("no more processes")

    monkeypatch.setattr(manifestfile, "_start_helper", refused)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert list(read_files(jobs, raw=True)) == serial(jobs)
    assert "Cannot start a manifest reading process: no more processes" in caplog.text


def test_short_lists_and_one_cpu_stay_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    assert manifestfile._helper_count(manifestfile.PARALLEL_MIN_FILES - 1) == 0
    assert manifestfile._helper_count(10_000) == manifestfile.MAX_HELPERS
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert manifestfile._helper_count(10_000) == 0


def test_the_source_logs_in_path_order_whoever_read_the_file(
    tmp_path: Path, parallel: None, caplog: pytest.LogCaptureFixture
) -> None:
    """The manifest source's lines (and events) do not depend on who read which file."""
    write_directory(tmp_path / "m", 60)
    with caplog.at_level(logging.ERROR):
        events = ManifestSource(tmp_path / "m", raw=True).reload()
    parallel_lines = [r.getMessage() for r in caplog.records]
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        # Not raw: models, read here whatever the count.
        ManifestSource(tmp_path / "m").reload()
    assert parallel_lines == [r.getMessage() for r in caplog.records]
    assert parallel_lines[0].startswith("Cannot read manifest file")
    # 2 a file; f003 broken: none, f005: one Service, f007 (JSON): one, f009: two.
    assert len(events) == 2 * 60 - 2 - 1 - 1


def cluster_directory(directory: Path, files: int) -> None:
    """A directory the control plane completes: Pods, Services with and without a
    ClusterIP, Nodes, a duplicate across files, one broken file."""
    directory.mkdir()
    for i in range(files):
        objs: list[dict[str, object]] = [
            svc_without_ip(f"svc-{i}", app=f"app-{i % 7}"),
            pod(f"pod-{i}", f"10.244.1.{i % 250 + 1}", node="node-a", app=f"app-{i % 7}"),
        ]
        if i % 5 == 0:
            objs.append(service_obj(f"fixed-{i}", clusterIP=f"10.96.100.{i % 250 + 1}"))
        (directory / f"f{i:03}.yaml").write_text(yaml.safe_dump_all(objs))
    (directory / "a-nodes.yaml").write_text(
        yaml.safe_dump_all([node("node-a", "zone-a"), node("node-b", "zone-b")])
    )
    (directory / "f001.yaml").write_text("kind: Service\nmetadata: {name: [unclosed\n")
    (directory / "z-dup.yaml").write_text(yaml.safe_dump(svc_without_ip("svc-7", app="other")))


def svc_without_ip(name: str, app: str) -> dict[str, object]:
    doc = service(name, cluster_ip="", families=(), selector={"app": app})
    del doc["metadata"]["uid"], doc["spec"]["clusterIP"], doc["spec"]["ipFamilies"]
    return doc


def first_load(directory: Path, stream: bool) -> tuple[list[str], list[dict[str, object]]]:
    source = StandaloneSource(directory, persist=False)
    folds: list[int] = []

    def fold(batch: list[Event]) -> None:
        folds.append(len(batch))
        source.cluster.fold(batch)

    if stream:
        source.manifests.on_first_load = fold
    else:
        source.manifests.on_first_load = None
    events = source.reload()
    assert (len(folds) > 5) == stream  # in runs of FIRST_LOAD_STEP objects
    return sorted(f"{e.type} {e.old!r} {e.new!r}" for e in events), source.cluster.objects()


def test_a_streamed_first_load_gives_what_one_batch_gives(
    tmp_path: Path,
    parallel: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The control plane folds a first load's files in as they are read (beside the
    helpers): the proxy's events, the completed objects and the log are the same as when
    it takes the whole directory in one batch."""
    monkeypatch.setattr(manifests, "FIRST_LOAD_STEP", 7)
    cluster_directory(tmp_path / "m", 80)
    with caplog.at_level(logging.INFO):
        streamed = first_load(tmp_path / "m", stream=True)
    streamed_log = [r.getMessage() for r in caplog.records if "Read " not in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        batch = first_load(tmp_path / "m", stream=False)
    assert streamed == batch
    assert len(streamed[0]) > 80 + 16  # Services, slices, Nodes
    assert streamed_log == [r.getMessage() for r in caplog.records if "Read " not in r.getMessage()]
    assert any("Skipping duplicate Service default/svc-7" in line for line in streamed_log)


def test_a_first_load_with_helpers_says_so_once_they_are_done(
    tmp_path: Path, parallel: None, caplog: pytest.LogCaptureFixture
) -> None:
    write_directory(tmp_path / "m", 30)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        StandaloneSource(tmp_path / "m", persist=False).reload()
    read = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Read ")]
    assert len(read) == 1 and "with 1 helper process(es)" in read[0]
