"""run --prompt-cache FILE at its edges (edgesdk/runtime/cache_file.py and its wiring in edgesdk/cli.py):
damaged files, runs that write the same file at once, a write that fails halfway."""

from __future__ import annotations

import io
import os
import shutil
import zipfile

import numpy as np
import pytest

from edgesdk.runtime import cache_file
from edgesdk.runtime.prompt_cache import PromptCache
from tests.unit.test_cache_file import _cached, _run
from tests.unit.test_cli import invoke

pytest.importorskip("torch")

BUNDLE_ID = "0123456789abcdef"


@pytest.fixture(scope="module", params=["standard", "ort-fused"])
def backend(request, tmp_path_factory):
    from tests.unit.test_prompt_cache import BACKENDS

    return BACKENDS[request.param](tmp_path_factory.mktemp(request.param))


def _filled(backend, count: int = 40) -> PromptCache:
    """A cache holding ``count`` prefilled tokens."""
    cache = PromptCache(backend)
    ids = [int(t) for t in np.random.default_rng(count).integers(0, 320, count)]
    backend.reset()
    backend.prefill(np.array(ids))
    cache.tokens = ids
    return cache


def test_a_npy_file_is_named_as_one_array_and_rewritten(tiny_bundle, tmp_path):
    """np.load gives an array, not an archive, for a .npy file; ``with`` on it was a TypeError (and on
    Python 3.10, the boards', an AttributeError that was not caught: a traceback)."""
    path = tmp_path / "prompt.cache"
    with open(path, "wb") as out:
        np.save(out, np.arange(12))
    result = _run(tiny_bundle, "--prompt-cache", path, "--prompt-cache-ro")  # read, never written
    assert "not the .npz archive a cache file is" in result.stderr
    written = path.read_bytes()
    refused = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--prompt-cache", path)
    assert refused.exit_code != 0  # a file no run wrote is not written over (llama-cli refuses it too)
    assert "is not a prompt cache file" in refused.output
    assert path.read_bytes() == written


def _huge_member(name: str, descr: str) -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": (2**40,)})
    return header.getvalue() + bytes(64)


@pytest.mark.parametrize("member", ["tokens", "cache_0"])
def test_a_header_that_gives_an_array_terabytes_is_not_loaded(tiny_bundle, tmp_path, member):
    """A damaged .npy header inside the archive (one shape entry 2**40) made np.load allocate terabytes:
    a MemoryError traceback instead of a file that is named and rewritten."""
    path = tmp_path / "prompt.cache"
    _run(tiny_bundle, "--prompt-cache", path)
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    members[f"{member}.npy"] = _huge_member(member, "<i8" if member == "tokens" else "<f4")
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    result = _run(tiny_bundle, "--prompt-cache", path)
    assert "cannot be read as a cache file (MemoryError" in result.stderr
    assert _cached(result.stderr) == 0
    assert "tokens loaded" in _run(tiny_bundle, "--prompt-cache", path).stderr


def test_two_runs_writing_the_same_file_at_once_both_succeed(backend, tmp_path, monkeypatch):
    """Both writers used one ``FILE.partial``: the second truncated the first one's file and renamed it, and
    the first one's rename then failed (FileNotFoundError, a 'cannot write the prompt cache' error)."""
    path = tmp_path / "prompt.cache"
    first, second = _filled(backend, 40), _filled(backend, 30)
    fsync, other = os.fsync, []

    def interleaved(fd):  # the other run writes its cache while this one has not renamed its file yet
        if not other:
            other.append(True)
            cache_file.save(path, second, BUNDLE_ID)
        fsync(fd)

    first_state, _ = _filled(backend, 40).backend.save_cache()
    monkeypatch.setattr(os, "fsync", interleaved)
    cache_file.save(path, first, BUNDLE_ID)
    monkeypatch.setattr(os, "fsync", fsync)
    assert other
    loaded = PromptCache(backend)
    assert cache_file.load(path, loaded, BUNDLE_ID) == (40, None)  # the last rename's cache, whole
    assert loaded.tokens == first.tokens
    state, _ = backend.save_cache()
    for saved, expected in zip(state, first_state, strict=True):
        np.testing.assert_array_equal(saved, expected)
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("interruption", [KeyboardInterrupt(), OSError(28, "No space left on device")])
def test_a_write_that_fails_halfway_leaves_the_old_cache_and_no_partial_file(backend, tmp_path, monkeypatch,
                                                                              interruption):
    """Ctrl-C or a full disk during the write left the half-written temporary file (tens of MB on a full
    disk) beside the cache."""
    path = tmp_path / "prompt.cache"
    cache_file.save(path, _filled(backend, 20), BUNDLE_ID)

    def fail(fd):
        raise interruption

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(type(interruption)):
        cache_file.save(path, _filled(backend, 40), BUNDLE_ID)
    monkeypatch.undo()
    assert [entry.name for entry in tmp_path.iterdir()] == [path.name]
    assert cache_file.load(path, PromptCache(backend), BUNDLE_ID) == (20, None)


def test_a_symlinked_cache_file_is_written_where_the_link_points(tiny_bundle, tmp_path):
    """The write renamed its temporary file over the link itself: the link became a file of its own beside
    it, and the file it pointed to (on another disk, say) was never written."""
    (tmp_path / "data").mkdir()
    target, link = tmp_path / "data" / "prompt.cache", tmp_path / "prompt.cache"
    link.symlink_to(target)
    _run(tiny_bundle, "--prompt-cache", link)
    assert link.is_symlink()
    assert target.is_file()
    assert sorted(entry.name for entry in (tmp_path / "data").iterdir()) == ["prompt.cache"]
    assert "tokens loaded" in _run(tiny_bundle, "--prompt-cache", link).stderr


class _Terminal(io.BytesIO):
    """Lines typed at a terminal: ``run`` without --prompt holds a conversation."""

    def isatty(self) -> bool:
        return True


class _RemovingTerminal(_Terminal):
    """A terminal at which ``directory`` is removed once the session reads its first line: a cache directory
    that existed when the run started and is gone by the time the answer is written."""

    def __init__(self, text: bytes, directory) -> None:
        super().__init__(text)
        self.directory = directory

    def _remove(self, size) -> None:
        if size != 0 and self.directory.exists():  # click probes the stream with read(0) before the run
            shutil.rmtree(self.directory)

    def read(self, size=-1):
        self._remove(size)
        return super().read(size)

    def read1(self, size=-1):
        self._remove(size)
        return super().read1(size)


def test_a_cache_that_cannot_be_written_keeps_the_answer_in_the_conversation(tiny_bundle, tmp_path):
    """At a terminal a failed write is reported and the session goes on, but the write came before the
    answer was ended: its last bytes and newline were not written and the exchange was left out of the
    conversation, so the next line was answered as the first one."""
    from edgesdk.runtime.session import open_runtime
    from tests.unit.test_cli import invoke
    from tests.unit.test_cli_run_history import answer, turns

    path = tmp_path / "caches" / "prompt.cache"
    path.parent.mkdir()  # there when the run starts (a missing one is refused then), removed during the session
    result = invoke("run", tiny_bundle.path, "-n", 6, "--threads", 1, "--stats", "--prompt-cache", path,
                    input=_RemovingTerminal(b"hello there\nwhat next\n", path.parent))
    assert result.exit_code == 0, result.output
    assert result.stderr.count(f"error: cannot write the prompt cache {path} (No such file or directory)") == 2
    assert not path.parent.exists()
    runtime = open_runtime(tiny_bundle.path, threads=1)
    tokenizer = runtime.tokenizer
    first = answer(runtime, turns(("hello there", None)), 6)
    second = answer(runtime, turns(("hello there", first), ("what next", None)), 6)
    assert result.stdout == f"{first}\n{second}\n"
    whole = tokenizer.encode(tokenizer.render_chat(turns(("hello there", first), ("what next", None))),
                             add_special_tokens=False)
    stats = [line.removeprefix("> ") for line in result.stderr.splitlines() if "[ort-cpu] prompt" in line]
    assert stats[1].startswith(f"[ort-cpu] prompt {len(whole)} tok (")  # the first exchange, from the cache


@pytest.mark.parametrize(("change", "reason"), [
    ({"tokens": np.array(5)}, "its token ids are int64 of shape (), not a list of integer ids"),
    ("float", "its token ids are float32 of shape"),
    ("negative", "its token ids run from -"),
    ("beyond", "outside this bundle's vocabulary (0 to"),
    ("long", "tokens, more than this bundle's context of 256"),
    ("extra", "cache arrays, this backend's cache has"),
])
def test_token_ids_that_do_not_fit_are_named_for_what_is_wrong(tiny_bundle, tmp_path, change, reason):
    """Each of these was 'its token ids do not fit this bundle (a context of 256)', also for an extra cache
    array; ids below 0 or past the vocabulary (which no tokenizer made) were loaded as a cache."""
    path = tmp_path / "prompt.cache"
    _run(tiny_bundle, "--prompt-cache", path)
    with np.load(path) as data:
        arrays = {name: data[name] for name in data.files}
    tokens = arrays["tokens"]
    if change == "float":
        arrays["tokens"] = tokens.astype(np.float32)
    elif change == "negative":
        arrays["tokens"] = -tokens - 1
    elif change == "beyond":
        arrays["tokens"] = tokens + 100_000
    elif change == "long":
        arrays["tokens"] = np.resize(tokens, 300)
    elif change == "extra":
        arrays[f"cache_{len([name for name in arrays if name.startswith('cache_')])}"] = arrays["cache_0"]
    else:
        arrays.update(change)
    with open(path, "wb") as out:
        np.savez(out, **arrays)
    result = _run(tiny_bundle, "--prompt-cache", path)
    assert reason in result.stderr
    assert "tokens loaded" not in result.stderr
    assert "tokens loaded" in _run(tiny_bundle, "--prompt-cache", path).stderr
