"""kubeproxy.sources.parsecache: a restart serves unchanged files from the cache, and the
cache never serves anything a fresh parse would not give."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from pathlib import Path

import pytest
import yaml

from kubeproxy import cli
from kubeproxy.model.events import RawObject
from kubeproxy.sources import manifestfile, manifests, parsecache
from kubeproxy.sources.manifests import ManifestSource
from kubeproxy.sources.parsecache import MAGIC, ParseCache
from kubeproxy.sources.standalone import StandaloneSource
from tests.unit.conftest import node_obj, service_obj, slice_obj

LOGGER = "kubeproxy.sources.parsecache"


@pytest.fixture(autouse=True)
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files written by a test are a moment old: let the cache keep them."""
    monkeypatch.setattr(manifestfile, "SETTLE_NS", 0)


def docs(*objs: object) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False)


def populate(directory: Path) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "web.yaml").write_text(docs(service_obj(), slice_obj()))
    (directory / "db.yaml").write_text(docs(service_obj("db"), slice_obj("db-1", "db")))
    listed = {"kind": "List", "items": [node_obj("n1"), node_obj("n2")]}
    (directory / "nodes.yaml").write_text(docs(listed))
    (directory / "empty.yaml").write_text("# nothing\n")
    (directory / "one.json").write_text('{"kind": "Node", "metadata": {"name": "n3"}}')


def source(directory: Path, cache_dir: Path) -> ManifestSource:
    cache = ParseCache.open(cache_dir, os.path.abspath(directory))
    assert cache is not None
    return ManifestSource(directory, raw=True, cache=cache)


def files(src: ManifestSource) -> dict[str, dict[object, object]]:
    return {path: dict(entry.objects) for path, entry in src._files.items()}


def hits(src: ManifestSource) -> int:
    assert src.cache is not None
    return src.cache.hits


def restart(directory: Path, cache_dir: Path) -> ManifestSource:
    """A source that has read the directory and saved its cache, then a new one's read."""
    first = source(directory, cache_dir)
    first.reload()
    first.save_cache()
    again = source(directory, cache_dir)
    again.reload()
    return again


def test_restart_gives_exactly_what_a_fresh_parse_gives(tmp_path: Path) -> None:
    populate(tmp_path / "m")
    fresh = ManifestSource(tmp_path / "m", raw=True)
    expected_events = fresh.reload()
    again = restart(tmp_path / "m", tmp_path / "cache")
    assert hits(again) == 5
    assert files(again) == files(fresh)
    # The documents themselves, not only their pickles.
    for path, entry in again._files.items():
        for key, obj in entry.objects.items():
            expected = fresh._files[path].objects[key]
            assert isinstance(obj, RawObject) and isinstance(expected, RawObject)
            assert obj.is_compact() and obj.doc == expected.doc
    assert source(tmp_path / "m", tmp_path / "cache").reload() == expected_events


@pytest.mark.parametrize("change", ["edit", "edit-same-size-and-mtime", "replace", "touch"])
def test_a_changed_file_is_parsed_again(tmp_path: Path, change: str) -> None:
    directory = tmp_path / "m"
    populate(directory)
    first = source(directory, tmp_path / "cache")
    first.reload()
    first.save_cache()
    web = directory / "web.yaml"
    before = web.stat()
    if change == "edit":
        web.write_text(docs(service_obj("web2"), slice_obj()))
    elif change == "edit-same-size-and-mtime":
        # Same length, and the old mtime put back: only ctime tells.
        text = web.read_text().replace("name: web-abc", "name: web-xyz")
        web.write_text(text)
        os.utime(web, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif change == "replace":
        other = directory / "new.tmp"
        other.write_text(web.read_text().replace("name: web-abc", "name: web-new"))
        other.rename(web)
    else:
        os.utime(web)
    again = source(directory, tmp_path / "cache")
    again.reload()
    assert hits(again) == 4
    assert files(again) == files(_fresh(directory))


def test_a_file_changed_just_before_it_was_read_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifestfile, "SETTLE_NS", parsecache.SETTLE_NS)
    populate(tmp_path / "m")
    again = restart(tmp_path / "m", tmp_path / "cache")
    assert hits(again) == 0


def test_a_file_that_logged_is_not_kept_so_it_logs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "m"
    populate(directory)
    (directory / "dup.yaml").write_text(docs(service_obj("x"), service_obj("x")))
    with caplog.at_level(logging.ERROR, logger="kubeproxy.sources.manifests"):
        again = restart(directory, tmp_path / "cache")
    assert hits(again) == 5
    duplicates = [r for r in caplog.records if "Skipping duplicate Service" in r.getMessage()]
    assert len(duplicates) == 2  # the first read, and the restart's


@pytest.mark.parametrize(
    "content",
    [b"not a cache at all", MAGIC + b"\x80\x05garbage", MAGIC],
    ids=["foreign", "corrupt", "truncated"],
)
def test_a_bad_cache_file_is_ignored_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    directory = tmp_path / "m"
    populate(directory)
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir(mode=0o700)
    path = ParseCache(cache_dir, os.path.abspath(directory)).path
    path.write_bytes(content)
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        src = source(directory, cache_dir)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"Ignoring manifest parse cache {path}")
    src.reload()
    assert hits(src) == 0
    assert files(src) == files(_fresh(directory))


def test_a_cache_for_another_version_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "m"
    populate(directory)
    first = source(directory, tmp_path / "cache")
    first.reload()
    first.save_cache()
    monkeypatch.setattr(parsecache, "FORMAT", parsecache.FORMAT + 1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        src = source(directory, tmp_path / "cache")
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"Ignoring manifest parse cache {src.cache.path if src.cache else ''}: ValueError: "
        "written by another version or for another directory"
    ]


def test_a_cache_directory_others_can_write_disables_the_cache(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    cache_dir.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert ParseCache.open(cache_dir, str(tmp_path)) is None
    (message,) = [r.getMessage() for r in caplog.records]
    assert message.startswith(f"Manifest parse cache disabled: cannot use {cache_dir}")
    assert "writable by others" in message


def test_concurrent_writers_leave_one_whole_version(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    populate(directory)
    cache_dir = tmp_path / "cache"
    writers = [source(directory, cache_dir) for _ in range(2)]
    for writer in writers:
        writer.reload()
    # Different contents: one writer keeps only some of the files.
    snapshots = [
        [(p, e.stamp, e.objects) for p, e in w._files.items()][: 2 + i]
        for i, w in enumerate(writers)
    ]
    errors: list[BaseException] = []

    def write(i: int) -> None:
        try:
            cache = writers[i].cache
            assert cache is not None
            for _ in range(30):
                assert cache.save(snapshots[i])
        except BaseException as err:  # reported below, not lost in the thread
            errors.append(err)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [p.name for p in cache_dir.iterdir()] == [writers[0].cache.path.name]  # type: ignore[union-attr]
    src = source(directory, cache_dir)
    src.reload()
    assert hits(src) in (2, 3)
    assert files(src) == files(_fresh(directory))


def _fresh(directory: Path) -> ManifestSource:
    fresh = ManifestSource(directory, raw=True)
    fresh.reload()
    return fresh


def test_watch_writes_the_cache_after_the_first_batch(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    populate(directory)
    src = source(directory, tmp_path / "cache")
    assert src.cache is not None
    path = src.cache.path

    async def main() -> None:
        stop = asyncio.Event()
        batches = src.watch(stop)
        first = await anext(batches)
        assert first and not path.exists()  # not before the consumer had the first batch
        (directory / "late.yaml").write_text(docs(service_obj("late")))
        await asyncio.wait_for(anext(batches), 10)
        assert path.exists()
        stop.set()
        await batches.aclose()

    asyncio.run(main())
    again = source(directory, tmp_path / "cache")
    again.reload()
    assert hits(again) == 5


def cli_source(*argv: str) -> StandaloneSource:
    parsed = cli.build_parser().parse_args(list(argv))
    cfg = cli.load_configuration(parsed)
    made = cli.make_source(cfg, cli.proxy_config(cfg, parsed), parsed)
    assert isinstance(made, StandaloneSource)
    return made


@pytest.mark.parametrize(
    ("argv", "cached"),
    [
        (("run", "--manifests-cache-dir", "CACHE"), True),
        (("run", "--manifests-cache-dir", ""), False),  # '' is none, not "."
        (("render", "--manifests-cache-dir", "CACHE"), False),  # one-shot: writes nothing
    ],
)
def test_the_flag_gives_run_its_cache(tmp_path: Path, argv: tuple[str, ...], cached: bool) -> None:
    populate(tmp_path / "m")
    command, *rest = (a.replace("CACHE", str(tmp_path / "cache")) for a in argv)
    made = cli_source(
        command, "--manifests", str(tmp_path / "m"), "--hostname-override", "n", *rest
    )
    assert (made.manifests.cache is not None) == cached
    assert (tmp_path / "cache").exists() == cached


def test_a_malformed_entry_is_parsed_instead(tmp_path: Path) -> None:
    directory = tmp_path / "m"
    populate(directory)
    cache = ParseCache(tmp_path, os.path.abspath(directory))
    web = os.path.abspath(directory / "web.yaml")
    stamp = manifests._stamp(web)
    assert stamp is not None
    for bad in (7, (), (stamp, 7), (stamp, (("Service", "default"),))):
        cache._entries[web] = bad  # type: ignore[assignment]
        assert cache.get(web, stamp) is None
