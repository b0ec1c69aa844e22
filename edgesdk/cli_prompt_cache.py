"""``edgesdk run --prompt-cache FILE`` (llama-cli's ``--prompt-cache``, with its ``--prompt-cache-all`` and
``--prompt-cache-ro``): the options checked and the file's directory checked before the bundle loads, the KV cache
loaded from it, and written back as llama-cli writes it (tools/main/main.cpp):

- ``--prompt-cache FILE``: the prompt's cache alone, where the file did not hold the whole prompt already
  (llama-cli's ``need_to_save_session``, ``n_matching_session_tokens < embd_inp.size()``). llama-cli writes it on
  the first sample, before the answer; here the prompt's cache is copied there (in memory, a few milliseconds) and
  written once the answer ends or Ctrl-C stops it, so the first token does not wait for the disk. Each prompt of a
  run that answers several (lines on stdin) is checked and written so.
- ``--prompt-cache-all``: the prompt and the answer, after each answer (llama-cli's "saving final output to
  session file"; the answer's last token is not in it, as it was never fed back), and after Ctrl-C what the
  answer had reached, once its prompt was prefilled: a Ctrl-C before that (a thermal wait before the prefill)
  leaves the file as it was, as llama-cli, which writes nothing before the first sample, leaves it (the cache then
  holds only the part of the prompt the file shared, and writing it would throw the rest of the file away).
  llama-cli refuses it in interactive mode ("not supported in interactive mode yet"); here a chat writes it after
  each answer.
- ``--prompt-cache-ro``: the file is loaded and never written (llama-cli's ``prompt_cache_ro``), so its directory
  need not be writable; a missing file is said on stderr and the prompt is prefilled whole, as llama-cli runs on
  (it logs "will create" but does not). With ``--prompt-cache-all`` it still writes nothing, as llama-cli.

- a FILE marked read-only (no write permission for anyone, ``chmod a-w``, or none for this user) is read as
  ``--prompt-cache-ro``, which is said on stderr: llama-cli's ``fopen(path, "wb")`` fails on it and leaves it as
  it was (llama_state_save_file logs "failed to open"), where the write here, a new file renamed over it (which
  needs only a writable directory), replaced it and kept its read-only mode.
- with the power gates steered by the controller (``--gating``) the FILE is not used and is left as it is, which
  is said on stderr: such a run reuses no cached prompt (edgesdk/runtime/prompt_cache.py), and the file it wrote
  was one no later run loads (edgesdk/runtime/cache_file.py), in place of the one a run with the gates off had
  left there.

The first prompt that shares less than half its tokens with the file loaded is said on stderr, as llama-cli warns
"session file has low similarity to prompt". The file itself is :mod:`edgesdk.runtime.cache_file`.

Importing this module imports click only; the runtime loads inside the functions that use it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import click

from edgesdk.errors import EdgeSDKError

_WRITABLE = os.W_OK | os.X_OK  # a file can be created in a directory this user may write to and search


def prompt_cache_mode(path: Path | None, cache_all: bool, read_only: bool) -> str | None:
    """How ``--prompt-cache FILE`` is written: ``prompt`` (the prompt's cache, llama-cli's default), ``all``
    (``--prompt-cache-all``: prompt and answer) or ``ro`` (``--prompt-cache-ro``: never); None without a FILE.
    ``--prompt-cache-all`` or ``--prompt-cache-ro`` without ``--prompt-cache`` is refused by name (llama-cli passes
    over them silently, and the run would keep no cache the user asked for)."""
    if path is None:
        for option, given in (("--prompt-cache-all", cache_all), ("--prompt-cache-ro", read_only)):
            if given:
                raise click.BadParameter(f"says how to use the prompt cache file, and no --prompt-cache FILE names "
                                         f"one; pass --prompt-cache FILE with {option}, or leave {option} out",
                                         param_hint=f"'{option}'")
        return None
    if not read_only and read_only_file(path):
        unused = " (--prompt-cache-all too)" if cache_all else ""
        what, fix = _why_read_only(path)
        click.echo(f"edgesdk: the prompt cache {path} {what}: it is loaded and not written{unused}, as with "
                   f"--prompt-cache-ro; {fix}", err=True)
        return "ro"
    if read_only:
        if cache_all:
            click.echo("edgesdk: --prompt-cache-all is not used: --prompt-cache-ro never writes the file (as in "
                       "llama-cli; leave --prompt-cache-ro out to write the prompt and answer)", err=True)
        return "ro"
    return "all" if cache_all else "prompt"


def read_only_file(path: Path) -> bool:
    """Whether the file at ``path`` is marked read-only: no write permission bit for anyone (``chmod a-w``: what its
    owner means, though root's access() and fopen("wb") pass over it) or none that this user has. Such a file is read as
    ``--prompt-cache-ro`` (:func:`prompt_cache_mode`). A symlink is its target, as the write goes there."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):  # missing, unreachable, or a name the OS cannot take: not a file kept read-only
        return False
    return stat.S_ISREG(mode) and (not mode & 0o222 or not os.access(path, os.W_OK))


def unwritable_cause(path: Path) -> tuple[str, str]:
    """Why this user may not write the file at ``path`` (:func:`read_only_file`): the cause, and what the file is
    for it. The causes: ``"read-only"`` (no write bit for anyone: chmod u+w), ``"read-only-fs"`` (a file system
    mounted read-only, a container's ``:ro`` volume, where chmod fails too), ``"owner-bit"`` (this user's own file
    without its owner's write bit: chmod u+w again) and ``"other-user"`` (write bits this user has none of: another
    user's file, which only its owner may chmod). The command line and the Python API give their own fixes."""
    info = os.stat(path)
    mode = stat.S_IMODE(info.st_mode)
    if not mode & 0o222:
        return "read-only", f"is read-only (mode {mode:04o})"
    if _read_only_fs(path):
        return "read-only-fs", f"is on a read-only file system (mode {mode:04o})"
    if hasattr(os, "geteuid") and info.st_uid == os.geteuid() and not mode & stat.S_IWUSR:
        return "owner-bit", f"is not writable by its owner, this user (mode {mode:04o})"
    return "other-user", f"is not writable by this user (mode {mode:04o}, owned by uid {info.st_uid})"


def _read_only_fs(path: Path) -> bool:
    """Whether ``path`` is on a file system mounted read-only (a container's ``:ro`` volume); False where it cannot
    be told (no statvfs: not POSIX)."""
    if not hasattr(os, "statvfs"):
        return False
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _why_read_only(path: Path) -> tuple[str, str]:
    """What the read-only cache file at ``path`` is (:func:`unwritable_cause`), and the command line's fix."""
    cause, what = unwritable_cause(path)
    fixes = {"read-only": "make it writable (chmod u+w) to have runs update it",
             "read-only-fs": "to have runs update it, pass a --prompt-cache path on a writable file system or remount "
                             "this one read-write",
             "owner-bit": "make it writable (chmod u+w) to have runs update it",
             "other-user": "to have runs update it, have its owner let this user write it, or pass a --prompt-cache "
                           "path of this user's"}
    return what, fixes[cause]


def writable_prompt_cache(path: Path | None, read_only: bool = False) -> Path | None:
    """``--prompt-cache FILE``, once it can be written: its directory exists and this user may write there (or FILE
    exists and this user may write it, where it is written in place: edgesdk/runtime/cache_file.py), and
    FILE, where it exists, is a cache file (:func:`edgesdk.runtime.cache_file.foreign`: never written over).
    Checked before the bundle loads; the first write comes only after the first answer, which a missing directory
    (or a FILE that is a directory) would waste; a FIFO or a device such as /dev/null is refused too, as the write
    would replace it with a file. ``read_only`` (``--prompt-cache-ro``), or a file marked read-only (:func:`read_only_file`):
    never written, so not checked."""
    if path is None or read_only or read_only_file(path):
        return path
    from edgesdk.runtime.cache_file import foreign, not_a_file

    long_name = _name_too_long(path)
    if long_name is not None:  # the write, a new file beside it renamed over it, would fail after the answer
        raise click.BadParameter(f"cannot write the prompt cache {path}: {long_name} (File name too long); pass a "
                                 "path with a shorter name", param_hint="'--prompt-cache'")
    kind = not_a_file(path)
    if kind is not None:  # the write would fail after the answer (a directory) or replace it (a FIFO, /dev/null)
        fix = f"pass the path of a file in it ({path / 'prompt.cache'})" if kind == "a directory" else \
            "pass the path of a regular file (or of a new one)"
        raise click.BadParameter(f"{path} is {kind}, not a prompt cache file; {fix}", param_hint="'--prompt-cache'")
    why = foreign(path)
    if why is not None:  # never written over: a mistyped path to a file the user keeps
        raise click.BadParameter(f"{path} is not a prompt cache file: {why}; it is left as it is. Pass the path of "
                                 "a cache file (or of a new one), or remove that file if it is yours to lose",
                                 param_hint="'--prompt-cache'")
    # The write renames a file in the directory of the file a symlink points to (edgesdk/runtime/cache_file.py).
    # os.path's tests, not Path's: a directory this user may not search is False, not a PermissionError.
    directory = Path(os.path.realpath(path)).parent if os.path.islink(path) else path.parent
    if os.path.isdir(directory) and os.access(directory, _WRITABLE):
        return path
    if os.path.isfile(path) and os.access(path, os.W_OK):  # written in place, as llama-cli writes it (cache_file.save)
        return path
    problem, fix = _why_not_writable(directory)
    raise click.BadParameter(f"cannot write the prompt cache {path}: {problem}; {fix}", param_hint="'--prompt-cache'")


def _name_too_long(path: Path) -> str | None:
    """Which name of ``path`` is too long for the file system to create (past its NAME_MAX), or whether the whole
    path is past its PATH_MAX: no file can be created there. Measured, not read from a lookup's error: below a
    missing directory the lookup fails ENOENT first, and the limits are those of the file system of the nearest
    directory that exists (eCryptfs takes 143 bytes a name), not Linux's usual 255. The write's temporary file
    (edgesdk/runtime/cache_file.py) has the file's name cut to NAME_MAX with its suffix added: its path counts too."""
    from edgesdk.runtime.cache_file import NAME_MAX, partial_name_size, path_limit

    above = path.parent  # the nearest directory above that exists: the new names would be made on its file system
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    name_max = path_limit(above, "PC_NAME_MAX", NAME_MAX)
    new_parts = () if os.path.lexists(path) else path.parts[len(above.parts):]
    for part in new_parts:
        size = len(os.fsencode(part))
        if size > name_max:
            return f"the name {part[:24]}... is {size} bytes, more than the {name_max} bytes a file name may have"
    size, path_max = len(os.fsencode(path)), path_limit(above, "PC_PATH_MAX", 4096)
    name_size = len(os.fsencode(path.name))
    partial = size - name_size + max(name_size, partial_name_size(path.name, above))
    if partial >= path_max:  # PATH_MAX counts the terminating NUL
        grown = f" with the {partial - size} bytes the write's temporary file adds" if partial > size else ""
        return (f"the path is {size} bytes{grown}, more than the {path_max - 1} bytes the system takes in one path "
                "(PATH_MAX)")
    return None


def _why_not_writable(directory: Path) -> tuple[str, str]:
    """Why no file can be written in ``directory``, and the fix: it is on a read-only file system, it is not
    writable, it is a file, it is missing (below a file, below a directory this user may not write to, or simply
    not made yet)."""
    if os.path.isdir(directory) and _read_only_fs(directory):  # chmod fails there too (EROFS)
        return (f"its directory {directory} is on a read-only file system",
                f"pass a path on a writable file system, or remount {directory} read-write")
    if os.path.isdir(directory):
        return (f"its directory {directory} is not writable by this user",
                f"pass a path in a directory this user may write to, or make {directory} writable")
    if os.path.exists(directory):
        return f"{directory} is not a directory", "pass a path in an existing directory"
    above = directory.parent  # the nearest directory above that exists
    while not os.path.exists(above) and above != above.parent:
        above = above.parent
    if not os.path.isdir(above):
        return f"its directory {directory} cannot exist: {above} is a file", "pass a path in an existing directory"
    if not os.access(above, _WRITABLE):
        return (f"its directory {directory} does not exist or cannot be reached, and {above} is not writable by "
                "this user", "pass a path in a directory this user may write to")
    return (f"its directory {directory} does not exist",
            f"create it first (mkdir -p {directory}) or pass a path in an existing directory")


def load_prompt_cache(path: Path | None, cache, runtime, stats: bool, mode: str = "prompt") -> PromptCacheFile | None:
    """``--prompt-cache FILE``: its KV cache loaded into ``cache`` where it fits; the file as the run writes it
    (``mode``: :func:`prompt_cache_mode`), or None where the backend keeps no host copy of its cache."""
    from edgesdk.runtime import cache_file
    from edgesdk.runtime.prompt_cache import steers_gates

    if path is None:
        return None
    if not cache_file.supported(runtime.backend):
        click.echo(f"edgesdk: --prompt-cache is not used: the {runtime.backend.name} backend keeps no copy of its KV "
                   "cache to write", err=True)
        return None
    if steers_gates(runtime.backend):  # no cached prompt is reused, and its own cache would be loaded by no run
        click.echo(f"edgesdk: the prompt cache {path} is not used, and is left as it is: the power gates decide the "
                   "keys and values, and this run computes with them steered by the controller (--gating, or "
                   "--entropy-target / --compute-budget), whose cache no run reuses; run without those options to "
                   "use the file", err=True)
        return None
    loaded, why = cache_file.load(path, cache, runtime.bundle.bundle_id)
    after = "the next answer rewrites it"
    if getattr(cache, "kept_file", None) is not None:  # past this run's -c only: kept for a run with a larger -c
        after = "it is left as it is for this run"
    elif mode == "ro":
        after = "it is read-only and left as it is" if read_only_file(path) else "--prompt-cache-ro leaves it as it is"
    if why is not None:
        click.echo(f"edgesdk: the prompt cache {path} is not loaded: {why}; {after}", err=True)
    elif loaded and stats:
        click.echo(f"edgesdk: prompt cache {path}: {loaded} tokens loaded", err=True)
    elif mode == "ro" and not os.path.exists(path):
        click.echo(f"edgesdk: the prompt cache {path} does not exist, and --prompt-cache-ro does not create it: each "
                   "prompt is prefilled whole (run once without --prompt-cache-ro to write it)", err=True)
    return PromptCacheFile(path, mode, cache, runtime, list(cache.tokens) if loaded else [])


class PromptCacheFile:
    """``--prompt-cache FILE`` as a run writes it, answer by answer (the module's docstring says when)."""

    def __init__(self, path: Path, mode: str, cache, runtime, held: list[int]):
        self.path, self.mode, self.cache, self.runtime = path, mode, cache, runtime
        self.held = held  # the token ids the file holds, as loaded or last written ([]: none, or a file refused)
        self._first = bool(held)  # the first prompt, which the file loaded is compared with
        self._prompt: list[int] = []
        self._write_prompt = False  # the prompt's cache is to be written (mode "prompt")
        self._snapshot: tuple[list[int], list] | None = None  # the prompt's cache, copied at the first token
        self._answered = False  # the answer's first token came: its prompt was prefilled

    def begin(self, prompt_ids: list[int]) -> None:
        """Before an answer to ``prompt_ids``: whether its cache is to be written (the file does not hold the whole
        prompt), and llama-cli's warning where the file loaded shares less than half of the first prompt."""
        from edgesdk.runtime.prompt_cache import common_prefix_length

        matching = common_prefix_length(self.held, prompt_ids)
        if self._first and matching < len(prompt_ids) // 2:
            click.echo(f"edgesdk: the prompt cache {self.path} has low similarity to the prompt ({matching} / "
                       f"{len(prompt_ids)} tokens); the rest is prefilled", err=True)
        self._first = False
        self._prompt, self._snapshot, self._answered = list(prompt_ids), None, False
        self._write_prompt = self.mode == "prompt" and matching < len(prompt_ids)

    def watch(self, on_token):
        """``on_token`` that first copies the prompt's cache, where it is to be written: the prompt is prefilled
        and its first token picked, where llama-cli writes the file. It also notes that the prompt was prefilled
        (what :meth:`interrupted` asks with ``--prompt-cache-all``).

        Where the reader of the answer went away (``edgesdk run ... | head -c 20``: showing the token fails with
        BrokenPipeError), the file is written as after Ctrl-C before the error goes on: llama-cli, which SIGPIPE
        ends there, had written the prompt's cache at the first token already."""
        if self.mode == "ro":
            return on_token

        def first_then(token: int) -> None:
            if not self._answered:
                self._answered = True
                if self._write_prompt:
                    self._snapshot = self._live_prompt()
            try:
                on_token(token)
            except BrokenPipeError:
                self.interrupted()
                raise

        return first_then

    def finished(self) -> None:
        """After the answer: the prompt's cache, or with ``--prompt-cache-all`` the prompt and answer, written; a
        write that fails is an EdgeSDKError naming the file."""
        if self.mode == "all":
            write, snapshot = self._answer_cache()
            if write:
                self._save(snapshot)
        elif self._write_prompt:
            snapshot = self._snapshot or self._live_prompt()
            if snapshot is not None:
                self._save(snapshot)

    def interrupted(self) -> None:
        """After Ctrl-C: the prompt's cache (copied at the first token, or the live one where the answer had none
        yet), or with ``--prompt-cache-all`` the KV cache as the answer left it (prompt and the tokens so far), so
        the next run does not prefill a long prompt again, as llama-cli's file holds it then. Skipped where the
        interrupt landed inside a step (the cache's length no longer matches its token list), or before the prompt
        was prefilled (the cache holds only what the file shared with it, and llama-cli has written nothing yet):
        the previous file then stays as it was. A failed write is a warning: the Ctrl-C is what the user is told
        about."""
        if self.mode == "ro" or (self.mode == "prompt" and not self._write_prompt):
            return
        tokens = self.cache.tokens
        # an empty cache matches its token list: the prompt shared nothing with the file and is not prefilled yet
        consistent = len(tokens) == self.runtime.backend.position
        if self.mode == "prompt":
            snapshot = self._snapshot or self._live_prompt()
            whole = snapshot is not None
        else:
            snapshot, whole = None, consistent and bool(tokens) and (self._answered or tokens == self._prompt)
        if not whole:
            why = "inside a step" if not consistent or self._answered else "before its prompt was prefilled"
            click.echo(f"edgesdk: the prompt cache {self.path} is not rewritten: the answer was stopped {why}",
                       err=True)
            return
        if self.mode == "all":
            write, snapshot = self._answer_cache()
            if not write:
                return
        try:
            self._save(snapshot)
        except EdgeSDKError as exc:
            click.echo(f"edgesdk: {exc}", err=True)

    def _answer_cache(self) -> tuple[bool, tuple[list[int], list] | None]:
        """With ``--prompt-cache-all``, what the file gets: (True, None), the KV cache as it is (prompt and answer);
        where a context shift during the answer (``--context-shift``) dropped part of the prompt from it, the part of
        the prompt it still begins with (``--keep``'s tokens), as a snapshot, where that is more of the prompt than
        the file holds; otherwise (False, None), the file left as it is. The cache after a shift begins with --keep's
        tokens and goes on with the answer's end: written whole, it replaced a file that held the whole prompt with
        one that shares only those with it, and the next run prefilled the prompt again; llama-cli stops writing its
        file at a context shift, keeping the prompt's cache it wrote at the first token."""
        from edgesdk.runtime.prompt_cache import common_prefix_length

        tokens = self.cache.tokens
        if tokens[: len(self._prompt)] == self._prompt:
            return True, None
        shared, held = common_prefix_length(tokens, self._prompt), common_prefix_length(self.held, self._prompt)
        why = "the context was shifted during the answer, so the KV cache no longer holds the whole prompt"
        if shared <= held == 0:  # nothing of the prompt is left in the cache, and the file held none of it either
            click.echo(f"edgesdk: the prompt cache {self.path} is not written: {why}, and none of the prompt's tokens "
                       "is left at its start (pass a --keep that covers the prompt, or leave --prompt-cache-all out)",
                       err=True)
            return False, None
        if shared <= held:
            click.echo(f"edgesdk: the prompt cache {self.path} is not rewritten: {why}; it keeps the {held} tokens of "
                       "the prompt it held (as llama-cli stops writing its file at a context shift)", err=True)
            return False, None
        click.echo(f"edgesdk: the prompt cache {self.path} is written with the first {shared} of the prompt's "
                   f"{len(self._prompt)} tokens, without the answer: {why} (leave --prompt-cache-all out to "
                   "have the prompt's cache written whole, or pass a --keep that covers the prompt)", err=True)
        state = self.runtime.backend.save_cache()[0]
        return True, (list(tokens[:shared]), [array[:, :, :shared] for array in state])

    def _live_prompt(self) -> tuple[list[int], list] | None:
        """A copy of the KV cache where it holds the prompt, and nothing more or less (None otherwise)."""
        tokens = self.cache.tokens
        if tokens != self._prompt or len(tokens) != self.runtime.backend.position:
            return None
        return list(tokens), self.runtime.backend.save_cache()[0]

    def _save(self, snapshot: tuple[list[int], list] | None) -> None:
        from edgesdk.runtime import cache_file

        try:
            cache_file.save(self.path, self.cache, self.runtime.bundle.bundle_id, snapshot)
        except OSError as exc:
            raise EdgeSDKError(f"cannot write the prompt cache {self.path} ({exc.strerror or exc})",
                               write_fix(exc, self.path)) from exc
        self.held = list(self.cache.tokens if snapshot is None else snapshot[0])


def write_fix(exc: OSError, path: Path, another: str = "a --prompt-cache path") -> str:
    """The fix for a prompt cache write to ``path`` that failed with ``exc``, by its cause: room on the disk where it
    is full (or the user's quota is), another file system where this one is read-only, the directory where it does
    not exist or this user may not write to it, a shorter name, a larger file size limit where the file passed it.
    ``another`` names what to pass instead, in the caller's terms (the command line's option, or the Python API's
    path)."""
    directory = Path(os.path.realpath(path)).parent  # where the write goes, a symlink's target's directory
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"free space on the disk that holds {directory} (df -h {directory}), or pass {another} on a disk "
                "with room for the KV cache")
    if exc.errno == errno.EROFS:
        return f"{directory} is on a read-only file system: pass {another} on a writable one"
    if exc.errno == errno.ENOENT:
        return f"create its directory first (mkdir -p {directory}), or pass {another} in an existing directory"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"pass {another} in a directory this user may write to, or make {directory} writable"
    if exc.errno == errno.ENAMETOOLONG:
        return f"pass {another} with a shorter name"
    if exc.errno == errno.EFBIG:  # past the process's file size limit, or the file system's largest file (FAT's 4 GiB)
        return (f"raise this shell's file size limit (ulimit -f unlimited), or pass {another} on a file system that "
                "takes a file of the KV cache's size")
    return f"pass {another} in an existing directory this user may write to"
