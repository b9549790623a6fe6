"""kubeproxy.sources.manifests.ManifestSource: a directory of YAML/JSON as a watch source.

The source must behave like an informer (ADDED / MODIFIED / DELETED, nothing when nothing
changed) and be forgiving in the right way: a bad object or a half-written file must
never take other Services down with it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.model.events import Event, EventType, RawObject
from kubeproxy.model.types import EndpointSlice, NamespacedName, Node, Service, ServiceCIDR
from kubeproxy.sources.manifests import ManifestSource, diff
from tests.api.conftest import eventually
from tests.unit.conftest import node_obj, service_obj, slice_obj

LOGGER = "kubeproxy.sources.manifests"
_mtime = itertools.count(1)


def write(path: Path, text: str) -> Path:
    """Write a file and give it a fresh, unique mtime.

    The source caches by (mtime, size, inode); an edit that keeps the size within one
    filesystem timestamp tick would otherwise look unchanged to it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    stamp = 1_700_000_000_000_000_000 + next(_mtime) * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))
    return path


def docs(*objs: object) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False)


def keys(source: ManifestSource) -> set[tuple[str, str]]:
    return {(kind, str(name)) for kind, name in source.load()}


def summary(events: list[Event]) -> list[tuple[str, str, str]]:
    out = []
    for e in events:
        obj = e.new if e.new is not None else e.old
        assert obj is not None
        name = obj.name if isinstance(obj, Node | ServiceCIDR) else f"{obj.namespace}/{obj.name}"
        out.append((e.type.value, type(obj).__name__, name))
    return out


def error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR
    ]


# ================================================================================ loading


def test_multi_document_yaml(tmp_path: Path) -> None:
    write(tmp_path / "all.yaml", docs(service_obj(), slice_obj(), node_obj()))
    assert keys(ManifestSource(tmp_path)) == {
        ("Service", "default/web"),
        ("EndpointSlice", "default/web-abc"),
        ("Node", "/node-a"),
    }


def test_yaml_with_document_markers_and_empty_documents(tmp_path: Path) -> None:
    text = "---\n" + docs(service_obj()) + "---\n---\n# just a comment\n---\n" + docs(node_obj())
    write(tmp_path / "x.yml", text)
    assert keys(ManifestSource(tmp_path)) == {("Service", "default/web"), ("Node", "/node-a")}


def test_json_file(tmp_path: Path) -> None:
    write(tmp_path / "svc.json", json.dumps(service_obj(namespace="shop")))
    source = ManifestSource(tmp_path)
    objs = source.load()
    svc = objs[("Service", NamespacedName("shop", "web"))]
    assert isinstance(svc, Service)
    assert svc.ports[0].port == 80


@pytest.mark.parametrize("list_kind", ["List", "ServiceList"])
def test_kind_list_is_unpacked(tmp_path: Path, list_kind: str) -> None:
    # kubectl get -o yaml produces these
    listing = {
        "apiVersion": "v1",
        "kind": list_kind,
        "items": [service_obj("a"), service_obj("b"), slice_obj("a-1", "a")],
    }
    write(tmp_path / "list.yaml", docs(listing))
    assert keys(ManifestSource(tmp_path)) == {
        ("Service", "default/a"),
        ("Service", "default/b"),
        ("EndpointSlice", "default/a-1"),
    }


def test_nested_list_in_json(tmp_path: Path) -> None:
    inner = {"kind": "List", "items": [node_obj("n1")]}
    write(tmp_path / "l.json", json.dumps({"kind": "List", "items": [inner, node_obj("n2")]}))
    assert keys(ManifestSource(tmp_path)) == {("Node", "/n1"), ("Node", "/n2")}


def test_nested_directories(tmp_path: Path) -> None:
    write(tmp_path / "a" / "b" / "c" / "svc.yaml", docs(service_obj("deep")))
    write(tmp_path / "top.yaml", docs(service_obj("top")))
    assert keys(ManifestSource(tmp_path)) == {
        ("Service", "default/deep"),
        ("Service", "default/top"),
    }


def test_hidden_files_and_directories_and_other_suffixes_ignored(tmp_path: Path) -> None:
    write(tmp_path / "visible.yaml", docs(service_obj("visible")))
    # editors' swap/backup files and VCS directories must not become Services
    write(tmp_path / ".hidden.yaml", docs(service_obj("hidden-file")))
    write(tmp_path / ".git" / "svc.yaml", docs(service_obj("hidden-dir")))
    write(tmp_path / "sub" / ".cache" / "svc.json", json.dumps(service_obj("hidden-nested")))
    write(tmp_path / "notes.txt", docs(service_obj("txt")))
    write(tmp_path / "svc.yaml.bak", docs(service_obj("bak")))
    write(tmp_path / "svc.yaml~", docs(service_obj("tilde")))
    assert keys(ManifestSource(tmp_path)) == {("Service", "default/visible")}


def test_unknown_kinds_and_non_objects_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(
        tmp_path / "mixed.yaml",
        docs(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}},
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web"}},
            {"metadata": {"name": "no-kind"}},
            "just a string",
            [1, 2, 3],
            service_obj(),
        ),
    )
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert keys(ManifestSource(tmp_path)) == {("Service", "default/web")}
    # ignoring other kinds is normal, not an error
    assert error_lines(caplog) == []


def test_empty_and_missing_directory(tmp_path: Path) -> None:
    assert ManifestSource(tmp_path).reload() == []
    assert ManifestSource(tmp_path / "nope").reload() == []


# =============================================================================== reloading


def test_reload_event_sequence(tmp_path: Path) -> None:
    svc_file = write(tmp_path / "svc.yaml", docs(service_obj("web"), service_obj("db")))
    write(tmp_path / "eps.yaml", docs(slice_obj()))
    source = ManifestSource(tmp_path)

    first = source.reload()
    assert sorted(summary(first)) == [
        ("ADDED", "EndpointSlice", "default/web-abc"),
        ("ADDED", "Service", "default/db"),
        ("ADDED", "Service", "default/web"),
    ]
    assert all(e.old is None for e in first)

    # nothing changed: nothing to do
    assert source.reload() == []

    # web changes port, db goes away
    write(svc_file, docs(service_obj("web", ports=[{"port": 8080}])))
    events = source.reload()
    assert summary(events) == [
        ("DELETED", "Service", "default/db"),
        ("MODIFIED", "Service", "default/web"),
    ]
    modified = events[1]
    assert isinstance(modified.old, Service) and isinstance(modified.new, Service)
    assert (modified.old.ports[0].port, modified.new.ports[0].port) == (80, 8080)
    assert events[0].new is None and isinstance(events[0].old, Service)

    # removing a file deletes what it held
    (tmp_path / "eps.yaml").unlink()
    assert summary(source.reload()) == [("DELETED", "EndpointSlice", "default/web-abc")]
    assert source.reload() == []


def test_rewrite_with_same_content_is_not_an_event(tmp_path: Path) -> None:
    path = write(tmp_path / "svc.yaml", docs(service_obj()))
    source = ManifestSource(tmp_path)
    source.reload()
    # touched/re-saved (and reformatted) but semantically identical
    write(path, json.dumps(service_obj()))
    write(path, "# reformatted\n" + docs(service_obj()))
    assert source.reload() == []


def test_object_moved_between_files_is_not_an_event(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", docs(service_obj()))
    source = ManifestSource(tmp_path)
    source.reload()
    (tmp_path / "a.yaml").unlink()
    write(tmp_path / "b.yaml", docs(service_obj()))
    assert source.reload() == []


def test_diff_orders_deletes_first() -> None:
    a = ("Service", NamespacedName("default", "a"))
    b = ("Service", NamespacedName("default", "b"))
    svc_a = Service("default", "a", ())
    svc_b = Service("default", "b", ())
    events = diff({b: svc_b}, {a: svc_a})
    assert [e.type for e in events] == [EventType.DELETED, EventType.ADDED]


# ============================================================================== bad input


def test_invalid_object_is_logged_once_and_absent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = service_obj("broken", ports=[{"port": 0}])
    write(tmp_path / "svc.yaml", docs(service_obj("good"), bad, slice_obj()))
    source = ManifestSource(tmp_path)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        events = source.reload()
        # other objects, even in the same file, are unaffected
        assert sorted(summary(events)) == [
            ("ADDED", "EndpointSlice", "default/web-abc"),
            ("ADDED", "Service", "default/good"),
        ]
        (line,) = error_lines(caplog)
        assert "\n" not in line
        assert "Service default/broken" in line
        assert "spec.ports[0].port" in line
        # not re-logged while the file is unchanged
        assert source.reload() == []
        assert len(error_lines(caplog)) == 1


def test_object_becoming_invalid_is_deleted_and_back_is_added(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "svc.yaml", docs(service_obj("web"), service_obj("db")))
    source = ManifestSource(tmp_path)
    source.reload()
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        write(path, docs(service_obj("web", clusterIP="10.96.0.999"), service_obj("db")))
        assert summary(source.reload()) == [("DELETED", "Service", "default/web")]
    assert "spec.clusterIP" in error_lines(caplog)[0]
    write(path, docs(service_obj("web"), service_obj("db")))
    assert summary(source.reload()) == [("ADDED", "Service", "default/web")]


def test_hostile_name_is_logged_on_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "evil.yaml", docs(service_obj("web\nERROR forged line"), service_obj("ok")))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert keys(ManifestSource(tmp_path)) == {("Service", "default/ok")}
    (line,) = error_lines(caplog)
    assert len(line.splitlines()) == 1


@pytest.mark.parametrize(
    ("name", "broken"),
    [
        ("svc.yaml", "apiVersion: v1\nkind: Service\nmetadata:\n  name: [unclosed\n"),
        ("svc.yaml", "kind: Service\n\tbad: tab-indented\n"),
        ("svc.json", '{"kind": "Service", "metadata": {"name": "web"'),
        ("svc.yaml", "kind: Service\nmetadata: {name: web}\n\xff\n"),
        # Well-formed YAML whose scalars cannot be constructed: PyYAML raises a plain
        # ValueError, not a YAMLError (this used to abort the whole reload).
        ("svc.yaml", "kind: Service\nmetadata:\n  name: web\n  created: 2024-13-45\n"),
        ("svc.yaml", "kind: Service\nmetadata: {name: web}\nspec: {ports: [{port: !!int x}]}\n"),
        # json.loads raises RecursionError on deep nesting
        ("svc.json", "[" * 100_000),
        # A List containing itself through a YAML alias: unpacking it recursed until
        # RecursionError escaped and aborted the whole reload (found writing the fuzzer).
        ("svc.yaml", "&a {kind: List, items: [*a]}\n"),
        ("svc.yaml", "kind: Service\nmetadata: &m {name: web, labels: {x: *m}}\n"),
    ],
    ids=[
        "yaml-flow",
        "yaml-tab",
        "json-truncated",
        "not-utf8",
        "yaml-impossible-date",
        "yaml-bad-int-tag",
        "json-too-deep",
        "yaml-recursive-list",
        "yaml-recursive-object",
    ],
)
def test_unreadable_file_keeps_previous_objects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, broken: str
) -> None:
    path = tmp_path / name
    good = json.dumps(service_obj()) if name.endswith(".json") else docs(service_obj())
    write(path, good)
    write(tmp_path / "other.yaml", docs(service_obj("other")))
    source = ManifestSource(tmp_path)
    assert len(source.reload()) == 2
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        # An editor's half-written save must not delete the Service.
        if broken.endswith("\xff\n"):
            path.write_bytes(broken.encode("latin-1"))
            os.utime(path, ns=(1, 1))
        else:
            write(path, broken)
        assert source.reload() == []
    lines = error_lines(caplog)
    assert lines, "a broken file must be logged"
    assert all(len(line.splitlines()) == 1 for line in lines)
    assert str(path) in lines[0]
    assert ("Service", NamespacedName("default", "web")) in source.load()
    # once fixed, changes flow again
    fixed = service_obj(ports=[{"port": 81}])
    write(path, json.dumps(fixed) if name.endswith(".json") else docs(fixed))
    assert summary(source.reload()) == [("MODIFIED", "Service", "default/web")]


def test_broken_file_from_the_start_is_absent_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "bad.yaml", "kind: Service\nmetadata: {name: [\n")
    write(tmp_path / "ok.yaml", docs(service_obj("ok")))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert summary(ManifestSource(tmp_path).reload()) == [("ADDED", "Service", "default/ok")]
    assert any("bad.yaml" in line for line in error_lines(caplog))


def test_duplicate_object_first_path_wins_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "a.yaml", docs(service_obj(ports=[{"port": 1111}])))
    write(tmp_path / "b.yaml", docs(service_obj(ports=[{"port": 2222}])))
    source = ManifestSource(tmp_path)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        (event,) = source.reload()
        assert isinstance(event.new, Service) and event.new.ports[0].port == 1111
        assert source.reload() == []
        write(tmp_path / "c.yaml", docs(service_obj("unrelated")))
        source.reload()
    (line,) = error_lines(caplog)
    assert "Service default/web" in line
    assert "b.yaml" in line and "a.yaml" in line
    assert line.index("b.yaml") < line.index(
        "a.yaml"
    )  # "... in b.yaml (already defined in a.yaml)"


def test_duplicate_first_path_is_in_sorted_order_across_directories(tmp_path: Path) -> None:
    # "a/x.yaml" sorts before "b.yaml" even though os.walk lists b.yaml (top level) first.
    write(tmp_path / "a" / "x.yaml", docs(service_obj(ports=[{"port": 1111}])))
    write(tmp_path / "b.yaml", docs(service_obj(ports=[{"port": 2222}])))
    objs = ManifestSource(tmp_path).load()
    svc = objs[("Service", NamespacedName("default", "web"))]
    assert isinstance(svc, Service) and svc.ports[0].port == 1111


def test_duplicate_resolved_when_first_copy_removed(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", docs(service_obj(ports=[{"port": 1111}])))
    write(tmp_path / "b.yaml", docs(service_obj(ports=[{"port": 2222}])))
    source = ManifestSource(tmp_path)
    source.reload()
    (tmp_path / "a.yaml").unlink()
    (event,) = source.reload()
    assert event.type is EventType.MODIFIED
    assert isinstance(event.new, Service) and event.new.ports[0].port == 2222


def test_duplicate_with_hostile_name_logged_on_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    evil = service_obj("x\nCRITICAL forged")
    write(tmp_path / "a.yaml", docs(evil))
    write(tmp_path / "b.yaml", docs(evil))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        ManifestSource(tmp_path).reload()
    lines = error_lines(caplog)
    assert any("duplicate" in line for line in lines)
    assert all(len(line.splitlines()) == 1 for line in lines), lines


def test_same_name_different_kinds_are_not_duplicates(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path / "a.yaml", docs(service_obj("web"), slice_obj("web", "web"), node_obj("web")))
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        objs = ManifestSource(tmp_path).load()
    assert {type(o) for o in objs.values()} == {Service, EndpointSlice, Node}
    assert error_lines(caplog) == []


# ================================================================================= watching


def test_watch_yields_initial_state_then_batches_on_edit(tmp_path: Path) -> None:
    path = write(tmp_path / "svc.yaml", docs(service_obj()))

    async def scenario() -> list[list[Event]]:
        stop = asyncio.Event()
        source = ManifestSource(tmp_path, poll_interval=0.1)
        # watch() is an async generator: close it when done.
        batches = source.watch(stop)
        seen = [await asyncio.wait_for(anext(batches), 5)]

        async def edit_until_seen() -> None:
            # The file watcher starts when the generator is resumed; keep editing until it
            # has seen one edit (each edit is a real change, so the batch is never empty).
            for port in itertools.count(1000):
                write(path, docs(service_obj(ports=[{"port": port}])))
                await asyncio.sleep(0.3)

        editor = asyncio.create_task(edit_until_seen())
        try:
            seen.append(await asyncio.wait_for(anext(batches), 10))
        finally:
            editor.cancel()
            stop.set()
            await batches.aclose()
        return seen

    initial, edited = asyncio.run(scenario())
    assert summary(initial) == [("ADDED", "Service", "default/web")]
    assert summary(edited) == [("MODIFIED", "Service", "default/web")]
    new = edited[0].new
    assert isinstance(new, Service) and new.ports[0].port >= 1000


def test_watch_left_running_at_exit_ends_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``asyncio.run`` cancels every task still running when the main coroutine returns
    (``explain`` and ``list`` return with the source still watching): the file watcher's
    task is cancelled too, and must end without an error logged at shutdown."""
    write(tmp_path / "svc.yaml", docs(service_obj()))

    async def main() -> None:
        batches = ManifestSource(tmp_path, poll_interval=60).watch(asyncio.Event())

        async def consume() -> None:
            async for _ in batches:
                pass

        consumer = asyncio.create_task(consume())
        await asyncio.sleep(0.3)  # the initial state consumed, the watcher waiting
        assert not consumer.done()  # left running: asyncio.run cancels it

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# ==================================================== watching: only what the watcher reports


class Watching:
    """A running ``watch()``: the test changes files and awaits the batches they cause."""

    def __init__(self, source: ManifestSource) -> None:
        self.stop = asyncio.Event()
        self.source = source
        self.batches = self.source.watch(self.stop)

    async def next(self) -> list[tuple[str, str, str]]:
        return summary(await asyncio.wait_for(anext(self.batches), 10))

    async def settled(self) -> list[tuple[str, str, str]]:
        """The batch of a sentinel change made now: whatever came before it shows too."""
        sentinel = self.source.directory / "zz-sentinel.yaml"
        port = next(_mtime)
        replace(sentinel, docs(service_obj("sentinel", ports=[{"port": port}])))
        seen: list[tuple[str, str, str]] = []
        while not any(name == "default/sentinel" for _, _, name in seen):
            seen += await self.next()
        return [s for s in seen if s[2] != "default/sentinel"]

    async def close(self) -> None:
        self.stop.set()
        await self.batches.aclose()


def replace(path: Path, text: str) -> None:
    """Write a file the way careful writers (and kubectl-like tools) do: rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def watching(directory: Path, scenario: Any) -> None:
    async def main() -> None:
        w = Watching(ManifestSource(directory, poll_interval=60.0))
        try:
            await w.next()  # the initial state
            await scenario(w)
        finally:
            await w.close()

    asyncio.run(main())


def test_watch_rename_over_and_delete(tmp_path: Path) -> None:
    replace(tmp_path / "web.yaml", docs(service_obj(), slice_obj()))

    async def scenario(w: Watching) -> None:
        replace(tmp_path / "web.yaml", docs(service_obj(ports=[{"port": 81}]), slice_obj()))
        assert await w.next() == [("MODIFIED", "Service", "default/web")]
        (tmp_path / "web.yaml").unlink()
        assert sorted(await w.next()) == [
            ("DELETED", "EndpointSlice", "default/web-abc"),
            ("DELETED", "Service", "default/web"),
        ]

    watching(tmp_path, scenario)


def test_watch_directory_moved_in_and_out(tmp_path: Path) -> None:
    root = tmp_path / "manifests"
    root.mkdir()
    # Prepared where the source does not look (a hidden directory), then moved in whole.
    write(root / ".staging" / "app" / "web.yaml", docs(service_obj()))
    write(root / ".staging" / "db.yaml", docs(service_obj("db")))

    async def scenario(w: Watching) -> None:
        assert await w.settled() == []
        (root / ".staging").rename(root / "team")
        assert sorted(await w.settled()) == [
            ("ADDED", "Service", "default/db"),
            ("ADDED", "Service", "default/web"),
        ]
        (root / "team").rename(tmp_path / "elsewhere")
        assert sorted(await w.settled()) == [
            ("DELETED", "Service", "default/db"),
            ("DELETED", "Service", "default/web"),
        ]

    watching(root, scenario)


def test_watch_broken_file_keeps_its_last_good_objects(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    replace(tmp_path / "web.yaml", docs(service_obj()))

    async def scenario(w: Watching) -> None:
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            replace(tmp_path / "web.yaml", "kind: Service\nmetadata: {name: [\n")
            assert await w.settled() == []
        assert any("web.yaml" in line for line in error_lines(caplog))
        replace(tmp_path / "web.yaml", docs(service_obj(ports=[{"port": 81}])))
        assert await w.next() == [("MODIFIED", "Service", "default/web")]

    watching(tmp_path, scenario)


class LosesEvents(ManifestSource):
    """Every path the watcher reports is lost (as in an inotify queue overflow)."""

    def _changed(self, reported: Iterable[str]) -> bool:
        for _ in reported:
            pass
        return False


def test_watch_lost_event_is_repaired_by_the_rescan(tmp_path: Path) -> None:
    async def main() -> None:
        w = Watching(LosesEvents(tmp_path, poll_interval=0.3))
        try:
            assert await w.next() == []
            write(tmp_path / "web.yaml", docs(service_obj()))
            assert await w.next() == [("ADDED", "Service", "default/web")]
        finally:
            await w.close()

    asyncio.run(main())


def test_watch_duplicate_first_path_wins_as_files_come_and_go(tmp_path: Path) -> None:
    replace(tmp_path / "a.yaml", docs(service_obj(ports=[{"port": 1111}])))
    replace(tmp_path / "b.yaml", docs(service_obj(ports=[{"port": 2222}])))

    def port(events: list[Event]) -> int:
        (event,) = events
        assert isinstance(event.new, Service)
        return event.new.ports[0].port

    async def scenario(w: Watching) -> None:
        # The losing copy changes: nothing to report.
        replace(tmp_path / "b.yaml", docs(service_obj(ports=[{"port": 2223}])))
        assert await w.settled() == []
        (tmp_path / "a.yaml").unlink()
        assert port(await anext(w.batches)) == 2223
        replace(tmp_path / "a.yaml", docs(service_obj(ports=[{"port": 3333}])))
        assert port(await anext(w.batches)) == 3333

    watching(tmp_path, scenario)


def test_watch_configmap_volume_swap_is_seen(tmp_path: Path) -> None:
    # A ConfigMap volume: the files are symlinks through "..data", a hidden symlink to a
    # hidden timestamped directory; an update writes a new directory and renames a new
    # "..data" over the old one. No event names a manifest file.
    write(tmp_path / "..v1" / "web.yaml", docs(service_obj()))
    (tmp_path / "..data").symlink_to("..v1")
    (tmp_path / "web.yaml").symlink_to("..data/web.yaml")

    async def scenario(w: Watching) -> None:
        write(tmp_path / "..v2" / "web.yaml", docs(service_obj(ports=[{"port": 81}])))
        (tmp_path / "..data_tmp").symlink_to("..v2")
        (tmp_path / "..data_tmp").replace(tmp_path / "..data")
        assert await w.next() == [("MODIFIED", "Service", "default/web")]

    watching(tmp_path, scenario)


def test_watch_directory_back_during_a_rescan_deletes_nothing(tmp_path: Path) -> None:
    """Found by a flaky test under load: a re-scan ran while the directory was away and
    found nothing; the directory came back before the source looked again, so it took
    the empty scan for the directory's and deleted every Service once (then added them
    back at the next round). Here the directory comes back inside the scan itself."""
    root = tmp_path / "manifests"
    replace(root / "web.yaml", docs(service_obj(), slice_obj()))
    replace(root / "db.yaml", docs(service_obj("db")))
    staged = tmp_path / "staged"
    replace(staged / "web.yaml", docs(service_obj(), slice_obj()))
    replace(staged / "db.yaml", docs(service_obj("db", ports=[{"port": 81}])))

    async def main() -> None:
        stop = asyncio.Event()
        batches: list[list[tuple[str, str, str]]] = []
        source = ManifestSource(root, poll_interval=0.1)
        scan = source._scan

        def scan_then_return() -> dict[str, tuple[int, ...]]:
            stamps = scan()
            if not root.exists():
                staged.rename(root)  # back, after this scan found nothing
            return stamps

        async def consume() -> None:
            async for batch in source.watch(stop):
                batches.append(summary(batch))

        consumer = asyncio.create_task(consume())
        try:
            await eventually(lambda: len(batches) == 1)
            root.rename(tmp_path / "away")
            await asyncio.sleep(0.5)  # gone, and known to be
            source._scan = scan_then_return  # type: ignore[method-assign]
            await eventually(lambda: len(batches) == 2)
            await asyncio.sleep(0.3)
            assert batches[1:] == [[("MODIFIED", "Service", "default/db")]]
        finally:
            stop.set()
            await consumer

    asyncio.run(main())


@pytest.mark.parametrize("how", ["deleted", "renamed-away"])
def test_watch_directory_gone_keeps_the_state_until_it_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    """Found by fault injection: a manifest directory that disappeared (deleted, renamed
    away, an unmounted volume) was read as empty and every Service's rules were removed.
    The source is unavailable, not empty: nothing is deleted, one line says so, and when
    the directory is back only the differences go out."""
    root = tmp_path / "manifests"
    replace(root / "web.yaml", docs(service_obj(), slice_obj()))
    replace(root / "db.yaml", docs(service_obj("db")))

    async def main() -> None:
        stop = asyncio.Event()
        batches: list[list[tuple[str, str, str]]] = []

        async def consume() -> None:
            async for batch in ManifestSource(root, poll_interval=0.2).watch(stop):
                batches.append(summary(batch))

        consumer = asyncio.create_task(consume())
        try:
            await eventually(lambda: len(batches) == 1)
            assert len(batches[0]) == 3
            if how == "deleted":
                shutil.rmtree(root)
            else:
                root.rename(tmp_path / "away")
            await asyncio.sleep(1.0)  # several re-scans find nothing
            assert batches[1:] == []
            # Back whole, as a volume or a `mv` brings it: a directory that reappears
            # empty is an empty source (a re-scan between a mkdir and its files would
            # rightly delete; seen once under load).
            staged = tmp_path / "staged"
            replace(staged / "web.yaml", docs(service_obj(), slice_obj()))
            replace(staged / "db.yaml", docs(service_obj("db", ports=[{"port": 81}])))
            staged.rename(root)
            # The first batch after the outage is the one difference, no deletions.
            await eventually(lambda: len(batches) == 2)
            assert batches[1] == [("MODIFIED", "Service", "default/db")]
            # And the new directory is watched.
            replace(root / "new.yaml", docs(service_obj("new")))
            await eventually(lambda: len(batches) == 3)
            assert batches[2] == [("ADDED", "Service", "default/new")]
        finally:
            stop.set()
            await consumer
        gone = [line for line in error_lines(caplog) if "is gone" in line]
        assert len(gone) == 1 and str(root) in gone[0]

    asyncio.run(main())


# ======================================================================= raw documents


def test_raw_documents_are_kept_compact_and_decode_to_what_was_read(tmp_path: Path) -> None:
    """Raw mode keeps each object pickled, not as a tree of Python objects (memory): the
    events still carry the documents exactly as read, dates and sets included."""
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns, labels: {app: a}}\n"
        "spec: {when: 2024-01-02, tags: !!set {x: null}, 7: seven}\n"
    )
    write(tmp_path / "pod.yaml", text)
    source = ManifestSource(tmp_path, raw=True)
    (event,) = source.reload()
    expected = yaml.safe_load(text)
    assert isinstance(event.new, RawObject)
    assert event.new.doc == expected
    assert all(
        obj is None or (isinstance(obj, RawObject) and obj.is_compact())
        for entry in source._files.values()
        for obj in entry.objects.values()
    )
    # Touched without a change: no event (equal documents are equal objects).
    write(tmp_path / "pod.yaml", text)
    assert source.reload() == []
    # The same document with its keys in another order is not a change either.
    write(tmp_path / "pod.yaml", "kind: Pod\napiVersion: v1\n" + text.split("\n", 2)[2])
    assert source.reload() == []
    write(tmp_path / "pod.yaml", text.replace("app: a", "app: b"))
    (changed,) = source.reload()
    assert changed.type is EventType.MODIFIED
    assert isinstance(changed.old, RawObject) and changed.old.doc == expected


def test_a_raw_document_too_deep_to_keep_is_an_unreadable_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Deep enough for pickle's recursion limit, not for the JSON decoder's.
    deep = "[" * 900 + '"x"' + "]" * 900
    write(tmp_path / "pod.json", f'{{"kind": "Pod", "metadata": {{"name": "p"}}, "spec": {deep}}}')
    source = ManifestSource(tmp_path, raw=True)
    caplog.set_level(logging.ERROR)
    assert source.reload() == []
    assert any("pod.json" in line for line in error_lines(caplog))
