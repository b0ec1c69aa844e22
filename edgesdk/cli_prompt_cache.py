"""``edgesdk run --prompt-cache FILE`` (llama-cli's ``--prompt-cache``): the file's directory checked before the
bundle loads, the KV cache loaded from it, and written back after each answer and after a Ctrl-C. The file itself
is :mod:`edgesdk.runtime.cache_file`.

Importing this module imports click only; the runtime loads inside the functions that use it.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from edgesdk.errors import EdgeSDKError

_WRITABLE = os.W_OK | os.X_OK  # a file can be created in a directory this user may write to and search


def writable_prompt_cache(path: Path | None) -> Path | None:
    """``--prompt-cache FILE``, once it can be written: its directory exists and this user may write there.
    Checked before the bundle loads; the first write comes only after the first answer, which a missing directory
    would waste."""
    if path is None:
        return None
    # The write renames a file in the directory of the file a symlink points to (edgesdk/runtime/cache_file.py).
    # os.path's tests, not Path's: a directory this user may not search is False, not a PermissionError.
    directory = Path(os.path.realpath(path)).parent if os.path.islink(path) else path.parent
    if os.path.isdir(directory) and os.access(directory, _WRITABLE):
        return path
    problem, fix = _why_not_writable(directory)
    raise click.BadParameter(f"cannot write the prompt cache {path}: {problem}; {fix}", param_hint="'--prompt-cache'")


def _why_not_writable(directory: Path) -> tuple[str, str]:
    """Why no file can be written in ``directory``, and the fix: it is not writable, it is a file, it is missing
    (below a file, below a directory this user may not write to, or simply not made yet)."""
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


def load_prompt_cache(path: Path | None, cache, runtime, stats: bool) -> Path | None:
    """``--prompt-cache FILE``: its KV cache loaded into ``cache`` where it fits; the path to write back, or
    None where the backend keeps no host copy of its cache."""
    from edgesdk.runtime import cache_file

    if path is None:
        return None
    if not cache_file.supported(runtime.backend):
        click.echo(f"edgesdk: --prompt-cache is not used: the {runtime.backend.name} backend keeps no copy of its KV "
                   "cache to write", err=True)
        return None
    loaded, why = cache_file.load(path, cache, runtime.bundle.bundle_id)
    if why is not None:
        click.echo(f"edgesdk: the prompt cache {path} is not loaded: {why}; the next answer rewrites it", err=True)
    elif loaded and stats:
        click.echo(f"edgesdk: prompt cache {path}: {loaded} tokens loaded", err=True)
    return path


def save_prompt_cache(path: Path, cache, runtime) -> None:
    """The KV cache written to ``path`` after an answer (prompt and answer, as llama-cli's
    ``--prompt-cache-all``); a write that fails is an EdgeSDKError naming the file."""
    from edgesdk.runtime import cache_file

    try:
        cache_file.save(path, cache, runtime.bundle.bundle_id)
    except OSError as exc:
        raise EdgeSDKError(f"cannot write the prompt cache {path} ({exc.strerror or exc})",
                           "pass a --prompt-cache path in a directory this user may write to") from exc


def save_interrupted_prompt_cache(path: Path, cache, runtime) -> None:
    """``--prompt-cache`` after Ctrl-C: the KV cache as the answer left it (prompt and the tokens so far), so the
    next run does not prefill a long prompt again. llama-cli writes its session file once the prompt is
    evaluated, before the first token, for the same reason. Skipped where the interrupt landed inside a step
    (the cache's length no longer matches its token list): the previous file then stays as it was."""
    if not cache.tokens or len(cache.tokens) != runtime.backend.position:
        click.echo(f"edgesdk: the prompt cache {path} is not rewritten: the answer was stopped inside a step",
                   err=True)
        return
    try:
        save_prompt_cache(path, cache, runtime)
    except EdgeSDKError as exc:  # the Ctrl-C is what the user is told about; the write's failure is a warning
        click.echo(f"edgesdk: {exc}", err=True)
