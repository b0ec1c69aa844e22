"""The ``edgesdk`` command line: a thin shell over the Python API.

Heavy imports (onnxruntime, torch, transformers) happen inside the commands that need them, so
``edgesdk --help`` and the board-side commands start fast and never touch torch.

This module holds the group, the console script and the small commands (env, targets, models, verify,
inspect, pack, unpack); the others live in ``edgesdk/cli_<name>.py`` (build and export, run, serve, eval,
embed, bench, deploy, engine, thermal) and are registered at the bottom. The options ``run`` and ``serve``
share are in :mod:`edgesdk.cli_options`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import sys
from pathlib import Path

import click

from edgesdk import __version__
from edgesdk.cli_options import echo_json
from edgesdk.cli_options import finite_or_null as _finite_or_null  # noqa: F401  (importable from here, as it always was)
from edgesdk.errors import EdgeSDKError

BROKEN_PIPE_EXIT = 128 + 13  # 141: what a shell reports for a tool that SIGPIPE ended (`yes | head`)


class _Group(click.Group):
    """Turns EdgeSDKError into a two-line message and a non-zero exit code, no traceback; Ctrl-C
    (KeyboardInterrupt) that a command leaves to it into exit 130, as a shell reports SIGINT and as llama.cpp's
    tools exit on it (tools/main/main.cpp ``sigint_handler``: ``_exit(130)``), not click's "Aborted!" and 1; and
    a reader that closed the output early (``edgesdk run ... | head -c 20``) into a quiet exit 141, as SIGPIPE
    ends a C tool, not click's silent 1, which reads as a failure of the command itself."""

    def make_context(self, *args, **kwargs):  # --help and --version write while the arguments are parsed
        with _quiet_on_broken_pipe():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        try:
            with _quiet_on_broken_pipe():
                return super().invoke(ctx)
        except EdgeSDKError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:  # the blank line closes the terminal's ^C echo, as click's own handler does
            click.echo(f"\nedgesdk {ctx.invoked_subcommand or ''}: stopped (Ctrl-C)".replace(" :", ":"), err=True)
            sys.exit(130)


@contextlib.contextmanager
def _quiet_on_broken_pipe():
    """Exit with :data:`BROKEN_PIPE_EXIT` and no message where the reader of the output went away.

    What was written before reached the reader. As the Python docs' "Note on SIGPIPE" advises, the standard output
    is pointed at /dev/null first, so that the interpreter's last flush of what is still buffered for the closed
    pipe prints no "Exception ignored ... BrokenPipeError" after the exit. SIGPIPE itself is left ignored: killed
    by it, a command would skip its ``finally`` blocks (a prompt cache or a log file half written)."""
    try:
        yield
    except BrokenPipeError:
        if not _output_reader_gone():  # another pipe (a FIFO, a child's stdin): an error of the command, told as one
            raise
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        sys.exit(BROKEN_PIPE_EXIT)


def _output_reader_gone() -> bool:
    """Whether the standard output or error is a pipe whose reader closed it: Linux's poll() reports POLLERR on the
    write end of such a pipe (and on a socket reset by its peer), never on a terminal, a file or an open pipe. Where
    poll() says nothing of it (other kernels), the exit is click's 1, as before."""
    poller = select.poll()
    for stream in (sys.stdout, sys.stderr):
        try:
            poller.register(stream.fileno(), select.POLLOUT)
        except (OSError, ValueError, AttributeError):  # no real descriptor (a test runner's capture)
            continue
    return any(events & select.POLLERR for _, events in poller.poll(0))


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="edgesdk")
def main():
    """Compress a small language model on a host and run it on a Jetson or Raspberry Pi.

    \b
    Typical use:
      edgesdk build --target rpi5                  # host: SmolLM2-135M -> bundles/smollm2-135m-rpi5
      edgesdk run bundles/smollm2-135m-rpi5 --prompt "Hello"
      edgesdk eval bundles/smollm2-135m-rpi5 --text wiki.valid.raw --reference

    Run 'edgesdk COMMAND --help' for the options of each command.
    """


HUGE_PAGE_COMMANDS = ("run", "eval", "serve", "bench", "embed")  # they stream a bundle's weights every token


def entry():
    """The console script. ``run``, ``eval``, ``serve``, ``bench`` and ``embed`` first re-execute themselves with
    glibc's huge-page tunable set, where the kernel and C library support it (edgesdk/runtime/huge_pages.py)."""
    if len(sys.argv) > 1 and sys.argv[1] in HUGE_PAGE_COMMANDS:
        from edgesdk.runtime.huge_pages import reexec_with_huge_pages

        reexec_with_huge_pages(sys.argv)
    main(prog_name="edgesdk")  # also when re-executed, where sys.argv[0] is "-c"


# --- environment, targets, models ------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def env(as_json):
    """Versions, ONNX Runtime providers, CUDA/TensorRT presence and the detected board (for bug reports)."""
    from edgesdk.envinfo import collect_env, format_env

    info = collect_env()
    click.echo(json.dumps(info, indent=2, default=str) if as_json else format_env(info))


@main.group(invoke_without_command=True)
@click.pass_context
def targets(ctx):
    """Board profiles: list them or show one (with no command, list them)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(targets_list)


@targets.command("list")
def targets_list():
    """One line per shipped board profile, with aliases."""
    from edgesdk.profile import shipped_profiles

    for name, profile in shipped_profiles().items():
        aliases = f" (alias {', '.join(profile.aliases)})" if profile.aliases else ""
        gpu = f"sm_{profile.gpu.sm}" if profile.gpu else "cpu only"
        click.echo(f"{name:<15} {profile.family:<6} {gpu:<8} {profile.runtime.backend:<9} "
                   f"{profile.description}{aliases}")


@targets.command("show")
@click.argument("name")
def targets_show(name):
    """Print one profile (NAME, alias or YAML path) as YAML."""
    import yaml

    from edgesdk.profile import get_profile

    click.echo(yaml.safe_dump(get_profile(name).summary(), sort_keys=False))


@main.group(invoke_without_command=True)
@click.pass_context
def models(ctx):
    """Model aliases: list them or fetch one into the cache (with no command, list them)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(models_list)


@models.command("list")
@click.option("--verify", is_flag=True, help="Also check each cached copy's sha256 (reads the whole file).")
def models_list(verify):
    """Aliases usable with --model, and whether each is cached. A cached copy of the wrong size is shown as damaged;
    its sha256 is checked with --verify (and whenever the alias is used, which fetches a damaged copy again)."""
    from edgesdk.models.sources import ALIASES, DEFAULT_MODEL

    for name, alias in ALIASES.items():
        default = " [default]" if name == DEFAULT_MODEL else ""
        click.echo(f"{name:<15} {alias.description} ({alias.size / 1e6:.0f} MB, "
                   f"{_cached_alias_state(name, verify)}){default}")


def _cached_alias_state(name: str, verify: bool) -> str:
    """'cached', 'not fetched', or what is wrong with the cached copy of alias ``name`` (the size and sha256
    edgesdk/models/sources.py pins): its size always, its sha256 only where ``verify``."""
    from edgesdk.models.sources import ALIASES, cached_alias_path, cached_copy_damage

    damage = cached_copy_damage(cached_alias_path(name), ALIASES[name], verify)
    if damage == "":
        return "not fetched"
    if damage is not None:
        return f"{damage}; run 'edgesdk models fetch {name}' to fetch it again"
    return "cached, sha256 checked" if verify else "cached"


@models.command("fetch")
@click.argument("name")
def models_fetch(name):
    """Download alias NAME into the cache ($EDGESDK_CACHE, default ~/.cache/edgesdk)."""
    from edgesdk.models.sources import fetch_alias

    click.echo(str(fetch_alias(name)))


# --- bundles --------------------------------------------------------------------------------------


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--target", help="Refuse the bundle unless it was built for this board.")
def verify(bundle, target):
    """Check every file's sha256 and size, and the target; exit non-zero on any problem.

    BUNDLE may be an archive from 'edgesdk pack', as deploy takes it: it is unpacked into a temporary directory
    (removed after) and verified there, so what verify accepts is what deploy accepts."""
    import contextlib

    from edgesdk.bundle import verify_bundle
    from edgesdk.deploy.session import unpack_if_archive
    from edgesdk.errors import BundleError
    from edgesdk.profile import get_profile

    expected = get_profile(target).name if target else None
    with contextlib.ExitStack() as stack:
        directory = unpack_if_archive(bundle, stack)  # an unreadable file, or one that is no archive: a BundleError
        try:
            checked = verify_bundle(directory, expected)
        except BundleError as exc:  # named as the archive's bundle: the temporary directory is gone once this is read
            if directory == bundle:
                raise
            named = f"{bundle} (unpacked)"
            raise BundleError(exc.problem.replace(str(directory), named),
                              exc.fix and exc.fix.replace(str(directory), named)) from exc
        where = bundle if directory != bundle else checked.path
        click.echo(f"ok: {where} (bundle {checked.bundle_id}, target {checked.target}, "
                   f"{len(checked.manifest['files'])} files verified)")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest.")
def inspect(bundle, as_json):
    """Show what a bundle holds: model, target, stages, graph, files (manifest checked, files not)."""
    from edgesdk.bundle import read_manifest

    manifest = read_manifest(bundle)
    if as_json:  # strict JSON: a diverged stage's inf perplexity is null
        echo_json(manifest)
        return
    # Verification requires the sections, not the facts described here (deploy and pack read none of them): what
    # a manifest lacks is shown as '?' and named on the 'lacks' line.
    lacking = []

    def known(section: dict, key: str, where: str):
        if section.get(key) is None:
            lacking.append(where)
            return "?"
        return section[key]

    before, graph = manifest["model"].get("before"), manifest["graph"]
    click.echo(f"bundle     {manifest['bundle_id']} (schema {manifest['schema_version']}, "
               f"edgesdk {manifest['edgesdk_version']}, {known(manifest, 'created', 'created')})")
    click.echo(f"target     {manifest['target']['name']} "
               f"({known(manifest['target'], 'description', 'target.description')})")
    if before is None:
        lacking.append("model.before")
        click.echo("model      ?")
    else:
        parameters = known(before, "parameters", "model.before.parameters")
        click.echo(f"model      {known(before, 'source', 'model.before.source')}: "
                   f"{known(before, 'architecture', 'model.before.architecture')}, "
                   f"{f'{parameters:,}' if isinstance(parameters, int) else parameters} parameters")
        for adapter in before.get("adapters") or []:  # merged into the source's weights before the stages
            click.echo(f"adapter    {_adapter_summary(adapter)}")
    stages = ", ".join(s["stage"] for s in manifest["stages"]) or "none"
    recipe = manifest.get("recipe")
    recipe = known(recipe, "name", "recipe.name") if isinstance(recipe, dict) else known(manifest, "recipe", "recipe")
    click.echo(f"recipe     {recipe} (stages: {stages})")
    kv = sorted(set(graph.get("kv_heads") or []))
    kv_text = (known(graph, "kv_heads", "graph.kv_heads") if not kv else str(kv[0]) if len(kv) == 1
               else f"{kv[0]}-{kv[-1]} by layer")
    click.echo(f"graph      {known(graph, 'form', 'graph.form')} {known(graph, 'dtype', 'graph.dtype')}, "
               f"{known(graph, 'num_layers', 'graph.num_layers')} layers, kv heads {kv_text}, "
               f"max context {known(graph, 'max_context', 'graph.max_context')}")
    if isinstance(graph.get("power"), dict):
        for line in _power_summary(graph["power"], manifest["stages"]):
            click.echo(line)
    click.echo(f"embeddings {_embeddings_summary(manifest)}")
    eos = manifest["tokenizer"].get("eos_token_ids") if isinstance(manifest["tokenizer"], dict) else None
    if isinstance(eos, list):  # the ids a run stops at, which the tokenizer's EOS token alone may not be
        token = manifest["tokenizer"].get("eos_token")
        click.echo(f"eos        ids {', '.join(map(str, eos)) or 'none'}"
                   + (f" (eos token {token!r})" if isinstance(token, str) else "")
                   + ": generation stops at any of them")
    else:
        lacking.append("tokenizer.eos_token_ids")
        click.echo("eos        ?")
    generation = manifest.get("generation")
    if generation:  # the model's own sampling settings, which run, serve and load() take for what is not given
        from edgesdk.models.generation_defaults import describe, source_words

        click.echo(f"sampling   {describe(generation['sampling'])} (from {source_words(generation['source'])}; "
                   "used where a run or request sets none)")
    chain = [manifest["runtime"]["backend"], *manifest["runtime"].get("fallbacks", [])]  # optional, as in a run
    click.echo(f"runtime    {' -> '.join(chain)}, "
               f"{manifest['runtime']['threads']} threads")
    total = sum(f["size"] for f in manifest["files"].values())
    click.echo(f"files      {len(manifest['files'])}, {total / 1e6:.1f} MB")
    packed = graph.get("weights")
    if packed:
        coded = manifest["files"][packed["file"]]["size"]
        click.echo(f"weights    {packed['file']}: {packed['codec']}, {coded / 1e6:.1f} MB on disk, "
                   f"{packed['bytes'] / 1e6:.1f} MB in memory")
    if lacking:
        click.echo(f"lacks      {', '.join(lacking)} (edited by hand or built by an older edgesdk; verify, deploy "
                   "and pack need none of them: rebuild the bundle with 'edgesdk build' to have them)")
    width = max([24, *map(len, manifest["files"])])  # the longest name (kernels/sm_87/...cubin) keeps its column
    for name, facts in sorted(manifest["files"].items()):
        click.echo(f"  {name:<{width}} {facts['size']:>14,}  {facts['sha256'][:16]}")


def _adapter_summary(record) -> str:
    """A merged LoRA adapter's record (the manifest's model.before.adapters): its path, kind, rank, alpha, scale and
    sha256 prefix, which tell which fine-tune the bundle holds, and the LM head its merge untied. A value a hand-edited
    record lacks is shown as '?'."""
    if not isinstance(record, dict):
        return "?"

    def shown(key: str, spec: str = "g") -> str:
        value = record.get(key)
        return "?" if isinstance(value, bool) or not isinstance(value, (int, float)) else format(value, spec)

    digest = record.get("sha256")
    untied = record.get("untied_parameters")
    return (f"{record.get('path', '?')} ({record.get('form', '?')}, rank {shown('rank')}"
            + (f", alpha {shown('alpha')}" if "alpha" in record else "")
            + f", scale {shown('scale')}, sha256 {digest[:12] if isinstance(digest, str) else '?'})"
            + (f"; untied the LM head from the embedding (+{untied:,} parameters)"
               if isinstance(untied, int) and not isinstance(untied, bool) and untied > 0 else ""))


def _power_summary(power: dict, stages: list[dict]) -> list[str]:
    """A power-gated bundle's gates (the manifest's graph.power): the controller's entropy target over its window,
    the threshold the gates were trained against, that gating is off unless a run asks for it, and the power stage's
    held-out perplexity gated against gating off where the stage recorded them."""
    def shown(key: str, spec: str = "g") -> str:
        value = power.get(key)
        return "?" if isinstance(value, bool) or not isinstance(value, (int, float)) else format(value, spec)

    lines = [f"power      FFN gates, off unless a run turns them on (run --gating); entropy target "
             f"{shown('entropy_target')} nats per window of {shown('window')} tokens, trained at tau "
             f"{shown('tau_init')}"]
    metrics = next((stage.get("metrics") or {} for stage in reversed(stages) if stage.get("stage") == "power"), {})
    heldout = metrics.get("heldout") if isinstance(metrics.get("heldout"), dict) else {}
    gated, off = heldout.get("at_tau_train"), heldout.get("gating_off")
    if isinstance(gated, dict) and isinstance(off, dict) and None not in (gated.get("perplexity"),
                                                                          off.get("perplexity")):
        run = gated.get("executed_fraction")
        share = f", {run:.1%} of FFN blocks run" if isinstance(run, (int, float)) else ""
        lines.append(f"           held-out perplexity {gated['perplexity']:.3f} gated (tau {gated.get('tau', '?')}"
                     f"{share}) vs {off['perplexity']:.3f} gating off (PyTorch, at build)")
    return lines


def _embeddings_summary(manifest: dict) -> str:
    """Whether and how the bundle embeds (``edgesdk embed``, serve's embedding routes): the graph's hidden-state
    output or the block-sparse weights, and the pooling used when none is asked for. A bundle that cannot embed
    says why (:func:`edgesdk.runtime.embedding.no_hidden_states_why`: the QDQ graph TensorRT builds from leaves the
    output out by design, so a current int8-qdq build is not told to build the same again) and names the recipes
    that embed."""
    from edgesdk.runtime.embedding import (
        DEFAULT_POOLING,
        EMBEDDING_RECIPES,
        hidden_states_source,
        no_hidden_states_why,
    )

    declared = (manifest["model"].get("before") or {}).get("pooling")
    pooling = f"{declared} pooling (the model's)" if declared else f"{DEFAULT_POOLING} pooling (the model declares none)"
    source = hidden_states_source(manifest)
    if source == "graph":
        return pooling
    if source == "sparse":
        return f"{pooling}, on the triton backend only (the QDQ graph has no hidden-state output)"
    return f"none: {no_hidden_states_why(manifest)}; rebuild with {EMBEDDING_RECIPES} to embed"


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("archive", type=click.Path(path_type=Path))
def pack(bundle, archive):
    """Verify BUNDLE and write it to a .tar ARCHIVE for transport (a directory: ARCHIVE/<bundle name>.tar).

    An ARCHIVE named .tar.gz / .tgz / .taz / .gz / .z, .tar.bz2 / .tbz2 / .tbz / .tz2 / .bz2 or .tar.xz / .txz / .xz
    is compressed as its name says (GNU tar's 'tar -a' names)."""
    from edgesdk.bundle import pack_bundle

    click.echo(str(pack_bundle(bundle, archive)))


@main.command()
@click.argument("archive", type=click.Path(exists=True, path_type=Path))  # a directory: unpack_bundle says what to do
@click.argument("directory", type=click.Path(path_type=Path))
def unpack(archive, directory):
    """Unpack a bundle .tar into DIRECTORY (members escaping it are refused) and verify it.

    An earlier bundle of the same name in DIRECTORY is replaced; any other file or directory there is left alone
    and the command refuses."""
    from edgesdk.bundle import unpack_bundle

    click.echo(str(unpack_bundle(archive, directory).path))


# Commands and command groups in their own modules (each imports its heavy parts inside its commands).
from edgesdk.cli_bench import bench  # noqa: E402
from edgesdk.cli_build import build, export  # noqa: E402
from edgesdk.cli_deploy import deploy  # noqa: E402
from edgesdk.cli_embed import embed  # noqa: E402
from edgesdk.cli_engine import engine  # noqa: E402
from edgesdk.cli_eval import eval_  # noqa: E402
from edgesdk.cli_run import run  # noqa: E402
from edgesdk.cli_serve import serve  # noqa: E402
from edgesdk.cli_thermal import thermal  # noqa: E402  (after main: it registers under it)

main.add_command(build)
main.add_command(export)
main.add_command(run)
main.add_command(serve)
main.add_command(bench)
main.add_command(eval_)
main.add_command(embed)
main.add_command(deploy)
main.add_command(engine)
main.add_command(thermal)

if __name__ == "__main__":  # python -m edgesdk.cli (deploy's smoke test and the run command it prints)
    entry()
