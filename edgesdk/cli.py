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
from edgesdk.cli_options import (
    _finite_or_null,
    _runtime_options,
)
from edgesdk.errors import EdgeSDKError, read_utf8


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


# --- run and eval ---------------------------------------------------------------------------------


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt-tokens", "-p", default=512, show_default=True, type=click.IntRange(min=0),
              help="Prompt length of the prompt-processing test (ppN); 0 skips it.")
@click.option("--new-tokens", "-n", default=128, show_default=True, type=click.IntRange(min=0),
              help="Decode steps of the generation test (tgN); 0 skips it.")
@click.option("--repetitions", "-r", default=5, show_default=True, type=click.IntRange(min=1),
              help="Timed runs of each test, after one untimed warm-up.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@_runtime_options
def bench(bundle, prompt_tokens, new_tokens, repetitions, as_json, threads, backend, target, ignore_target):
    """Prompt-processing (ppN) and generation (tgN) speed of a bundle here, as llama-bench reports them.

    Each test runs once untimed, then --repetitions times; the table gives mean ± standard
    deviation of tok/s. Run nothing else heavy meanwhile: other work on the cores moves the figures.
    """
    import os
    import platform

    from edgesdk.board import detect_board
    from edgesdk.bundle import read_manifest
    from edgesdk.envinfo import package_version
    from edgesdk.runtime.bench import BenchConfig, check_room, format_table, peak_rss_mib, run_bench
    from edgesdk.runtime.bench_conditions import snapshot, summary, warnings
    from edgesdk.runtime.huge_pages import huge_pages_state
    from edgesdk.runtime.session import open_runtime

    if prompt_tokens == 0 and new_tokens == 0:
        raise click.BadParameter("both tests are off; give at least one of them tokens", param_hint="-p/-n")
    config = BenchConfig(prompt_tokens=prompt_tokens, new_tokens=new_tokens, repetitions=repetitions)
    check_room(config, read_manifest(Path(bundle))["graph"]["max_context"])  # before the model loads
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target, verbose=not as_json)
    gating = getattr(runtime.backend, "gating", None)  # a power-gated bundle's FFN skipping (off unless asked)
    thermal = runtime.bundle.manifest["target"].get("thermal") or {}
    zones, throttle_c = thermal.get("zones") or (), thermal.get("firmware_throttle_c")
    before = snapshot(zones)
    results = run_bench(runtime, config)
    after = snapshot(zones)
    board = detect_board()
    found = warnings(before, after, board.cpu_count or os.cpu_count() or 1, throttle_c)
    huge_pages = huge_pages_state()
    if as_json:
        conditions = {"board": {"model": board.model, "family": board.family, "jetpack": board.jetpack,
                                "cpu_count": board.cpu_count},
                      "versions": {"edgesdk": __version__, "python": platform.python_version(),
                                   "onnxruntime": package_version("onnxruntime", "onnxruntime-gpu")},
                      "huge_pages": huge_pages, "before": before, "after": after, "warnings": found}
        body = {"bundle": str(bundle), "bundle_id": runtime.bundle.bundle_id, "backend": runtime.backend.name,
                "threads": runtime.threads, "power_gating": gating, "results": [result.to_json() for result in results],
                "peak_rss_mib": _rounded_mib(peak_rss_mib()), "conditions": conditions}
        click.echo(json.dumps(_finite_or_null(body), indent=2, allow_nan=False))
        return
    click.echo(format_table(results, runtime.backend.name, runtime.threads, Path(bundle).name, peak_rss_mib()))
    click.echo(summary(before, after))
    if gating is not None:
        click.echo(f"power gates: {'on' if gating else 'off: every FFN block runs (the gated graph at tau 0)'}")
    click.echo(_huge_pages_line(huge_pages))
    for warning in found:
        click.echo(f"warning: {warning}")


def _rounded_mib(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _huge_pages_line(state: dict) -> str:
    """Where the weights the tests streamed lay: on transparent huge pages or 4 KiB ones (runtime/huge_pages.py)."""
    used = state["anon_huge_pages_mib"]
    return (f"huge pages: {'unknown' if used is None else f'{used:g} MiB'} in use, THP "
            f"{state['transparent_huge_pages'] or 'unknown'}, glibc.malloc.hugetlb {state['glibc_hugetlb'] or 'unset'}")


def _plus_minus(value: float | None, uncertainty: float | None, spec: str) -> str:
    """``value ± uncertainty`` as llama-perplexity prints it; a figure with no defined value (one token) reads n/a."""
    if value is None:
        return "n/a"
    return format(value, spec) + ("" if uncertainty is None else f" ± {format(uncertainty, spec)}")


@main.command("eval")
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--text", "text_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Plain-text file to score (e.g. wikitext-2-raw/wiki.valid.raw).")
@click.option("--method", type=click.Choice(["windows", "llama-perplexity"]), default="windows", show_default=True,
              help="windows: non-overlapping --context windows (or --stride), every token but each window's first "
                   "scored. llama-perplexity: the figure llama.cpp's llama-perplexity -c CONTEXT prints: the text "
                   "(BOS in front where the tokenizer adds one) cut into whole chunks of --context tokens, the tail "
                   "dropped, each chunk's first token made BOS where the tokenizer adds one, only the second half "
                   "of each chunk scored; it needs 2 x --context tokens. llama-perplexity reads the whole file: "
                   "pass --max-chars 0 to score the same text.")
@click.option("--context", default=512, show_default=True, help="Tokens per window (per chunk: llama-perplexity's -c).")
@click.option("--stride", type=click.IntRange(min=1), help="Window step [--context: no overlap]; windows only.")
@click.option("--max-chars", default=200_000, show_default=True, type=click.IntRange(min=0),
              help="Score the first N characters (0 = all).")
@click.option("--reference", is_flag=True, help="Also score the PyTorch source model (host; needs edgesdk[host]).")
@click.option("--kl-divergence", "kl", is_flag=True,
              help="With --reference: KL divergence of the bundle's next-token distributions from the source "
                   "model's and llama-perplexity --kl-divergence's statistics (KLD mean with its uncertainty, "
                   "percentiles, PPL ratio, Δp, same top token; all of them with --json).")
@click.option("--last-word", is_flag=True,
              help="Also the last-word accuracy task: the last word of each 40-150-word paragraph ending in ' .' "
                   "(WikiText's form), scored as lm-evaluation-harness scores a loglikelihood task (with "
                   "--reference, the source model's too).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--budgets", default="1.0,0.8,0.6", show_default=True,
              help="Power-gated bundles: compute budgets (fraction of FFN blocks run) for the perplexity curve.")
@_runtime_options
def eval_(bundle, text_file, method, context, stride, max_chars, reference, kl, last_word, as_json, budgets, threads,
          backend, target, ignore_target):
    """Perplexity of the bundle through its runtime (and of the PyTorch source with --reference).

    --method llama-perplexity gives the figure of llama.cpp's llama-perplexity (its perplexity() in
    tools/perplexity/perplexity.cpp): the file read as its -f reads it (the bytes as they are, one trailing
    newline dropped) and tokenized once, BOS in front where the tokenizer adds one;
    len(tokens) // CONTEXT chunks, the tail dropped; each chunk's first token replaced by BOS where the
    tokenizer adds one; positions CONTEXT/2 .. CONTEXT-2 of each chunk predict the tokens after them
    (CONTEXT - CONTEXT/2 - 1 a chunk); exp of the mean negative log-likelihood over them all. Fewer than
    2 x CONTEXT tokens are refused, as llama-perplexity refuses them.
    """
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity, leading_bos, reference_perplexity
    from edgesdk.runtime.session import open_runtime

    if kl and not reference:
        raise click.BadParameter("compares the bundle with its source model, which --reference loads; add "
                                 "--reference", param_hint="--kl-divergence")
    if reference:
        # Host-only dependencies: check them before scoring the bundle, and say how to get them.
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:
            raise EdgeSDKError(
                f"--reference scores the PyTorch source model and needs torch and transformers ({exc})",
                "pip install 'edgesdk[host]' on the host, or drop --reference to score the bundle alone",
            ) from exc
    if method == "llama-perplexity" and stride is not None:
        raise click.BadParameter(f"--stride {stride} sets the step of --method windows; llama-perplexity cuts the "
                                 "text into chunks of --context tokens with no overlap: drop --stride, or use "
                                 "--method windows", param_hint="--stride")
    try:
        config = PerplexityConfig(context=context, stride=stride or context, max_chars=max_chars or None,
                                  method=method)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--context/--stride") from exc
    try:
        levels = tuple(float(b) for b in budgets.split(",") if b.strip())
    except ValueError as exc:
        raise click.BadParameter(f"must be comma-separated numbers, got {budgets!r}", param_hint="--budgets") from exc
    if not levels or any(not 0 < b <= 1 for b in levels):
        raise click.BadParameter(f"must lie in (0, 1], got {budgets!r}", param_hint="--budgets")
    text = read_utf8(text_file, "--text")
    if method == "llama-perplexity":
        text = _text_as_llama_perplexity_reads(text_file)
    if not text[: config.max_chars].strip():
        cut = config.max_chars is not None and len(text) > config.max_chars
        where = f"its first {config.max_chars:,} characters (--max-chars)" if cut else f"its {len(text):,} characters"
        raise EdgeSDKError(f"--text {text_file} has nothing to score: {where} are empty or whitespace",
                           "raise --max-chars (0 scores the whole file)" if cut else
                           "pass a plain-text file, e.g. wikitext-2-raw/wiki.valid.raw")
    documents = _last_word_documents(text, text_file, config.max_chars) if last_word else None
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target)
    if context > runtime.backend.max_context:
        limit = runtime.backend.max_context
        given = click.get_current_context().get_parameter_source("context") != click.core.ParameterSource.DEFAULT
        raise click.BadParameter(f"{context}{'' if given else ' (the default)'} is longer than the bundle's "
                                 f"max_context {limit}; pass --context {limit} or less", param_hint="--context")
    source = _reference_source(runtime, bundle) if reference else None  # before the scoring, which takes minutes
    gated = hasattr(runtime.backend, "configure")
    budgets_given = click.get_current_context().get_parameter_source("budgets") != click.core.ParameterSource.DEFAULT
    if budgets_given and not gated:
        raise EdgeSDKError(f"--budgets needs a bundle with power gates; {bundle} has none",
                           "drop --budgets, or build the bundle with a recipe holding the power stage (--recipe power)")
    if gated:  # the bundle scored with every FFN running; the gated points follow
        from edgesdk.evaluate import gated_perplexity

        power = gated_perplexity(runtime, text, config, levels, progress=True)
        result = {"bundle": power["gating_off"], "power": power}
    else:
        result = {"bundle": bundle_perplexity(runtime, text, config, progress=True).to_json()}
    result = {"method": method, **result}
    if reference:
        import torch

        from edgesdk.models.loader import load_model

        if threads:  # as the bundle ran; PyTorch would otherwise take every core
            torch.set_num_threads(threads)
        model = load_model(source).model
        encode = lambda t: runtime.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        result["reference"] = reference_perplexity(model, encode, text, config, progress=True,
                                                   bos_id=leading_bos(runtime.tokenizer)).to_json()
        ours, ref = result["bundle"]["perplexity"], result["reference"]["perplexity"]
        result["relative_difference"] = round(ours / ref - 1, 8)
        if kl:
            from edgesdk.evaluate import bundle_divergence

            result["divergence"] = bundle_divergence(runtime, model, text, config, progress=True).to_json()
    if last_word:
        from edgesdk.evaluate import bundle_scorer, last_word_accuracy, reference_scorer

        encode = lambda t: runtime.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        bos = leading_bos(runtime.tokenizer)
        result["last_word"] = last_word_accuracy(bundle_scorer(runtime), encode, documents, bos_id=bos).to_json()
        if reference:  # a paragraph longer than the bundle is cut for both, so both score the same tokens
            result["reference_last_word"] = last_word_accuracy(reference_scorer(model.eval()), encode, documents,
                                                               max_tokens=runtime.backend.max_context,
                                                               bos_id=bos).to_json()
    if as_json:  # strict JSON: a perplexity that overflowed (inf) or a broken bundle's NaN is null
        click.echo(json.dumps(_finite_or_null(result), indent=2, allow_nan=False))
        return
    spans = "windows" if method == "windows" else f"chunks of {context}, llama-perplexity's rule"
    click.echo(f"bundle perplexity    {result['bundle']['perplexity']:.4f} "
               f"({result['bundle']['tokens_scored']} tokens, {result['bundle']['windows']} {spans})")
    if method == "llama-perplexity" and config.max_chars is not None and len(text) > config.max_chars:
        click.echo(f"  scored the first {config.max_chars:,} of {len(text):,} characters; llama-perplexity reads "
                   "the whole file: pass --max-chars 0 for its figure")
    if reference:
        click.echo(f"reference (PyTorch)  {result['reference']['perplexity']:.4f}")
        click.echo(f"relative difference  {result['relative_difference'] * 100:+.3f} %")
    if kl:
        d = result["divergence"]
        click.echo(f"KL divergence        mean {d['mean_kld']:.5f}, median {d['median_kld']:.5f}, p99 {d['p99_kld']:.4f}, "
                   f"max {d['max_kld']:.3f} nats; same top token {d['same_top_token']:.2%} "
                   f"({d['tokens_scored']} tokens)")
        click.echo(f"                     mean KLD {_plus_minus(d['mean_kld'], d['mean_kld_uncertainty'], '.6f')} nats; "
                   f"PPL(Q)/PPL(base) {_plus_minus(d['ppl_ratio'], d['ppl_ratio_uncertainty'], '.6f')}, ln ratio "
                   f"{_plus_minus(d['ln_ppl_ratio'], d['ln_ppl_ratio_uncertainty'], '.6f')}; RMS Δp "
                   f"{_plus_minus(d['rms_dp'], d['rms_dp_uncertainty'], '.3%')}; same top token "
                   f"{_plus_minus(d['same_top_token'], d['same_top_token_uncertainty'], '.3%')} "
                   "(llama-perplexity --kl-divergence's statistics; all of them with --json)")
    for key, label in (("last_word", "last word (bundle)"), ("reference_last_word", "last word (PyTorch)")):
        if key in result:
            found = result[key]
            click.echo(f"{label:<21}accuracy {found['accuracy']:.2%}, word perplexity {found['word_perplexity']:.2f} "
                       f"({found['documents']} paragraphs)")
    if gated:
        chosen = result["power"]["chosen"]
        click.echo(f"gated, controller    {chosen['perplexity']:.4f} ({chosen['relative_to_off'] * 100:+.2f} % vs "
                   f"gating off; tau {chosen['tau']:.3f}, {chosen['executed_fraction']:.1%} of FFN blocks run)")
        for point in result["power"]["curve"]:
            click.echo(f"  budget {point['budget']:<5g} tau {point['tau']:.3f}  FFN blocks run "
                       f"{point['executed_fraction']:6.1%}  perplexity {point['perplexity']:.4f}")


def _text_as_llama_perplexity_reads(text_file: Path) -> str:
    """``eval --method llama-perplexity``: the text as ``llama-perplexity -f`` reads it (common/arg.cpp): the
    file's bytes unchanged (no newline translation: a CRLF file keeps its CR) with one trailing newline dropped.
    read_utf8 has already read the file once and named any byte that is not UTF-8."""
    text = text_file.read_bytes().decode("utf-8")
    return text[:-1] if text.endswith("\n") else text


def _last_word_documents(text: str, text_file: Path, max_chars: int | None) -> list[tuple[str, str]]:
    """``eval --last-word``: the paragraphs the task scores, found before any scoring, so that a text without
    them is refused at once rather than after the perplexity windows (minutes on a board) were scored."""
    from edgesdk.evaluate import LAST_WORD_MAX_WORDS, LAST_WORD_MIN_WORDS, last_word_documents

    documents = last_word_documents(text[:max_chars])
    if not documents:
        cut = max_chars is not None and len(text) > max_chars
        where = f"its first {max_chars:,} characters (--max-chars)" if cut else f"its {len(text):,} characters"
        raise EdgeSDKError(f"--last-word: --text {text_file} has no paragraph to score in {where}: the task takes "
                           f"paragraphs of {LAST_WORD_MIN_WORDS}-{LAST_WORD_MAX_WORDS} words ending in ' .', "
                           "as WikiText's",
                           ("raise --max-chars (0 scores the whole file), " if cut else "")
                           + "pass WikiText-2 (wiki.valid.raw) or text of that form, or drop --last-word")
    return documents


def _reference_source(runtime, bundle: Path):
    """The model the bundle was built from (its manifest's source), for --reference; an error naming
    --reference and the recorded source where it is not here (a bundle copied off its build host)."""
    from edgesdk.errors import ModelSourceError
    from edgesdk.models.sources import ALIASES, resolve_model

    recorded = runtime.bundle.manifest["model"]["before"]["source"]
    try:
        return resolve_model(recorded)
    except ModelSourceError as exc:
        fixes = [exc.fix] if recorded in ALIASES and exc.fix else \
            [f"run it where {recorded} is (the machine that built the bundle)"]
        raise ModelSourceError(
            f"--reference scores the model {bundle} was built from, {recorded} (as its manifest records), "
            f"and that model cannot be loaded here: {exc.problem}",
            "; or ".join([*fixes, "drop --reference to score the bundle alone"])) from exc


# Command groups in their own modules (each imports its heavy parts inside its commands).
from edgesdk.cli_deploy import deploy  # noqa: E402
from edgesdk.cli_engine import engine  # noqa: E402
from edgesdk.cli_run import run  # noqa: E402
from edgesdk.cli_serve import serve  # noqa: E402
from edgesdk.cli_thermal import thermal  # noqa: E402  (after main: it registers under it)

main.add_command(run)
main.add_command(serve)
main.add_command(deploy)
main.add_command(engine)
main.add_command(thermal)

if __name__ == "__main__":  # python -m edgesdk.cli (deploy's smoke test and the run command it prints)
    entry()
