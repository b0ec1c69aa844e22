"""The ``edgesdk`` command line: a thin shell over the Python API.

Heavy imports (onnxruntime, torch, transformers) happen inside the commands that need them, so
``edgesdk --help`` and the board-side commands start fast and never touch torch.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import click

from edgesdk import __version__
from edgesdk.cli_options import _finite_or_null  # noqa: F401  (importable from here, as it always was)
from edgesdk.errors import EdgeSDKError


class _Group(click.Group):
    """Turns EdgeSDKError into a two-line message and a non-zero exit code, no traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EdgeSDKError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


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


HUGE_PAGE_COMMANDS = ("run", "eval", "serve", "bench")  # they stream a bundle's weights every token


def entry():
    """The console script. ``run``, ``eval``, ``serve`` and ``bench`` first re-execute themselves with
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


@main.group()
def targets():
    """Board profiles: list them or show one."""


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


@main.group()
def models():
    """Model aliases: list them or fetch one into the cache."""


@models.command("list")
def models_list():
    """Aliases usable with --model, and whether each is cached."""
    from edgesdk.models.sources import ALIASES, DEFAULT_MODEL, cached_alias_path

    for name, alias in ALIASES.items():
        cached = "cached" if cached_alias_path(name).is_file() else "not fetched"
        default = " [default]" if name == DEFAULT_MODEL else ""
        click.echo(f"{name:<15} {alias.description} ({alias.size / 1e6:.0f} MB, {cached}){default}")


@models.command("fetch")
@click.argument("name")
def models_fetch(name):
    """Download alias NAME into the cache ($EDGESDK_CACHE, default ~/.cache/edgesdk)."""
    from edgesdk.models.sources import fetch_alias

    click.echo(str(fetch_alias(name)))


# --- build ----------------------------------------------------------------------------------------


@main.command()
@click.option("--target", "-t", required=True, help="Board profile: name, alias (orin-nx, rpi5 …) or YAML path.")
@click.option("--model", "-m", default="smollm2-135m", show_default=True,
              help="Model alias, Hugging Face directory or .gguf file.")
@click.option("--out", "-o", type=click.Path(path_type=Path), help="Bundle directory [bundles/<model>-<target>].")
@click.option("--recipe", help="Recipe name or YAML path [the target's default_recipe].")
@click.option("--max-context", default=4096, show_default=True, help="Longest sequence the bundle accepts.")
@click.option("--resume", is_flag=True, help="Continue a killed build from its work directory (<out>.build).")
@click.option("--keep-work", is_flag=True, help="Keep the work directory (checkpoints) after success.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--data", "data_files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Plain-text file to train the compression stages on (repeatable).")
@click.option("--data-skip-chars", default=0, show_default=True, type=click.IntRange(min=0),
              help="Leave out the first N characters of each --data file (keep evaluation text unseen).")
@click.option("--generated-sequences", default=32, show_default=True, type=click.IntRange(min=0),
              help="Teacher-generated sequences added to the training text (data-free distillation).")
@click.option("--set", "overrides", multiple=True, metavar="STAGE.FIELD=VALUE",
              help="Change a recipe setting, e.g. --set prune.ffn_ratio=0.4 or --set export.weights=int4.")
@click.option("--weight-bits", type=click.Choice(["4", "8"]),
              help="The layers' weight bits: --set qat.weight_bits=N, and export.weights=intN where the recipe "
                   "stores quantized fused weights.")
@click.option("--ffn-ratio", type=float, help="Shortcut for --set prune.ffn_ratio=R.")
@click.option("--prune-layers", type=int,
              help="Shortcut for --set prune.layers_removed=N (whole decoder layers removed, least needed first).")
@click.option("--distill-steps", type=int, help="Shortcut for --set distill.steps=N.")
@click.option("--density", type=float, help="Shortcut for --set sparsify.density=D (fraction of weight blocks kept).")
def build(target, model, out, recipe, max_context, resume, keep_work, no_progress, data_files, data_skip_chars,
          generated_sequences, overrides, weight_bits, ffn_ratio, prune_layers, distill_steps, density):
    """Build a bundle for a board: load, compress (recipe stages), export ONNX, verify, package.

    A checkpoint is written after every stage; after a kill, run the same command with --resume.
    """
    from edgesdk.build.pipeline import BuildConfig, shortcut_overrides
    from edgesdk.build.pipeline import build as run_build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    if data_skip_chars and not data_files:
        click.echo(f"edgesdk build: warning: --data-skip-chars {data_skip_chars} is not used: it leaves out the head "
                   "of each --data file, and no --data is given", err=True)
    shortcuts = shortcut_overrides(target, recipe, {"--ffn-ratio": ffn_ratio, "--prune-layers": prune_layers,
                                                    "--distill-steps": distill_steps, "--density": density})
    data = DataConfig(files=tuple(str(f) for f in data_files), skip_chars=data_skip_chars,
                      generated_sequences=generated_sequences)
    try:
        bundle = run_build(BuildConfig(target=target, model=model, out=out, recipe=recipe,
                                       overrides=shortcuts + tuple(overrides), data=data,
                                       weight_bits=int(weight_bits) if weight_bits else None,
                                       export=ExportConfig(max_context=max_context), resume=resume,
                                       keep_work=keep_work, progress=not no_progress))
    except KeyboardInterrupt:  # the pipeline has said what it kept; exit as a shell reports a SIGINT, not click's 1
        click.echo("edgesdk build: stopped (Ctrl-C)", err=True)
        sys.exit(130)
    click.echo(str(bundle.path))


# --- bundles --------------------------------------------------------------------------------------


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--target", help="Refuse the bundle unless it was built for this board.")
def verify(bundle, target):
    """Check every file's sha256 and size, and the target; exit non-zero on any problem."""
    from edgesdk.bundle import verify_bundle
    from edgesdk.profile import get_profile

    checked = verify_bundle(bundle, get_profile(target).name if target else None)
    click.echo(f"ok: {checked.path} (bundle {checked.bundle_id}, target {checked.target}, "
               f"{len(checked.manifest['files'])} files verified)")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the whole manifest.")
def inspect(bundle, as_json):
    """Show what a bundle holds: model, target, stages, graph, files (manifest checked, files not)."""
    from edgesdk.bundle import read_manifest

    manifest = read_manifest(bundle)
    if as_json:
        click.echo(json.dumps(manifest, indent=2))
        return
    before, graph = manifest["model"]["before"], manifest["graph"]
    click.echo(f"bundle     {manifest['bundle_id']} (schema {manifest['schema_version']}, "
               f"edgesdk {manifest['edgesdk_version']}, {manifest.get('created', '?')})")
    click.echo(f"target     {manifest['target']['name']} ({manifest['target']['description']})")
    click.echo(f"model      {before['source']}: {before['architecture']}, {before['parameters']:,} parameters")
    stages = ", ".join(s["stage"] for s in manifest["stages"]) or "none"
    click.echo(f"recipe     {manifest['recipe']['name']} (stages: {stages})")
    kv = sorted(set(graph["kv_heads"]))
    kv_text = str(kv[0]) if len(kv) == 1 else f"{kv[0]}-{kv[-1]} by layer"
    click.echo(f"graph      {graph['form']} {graph['dtype']}, {graph['num_layers']} layers, "
               f"kv heads {kv_text}, max context {graph['max_context']}")
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
    for name, facts in sorted(manifest["files"].items()):
        click.echo(f"  {name:<24} {facts['size']:>14,}  {facts['sha256'][:16]}")


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("archive", type=click.Path(path_type=Path))
def pack(bundle, archive):
    """Verify BUNDLE and write it to a .tar ARCHIVE for transport (a directory: ARCHIVE/<bundle name>.tar).

    An ARCHIVE named .tar.gz / .tgz, .tar.bz2 or .tar.xz is compressed as its name says."""
    from edgesdk.bundle import pack_bundle

    click.echo(str(pack_bundle(bundle, archive)))


@main.command()
@click.argument("archive", type=click.Path(path_type=Path))
@click.argument("directory", type=click.Path(path_type=Path))
def unpack(archive, directory):
    """Unpack a bundle .tar into DIRECTORY (members escaping it are refused) and verify it.

    An earlier bundle of the same name in DIRECTORY is replaced; any other file or directory there is left alone
    and the command refuses."""
    from edgesdk.bundle import unpack_bundle

    click.echo(str(unpack_bundle(archive, directory).path))


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--no-verify", is_flag=True, help="Skip reading the file back and comparing every tensor with the bundle.")
def export(bundle, output, no_verify):
    """Write BUNDLE as a GGUF file for llama.cpp and the tools built on it (OUTPUT: a .gguf file or a directory).

    The weights are the bundle's own, re-encoded without rounding again: INT4 blocks become Q4_0,
    INT8 blocks Q8_0, float weights F32. Needs the host extra (the gguf package) and an ort-fused
    bundle of a llama / mistral / qwen2 / qwen3 model; layers pruned to different widths are written as
    llama.cpp's deci architecture (not for qwen3, whose query / key norms deci lacks)."""
    try:
        import gguf  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as exc:
        raise EdgeSDKError(f"'edgesdk export' reads the bundle's graph with onnx and writes with gguf ({exc})",
                           "pip install 'edgesdk[host]' (or: pip install onnx gguf)") from exc
    from edgesdk.export.gguf_export import PER_LAYER_ARCHITECTURE, GGUFExportConfig, export_gguf

    with warnings.catch_warnings():  # the tokenizer notes are printed below, as the command's own lines
        warnings.filterwarnings("ignore", message=".*: llama.cpp tokenizes ")
        report = export_gguf(bundle, output, GGUFExportConfig(verify=not no_verify))
    for note in report.notes:
        shown = note.replace("\n", "\\n")  # one line each (a note may quote a template's "</s>\n")
        click.echo(f"edgesdk: note: llama.cpp tokenizes {shown}", err=True)
    types = ", ".join(f"{count} {kind}" for kind, count in sorted(report.tensor_types.items()))
    checked = "not read back" if no_verify else f"{report.verified_tensors} tensors read back bit-exact"
    click.echo(f"{report.path}: {report.size_bytes / 1e6:.1f} MB, {report.architecture} {report.file_type} "
               f"({types}; {checked}) in {report.seconds:.1f} s")
    if report.architecture == PER_LAYER_ARCHITECTURE[0]:
        click.echo(f"pruned layers: written as llama.cpp's {report.architecture} architecture (head counts and FFN "
                   "widths per layer), which llama.cpp runs; transformers' GGUF loader does not")
    click.echo(f"run it with llama.cpp: llama-cli -m {report.path}")


# Command groups in their own modules (each imports its heavy parts inside its commands).
from edgesdk.cli_bench import bench  # noqa: E402
from edgesdk.cli_deploy import deploy  # noqa: E402
from edgesdk.cli_engine import engine  # noqa: E402
from edgesdk.cli_eval import eval_  # noqa: E402
from edgesdk.cli_run import run  # noqa: E402
from edgesdk.cli_serve import serve  # noqa: E402
from edgesdk.cli_thermal import thermal  # noqa: E402  (after main: it registers under it)

main.add_command(run)
main.add_command(serve)
main.add_command(bench)
main.add_command(eval_)
main.add_command(deploy)
main.add_command(engine)
main.add_command(thermal)

if __name__ == "__main__":  # python -m edgesdk.cli (deploy's smoke test and the run command it prints)
    entry()
