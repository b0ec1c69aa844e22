"""The KV cache kept in a file between runs: ``edgesdk run --prompt-cache FILE`` (llama-cli's ``--prompt-cache``).

A script that runs ``edgesdk run`` again and again with the same long system prompt (or the same
document to ask about) prefills that prompt each time; on a board a prompt token costs a few
milliseconds, so a 500-token prompt costs seconds before the first token. With a cache file the
run loads the KV cache the last run left and prefills only what follows the longest prefix the new
prompt shares with it (edgesdk/runtime/prompt_cache.py), then writes the cache back: the prompt's alone by
default, as llama-cli's ``--prompt-cache``, or the prompt and answer with ``--prompt-cache-all``
(edgesdk/cli_prompt_cache.py says when).

The file is NumPy's ``.npz`` (read with ``allow_pickle=False``): the token ids, the bundle id, the
edgesdk release and backend that wrote it, and one array per past tensor (B, Hkv, tokens, head_dim).
The power gates of a gated bundle are recorded too (off, a fixed threshold, or steered by the controller):
a gated FFN block that is skipped changes the keys and values of every later layer, so a cache computed with the
gates on is not what a run with them off computes (``edgesdk run --gating`` then ``edgesdk run``), and one computed
with them steered depends on the controller's path, which no later run retraces (such a run never reuses its cache,
edgesdk/runtime/prompt_cache.py). A file from another bundle, another edgesdk release or another backend (whose
keys and values may differ in layout or precision from what this one computes), with other gates, a damaged one,
or one whose arrays do not fit this backend's cache is not loaded (the reason is returned, and the next write
replaces it), as llama.cpp refuses a session file of another format version. A write goes to a temporary file
renamed over the old one, so a killed run leaves the previous cache whole; the temporary file a run killed by
SIGKILL leaves is removed by the next write. Where the disk has no room for that copy beside the old file but has
room for the cache in the old file's place, or no file can be renamed over the old one (a file bind-mounted into a
container, a writable file in a directory this user may not write to), the old file is written over, as llama-cli
writes its file; there, as
with llama-cli's, a run killed mid-write leaves an archive cut short (the next run names it and rewrites it), and
runs that write the same cache at once write into the one file (one inode) rather than each renaming a whole file
of its own: they take turns (an exclusive flock on the file, the second waiting for the first's write to end), and a
run that reads the file waits for such a write (a shared flock), so neither finds a file that mixes two caches or
one a living write has not finished; a run that has to wait says so on stderr first. A write the disk cuts short is
an error that leaves the file empty, never an archive that lacks its end. A path that is no regular file (a
directory, a FIFO, /dev/null) is neither read nor written (:func:`not_a_file`).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import secrets
import stat
import sys
import time
import zipfile
import zlib
from pathlib import Path

import numpy as np

from edgesdk import __version__
from edgesdk.bundle import capped_context, held_setting
from edgesdk.runtime.prompt_cache import PromptCache

try:
    import fcntl
except ImportError:  # not POSIX: no flock, and writes in place are not ordered
    fcntl = None

# 2: the edgesdk release and the backend that wrote the file are recorded and checked; 3: and the power gates
FORMAT = 3
NAME_MAX = 255  # bytes in a file name (Linux's ext4, xfs, btrfs, tmpfs)
ENTRY_OVERHEAD = 512  # bytes an .npz entry adds to its array's: the .npy header, the zip's local and central headers


def supported(backend) -> bool:
    """The backend keeps a host copy of its cache as NumPy arrays and can rewind it."""
    if not all(callable(getattr(backend, name, None)) for name in ("save_cache", "load_cache", "rewind")):
        return False
    return all(isinstance(array, np.ndarray) for array in _template(backend))


def gates(backend) -> str:
    """What a power-gated backend's gates do to the keys and values it computes: ``none`` (no gates), ``off``
    (every FFN block runs, the loaded model: the default), ``tau T`` (a fixed threshold) or ``steered`` (the
    controller's threshold, edgesdk/runtime/ort_gated_backend.py)."""
    if getattr(backend, "controller", None) is None or not hasattr(backend, "gating"):
        return "none"
    if not backend.gating:
        return "off"
    fixed = getattr(backend, "fixed_tau", None)
    return "steered" if fixed is None else f"tau {float(fixed)!r}"


def _template(backend) -> list:
    """The backend's empty cache (resetting it): the arrays' count, shapes beside the length, and dtype."""
    backend.reset()
    state, _ = backend.save_cache()
    return state


ZIP_START = b"PK\x03\x04"  # a zip archive's first local file header (APPNOTE.TXT 4.3.7): every .npz begins so
# What zipfile raises reading an entry whose headers are damaged: a bad signature, or a byte of the directory that
# marks the entry compressed by a method it lacks (NotImplementedError), encrypted (RuntimeError) or deflated
# (zlib.error): an .npz that np.savez writes is none of these.
ENTRY_DAMAGE = (zipfile.BadZipFile, NotImplementedError, RuntimeError, zlib.error)


def foreign(path: Path) -> str | None:
    """Why the file at ``path`` is not one a run may write over, or None: a non-empty file that no edgesdk run
    wrote, as it does not begin as a zip archive (an .npz) does, or is a whole zip archive without a cache file's
    ``format`` entry (a mistyped path to a text, a NumPy array, a user's archive). llama-cli refuses such a
    ``--prompt-cache`` file ("failed to load session file") and leaves it alone; a cache file of another bundle,
    release or format, or one cut short or damaged, is a cache file and is rewritten."""
    try:
        if not path.is_file() or path.stat().st_size == 0:
            return None
        with open(path, "rb") as handle:
            start = handle.read(len(ZIP_START))
    except OSError:
        return None  # unreadable: the write says why, if it fails
    if start != ZIP_START:
        return f"it does not begin as the .npz archive a cache file is (its first bytes are {start!r})"
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    # ENTRY_DAMAGE: a damaged byte of the directory (an entry's "version needed to extract" past what zipfile reads
    # raises NotImplementedError) makes a damaged cache file, as load() calls it, not an error of the run's
    except (*ENTRY_DAMAGE, OSError, ValueError, EOFError):
        return None  # an .npz cut short or damaged: a cache file that did not finish, rewritten
    if "format.npy" not in names:
        return "it is a zip archive without a cache file's entries (no format.npy)"
    return None


def not_a_file(path: Path) -> str | None:
    """What the path is where it exists and is no regular file (``a directory``, ``a FIFO``, ``a character device``
    such as /dev/null ...), following a symlink; None otherwise. Such a path is never read as a cache file (opening
    a FIFO waits for a writer for good) nor written: the write's rename would replace it (a FIFO, a device node as
    root) or fail after the answer (a directory), where llama-cli's fopen() reads from and writes into it."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((kind for test, kind in kinds if test(mode)), "not a regular file")


def load(path: Path, cache: PromptCache, bundle_id: str) -> tuple[int, str | None]:
    """Put the file's KV cache into ``cache``'s backend: (tokens loaded, why nothing was loaded or None).

    A file past a ``-c N`` run's context that the bundle's own context holds (a cache a run without the cap wrote)
    is not loaded, and is kept for the rest of the run: ``cache.kept_file`` names it, and :func:`save` leaves it as
    it is, as llama-cli refuses a session file bigger than its n_ctx and leaves it; rewritten with the shorter
    prompt's cache, it was lost to the run with the whole context that would have loaded it."""
    cache.kept_file = None
    try:
        if not path.exists():
            return 0, None
    except OSError as exc:  # pathlib raises where it cannot tell (a directory above not searchable, a name too long)
        return 0, f"it cannot be looked up ({exc.strerror or exc}); pass a path this user can reach"
    kind = not_a_file(path)
    if kind is not None:
        return 0, f"it is {kind}, not a cache file"
    template = _template(cache.backend)
    try:
        # read under a shared lock: a run writing the file in place (:func:`_write_in_place`) finishes first
        with open(path, "rb") as handle, _locked(handle.fileno(), shared=True, path=path):
            data = np.load(handle, allow_pickle=False)
            if not isinstance(data, np.lib.npyio.NpzFile):  # a .npy file: one array, not an archive
                return 0, f"it is one NumPy array ({data.dtype} {data.shape}), not the .npz archive a cache file is"
            with data:
                if int(data["format"]) != FORMAT:
                    return 0, f"it is format {int(data['format'])}, this edgesdk writes format {FORMAT}"
                if str(data["bundle_id"]) != bundle_id:
                    return 0, f"it was written with another bundle (id {str(data['bundle_id'])}, this one {bundle_id})"
                if str(data["edgesdk_version"]) != __version__:
                    return 0, f"it was written by edgesdk {str(data['edgesdk_version'])}, this is edgesdk {__version__}"
                backend = getattr(cache.backend, "name", None)
                if str(data["backend"]) != str(backend):
                    return 0, f"it was written by the {str(data['backend'])} backend, this run uses {backend}"
                written, now = str(data["gates"]), gates(cache.backend)
                if written == "steered":
                    return 0, ("its keys and values were computed with the power gates steered by the controller "
                               "(--gating), which depend on the path the controller took and are reused by no run")
                if written != now:
                    return 0, f"it was written with the power gates {written}, this run computes with them {now}"
                tokens = data["tokens"]
                held = _cache_arrays(data.files)
                if held != len(template):  # counted before they are read: a missing one is no damage to name
                    return 0, f"it holds {held} cache arrays, this backend's cache has {len(template)}"
                state = [data[f"cache_{index}"] for index in range(len(template))]
    # MemoryError: a damaged header that gives an array billions of entries
    except (OSError, KeyError, ValueError, TypeError, *ENTRY_DAMAGE, EOFError, MemoryError) as exc:
        told = f"({type(exc).__name__}: {exc})"
        damage = _damage(path, exc)  # said in place of numpy's and zipfile's words, which mislead there
        return 0, f"it cannot be read as a cache file{damage or ' ' + told}"
    context, vocabulary = cache.backend.max_context, getattr(cache.backend, "vocab_size", None)
    if tokens.dtype.kind not in "iu" or tokens.ndim != 1 or tokens.shape[0] < 1:
        return 0, f"its token ids are {tokens.dtype} of shape {tokens.shape}, not a list of integer ids"
    if tokens.shape[0] > context:
        built, source = getattr(cache.backend, "built_context", None), getattr(cache.backend, "context_source", "-c")
        capped = capped_context(context, built, source)
        if capped is not None and tokens.shape[0] <= built:
            cache.kept_file = os.path.realpath(path)
            return 0, (f"it holds {tokens.shape[0]} tokens, more than {capped}; raise {held_setting(source)[0]} to "
                       f"{tokens.shape[0]} to use it")
        return 0, f"it holds {tokens.shape[0]} tokens, more than this bundle's context of {context}"
    if tokens.min() < 0 or (vocabulary is not None and tokens.max() >= vocabulary):  # ids no tokenizer made
        known = f" (0 to {vocabulary - 1})" if vocabulary is not None else ""
        return 0, f"its token ids run from {tokens.min()} to {tokens.max()}, outside this bundle's vocabulary{known}"
    length = tokens.shape[0]
    for index, (saved, empty) in enumerate(zip(state, template, strict=True)):
        expected = (*empty.shape[:2], length, *empty.shape[3:])  # (B, Hkv, tokens, head_dim) for its token count
        if saved.dtype != empty.dtype or saved.shape != expected:
            return 0, (f"its arrays do not fit this backend's cache: cache_{index} is {saved.dtype} {saved.shape}, "
                       f"the cache of its {length} tokens {empty.dtype} {expected}")
    cache.backend.load_cache(state)
    cache.tokens = [int(token) for token in tokens]
    return length, None


def _cache_arrays(names: list[str]) -> int:
    """How many of an archive's entries are past tensors (``cache_0``, ``cache_1`` ...)."""
    return sum(1 for name in names if re.fullmatch(r"cache_\d+", name))


def _damage(path: Path, exc: BaseException) -> str:
    """What is wrong with a file numpy cannot read, where it can be told: an empty file, an .npz cut short (the
    zip archive's start without the directory at its end, which a copy or download that did not finish leaves, and
    which zipfile calls "not a zip file"), a whole archive damaged inside (its end is there, an entry's header is
    not: zipfile's "Bad magic number for file header", an entry its directory says is encrypted, an entry whose data
    run past the file's end, or bytes missing inside it, which move every offset before the file's start), one whose data
    fail their CRC-32 (damaged on disk or in a copy), or a file of another kind (numpy, finding neither of its own
    formats, says it "contains pickled (object) data" and suggests loading it unsafely). "" where nothing more can
    be told."""
    if isinstance(exc, zipfile.BadZipFile) and "CRC" in str(exc):
        return f": its data fail their checksum, damaged on disk or in a copy ({exc})"
    if not isinstance(exc, (*ENTRY_DAMAGE, EOFError, ValueError)) and not _misplaced(exc):
        return ""
    try:
        with open(path, "rb") as file:
            head = file.read(8)
    except OSError:
        return ""
    if not head:
        return ": it is empty"
    if head.startswith(b"PK\x03\x04"):
        if not isinstance(exc, (*ENTRY_DAMAGE, EOFError)) and not _misplaced(exc):
            return ""
        if zipfile.is_zipfile(path):  # its end is there: a whole file, damaged inside
            return f": it is damaged inside, on disk or in a copy ({str(exc) or type(exc).__name__})"
        return ": it is cut short (the archive's end is missing, as a copy or download that did not finish leaves)"
    if not head.startswith(b"\x93NUMPY"):
        return f": it is not a NumPy .npz archive (it starts with {head!r}, an .npz with b'PK\\x03\\x04')"
    return ""


def _misplaced(exc: BaseException) -> bool:
    """Whether ``exc`` is zipfile's seek before the file's start (EINVAL): the offsets its directory gives, moved by
    the bytes the archive lacks, point before it, as where bytes are missing inside a whole archive (a copy that
    dropped a block), which numpy passes on as "[Errno 22] Invalid argument"."""
    return isinstance(exc, OSError) and exc.errno == errno.EINVAL


def _mode_of(path: Path) -> int | None:
    """The permission bits of the file at ``path``; None where there is none (or it cannot be read)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None


def path_limit(directory: Path, name: str, fallback: int) -> int:
    """os.pathconf's ``name`` (``PC_NAME_MAX``, ``PC_PATH_MAX``) for ``directory``, or ``fallback`` where the system
    does not say: a file system's own limits (eCryptfs takes 143 bytes a name), not Linux's usual 255."""
    try:
        limit = os.pathconf(directory, name)
    except (OSError, ValueError):
        return fallback
    return limit if limit > 0 else fallback


def _cut(name: str, suffix: str, directory: Path) -> str:
    """``name`` cut to leave room for ``suffix`` within the NAME_MAX bytes of ``directory``'s file system: the start
    of a temporary file's name."""
    return os.fsdecode(os.fsencode(name)[: partial_name_size(name, directory, len(suffix)) - len(suffix)])


PARTIAL = re.compile(r"(.*)(\.(\d+)-[0-9a-f]{8}\.partial)", re.DOTALL)  # a write's temporary file: FILE.PID-HEX.partial
PARTIAL_SUFFIX_MAX = len(".4194304-00000000.partial")  # the longest suffix PARTIAL has: Linux's largest PID, 2**22
STALE_AFTER_S = 60.0  # a temporary file left alone this long by a process that is gone is a killed write's


def partial_name_size(name: str, directory: Path, suffix_size: int = PARTIAL_SUFFIX_MAX) -> int:
    """How many bytes the name of a write's temporary file of the file ``name`` in ``directory`` has, its suffix
    ``suffix_size`` bytes (the longest PARTIAL has by default): ``name`` cut to leave room for the suffix within the
    NAME_MAX bytes of ``directory``'s file system (:func:`_cut`), with the suffix added."""
    return min(len(os.fsencode(name)) + suffix_size, path_limit(directory, "PC_NAME_MAX", NAME_MAX))


def _remove_stale_partials(path: Path) -> None:
    """Remove the temporary files that writes of ``path`` killed by a signal Python cannot catch left beside it
    (SIGKILL: the OOM killer, systemd's stop timeout, ``timeout -s KILL``): a write removes its own file when it
    fails or is interrupted, but a killed one left a copy of the whole cache (tens of MB) there for good, one more
    at each such kill, filling a board's SD card. llama-cli writes its ``--prompt-cache`` file in place, leaving
    nothing beside it. A file is removed only where the process that wrote it is gone (its PID is not running) and
    it was not written to for STALE_AFTER_S seconds (a writer in another PID namespace sharing the directory is
    still writing to its file); one that cannot be removed is left."""
    if os.name != "posix":  # os.kill(pid, 0) asks whether a process runs on POSIX only (0 is CTRL_C_EVENT on Windows)
        return
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    now = time.time()
    for name in names:
        match = PARTIAL.fullmatch(name)
        if match is None or match.group(1) != _cut(path.name, match.group(2), path.parent):
            continue
        pid = int(match.group(3))
        if pid == os.getpid() or _running(pid):
            continue
        stale = path.with_name(name)
        try:
            if now - os.lstat(stale).st_mtime >= STALE_AFTER_S:
                stale.unlink()
        except OSError:
            pass


def _running(pid: int) -> bool:
    """Whether a process with ``pid`` runs (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # another user's (PermissionError), or a number no PID is: left alone
    return True


def save(path: Path, cache: PromptCache, bundle_id: str, snapshot: tuple[list[int], list] | None = None) -> None:
    """Write the backend's KV cache and ``cache.tokens`` to ``path`` (atomically; through a symlink, the
    file it points to). ``snapshot``: (token ids, ``backend.save_cache()`` state) taken earlier, written in their
    place (the prompt's cache, taken before the answer's tokens were added to it). The file :func:`load` kept
    (``cache.kept_file``: one past this run's ``-c`` context that the bundle's context holds) is left as it is."""
    path = Path(os.path.realpath(path))  # a rename over the link itself would turn it into a file
    if getattr(cache, "kept_file", None) == str(path):
        return
    kind = not_a_file(path)
    if kind is not None:  # never renamed over: /dev/null, a FIFO or a directory is not the file the cache goes to
        raise OSError(errno.EISDIR if kind == "a directory" else errno.EINVAL,
                      f"it is {kind}, not a file a cache can be written to", str(path))
    tokens, state = (cache.tokens, cache.backend.save_cache()[0]) if snapshot is None else snapshot
    entries = {"format": np.array(FORMAT), "bundle_id": np.array(bundle_id),
               "edgesdk_version": np.array(__version__),
               "backend": np.array(str(getattr(cache.backend, "name", None))), "gates": np.array(gates(cache.backend)),
               "tokens": np.asarray(tokens, np.int64)}
    entries.update({f"cache_{index}": array for index, array in enumerate(state)})
    # A temporary file of this write's own: runs that write the same cache at once each rename a whole file
    # (the last one stays) rather than truncating and renaming each other's (written in place on a disk without
    # room for the copy, they share the file's inode: _write_in_place). Its name is the file's cut to leave
    # room for the suffix within its file system's NAME_MAX: a valid name of 230 bytes and more failed "File name too long" after the
    # answer, where llama-cli writes its --prompt-cache file in place.
    suffix = f".{os.getpid()}-{secrets.token_hex(4)}.partial"
    partial = path.with_name(_cut(path.name, suffix, path.parent) + suffix)
    _remove_stale_partials(path)
    mode = _mode_of(path)
    try:
        _write_beside(path, partial, mode, entries)
    except OSError as exc:
        if not _in_place_instead(exc, path, entries):
            raise
        try:
            _write_in_place(path, entries)
        except FileNotFoundError:  # removed meanwhile: there is no old file's place to write in, and no room beside
            raise exc from None


def _in_place_instead(exc: OSError, path: Path, entries: dict) -> bool:
    """Whether the cache is written over the old file at ``path`` (:func:`_write_in_place`) where the copy beside it
    renamed over it failed with ``exc``, as llama-cli's fopen("wb") writes its file where a rename cannot: the disk
    has no room for the copy but has it in the old file's place (:func:`_fits_in_place`); the file is a mount point
    (EBUSY: a file bind-mounted into a container, ``docker run -v $PWD/prompt.cache:/app/prompt.cache``, over which
    no file can be renamed); or this user may write the file and not its directory (EACCES: a shared cache file in
    a directory of root's; EPERM: another user's file in a sticky directory such as /tmp)."""
    if exc.errno == errno.ENOSPC:
        return _fits_in_place(path, entries)
    if exc.errno == errno.EBUSY:
        return True
    return exc.errno in (errno.EACCES, errno.EPERM) and os.path.isfile(path) and os.access(path, os.W_OK)


def _write_beside(path: Path, partial: Path, mode: int | None, entries: dict) -> None:
    """Write ``entries`` to the temporary file ``partial`` and rename it over ``path``."""
    # A file that exists keeps its permissions, as llama-cli's fopen("wb") over it keeps them: a cache made
    # private (chmod 600; its token ids are the prompt's text) came back world-readable (0644 under umask 022).
    # Created private, given the old file's mode before the rename; a new file as open() creates one.
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(descriptor, "wb") as out:
            if mode is not None:
                os.fchmod(out.fileno(), mode)
            np.savez(out, **entries)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, path)
    except BaseException:  # a full disk, Ctrl-C: the previous cache stays, and no half-written copy beside it
        partial.unlink(missing_ok=True)
        raise


def _fits_in_place(path: Path, entries: dict) -> bool:
    """Whether the disk lacks room for ``entries`` beside the old cache at ``path`` but has it in the old file's
    place (its blocks freed): the cache is then written over it (:func:`_write_in_place`). False where there is no
    old file, where the disk shows room for the copy (the write failed for another cause), or where even the old
    file's blocks would not do: the old cache then stays whole."""
    try:
        old = os.stat(path)
        disk = os.statvfs(path.parent)
    except (OSError, AttributeError):  # no old file; no statvfs (not POSIX)
        return False
    needed = sum(array.nbytes for array in entries.values()) + ENTRY_OVERHEAD * len(entries)
    # the disk allocates the file whole blocks (and one for its block map at worst), so the old file's place must
    # hold those: an in-place write that ran out of room after truncating would lose the old cache
    room_in_place = (-(-needed // disk.f_frsize) + 1) * disk.f_frsize
    free = disk.f_bavail * disk.f_frsize
    return free < room_in_place <= free + old.st_blocks * 512


def _write_in_place(path: Path, entries: dict) -> None:
    """Write ``entries`` over the old cache file itself, truncated first, as llama-cli's fopen("wb") writes its
    ``--prompt-cache`` file: on a disk without room for a second copy of the cache (a board's nearly full SD
    card), the copy beside it failed "No space left on device" after every answer where llama-cli's write fits.
    The file keeps its inode, mode and owner. A write that fails there too (an error, a write the disk cuts short,
    an interruption Python catches) leaves the file empty; a run killed by SIGKILL mid-write leaves an archive cut
    short. Either is a cache file the next run names and rewrites; the old cache is gone. Runs writing the same
    cache at once share the inode here (no file of their own to rename), so the file is truncated only under an
    exclusive flock: a second run waits for the first's write to end, then writes its own cache whole (truncated
    under the first, the file would take the rest of the first's cache inside the second's: a file of both, which
    no run loads). A run reading the file holds a shared flock (:func:`load`): a write waits for it, it for a write."""
    with _WholeWrites(_open_locked(path), "wb") as out:
        try:
            os.ftruncate(out.fileno(), 0)
            np.savez(out, **entries)
            os.fsync(out.fileno())
        except BaseException:
            os.ftruncate(out.fileno(), 0)
            raise


def _open_locked(path: Path) -> int:
    """A descriptor of the file at ``path`` open for writing (not truncated), under an exclusive flock: waits for
    another run's write in place or read to end. Where a run with room beside the file renamed a whole cache over
    it meanwhile, the renamed file is the one opened (the one taken first is no longer the cache's)."""
    while True:
        descriptor = os.open(path, os.O_WRONLY)
        try:
            _lock(descriptor, shared=False, path=path)
            held, there = os.fstat(descriptor), os.stat(path)
        except BaseException:
            os.close(descriptor)
            raise
        if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
            return descriptor
        os.close(descriptor)


def _lock(descriptor: int, shared: bool, path: Path | None = None) -> None:
    """flock ``descriptor`` (shared or exclusive), waiting for a holder of the other kind; released when it is
    closed. Nothing where the system has no flock (not POSIX) or the file system refuses it (ENOLCK, EOPNOTSUPP on
    some network file systems): the file is then read and written unlocked. The lock is asked for without waiting
    first: where another run holds it, the wait is said on stderr before it begins (:func:`_waiting_note`), as a
    writer stopped with Ctrl-Z or a hung disk keeps it for good, and a run that waited silently looked hung."""
    if fcntl is None:
        return
    operation = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    try:
        try:
            fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            if path is not None:
                print(f"edgesdk: {_waiting_note(path, shared)}", file=sys.stderr, flush=True)
            fcntl.flock(descriptor, operation)
    except OSError as exc:
        if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise


def _waiting_note(path: Path, shared: bool) -> str:
    """What a run says as it waits for the lock on the cache file at ``path``: a read (``shared``) waits for a
    write in place, a write for a read or another write."""
    doing, then = ("writing", "to read it") if shared else ("reading or writing", "before writing it")
    return (f"another run is {doing} the prompt cache {path}; waiting for it to finish {then} (a run stopped with "
            "Ctrl-Z holds it until it is resumed)")


@contextlib.contextmanager
def _locked(descriptor: int, shared: bool, path: Path | None = None):
    """:func:`_lock` for the ``with`` block, released after it."""
    _lock(descriptor, shared, path)
    try:
        yield
    finally:
        if fcntl is not None:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_UN)
            except OSError:
                pass


class _WholeWrites(io.FileIO):
    """An unbuffered file (nothing left to flush after a failure) whose ``write`` writes all it is given or raises.
    write(2) on a disk that fills mid-write, or past RLIMIT_FSIZE, writes part and returns how much; FileIO passes
    that count on, and zipfile, which numpy's savez writes through, ignores it: the bytes left over would be dropped
    without a word (at the archive's last write, an archive cut short that the run calls written). The rest is
    written again here, which gets the disk's error (ENOSPC, EFBIG)."""

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            written = super().write(view[done:])
            if not written:  # 0 bytes of a non-empty write: no room, without an error to say so
                raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: wrote {done} of {len(view)} bytes",
                              self.name)
            done += written
        return done
