"""``edgesdk build`` and ``edgesdk export``, the host's commands: compress a model into a bundle for a board, and
write a bundle as a GGUF file for llama.cpp (registered in :mod:`edgesdk.cli`).

Importing this module imports click only; torch, onnx and gguf load when a command runs.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import click

from edgesdk.errors import BuildError, EdgeSDKError

# What a build imports from the host extra (pyproject.toml's ``host``) whatever the model and recipe: a board's
# install (``pip install edgesdk``, the runtime) has none of them. Torch first, pinned as README's first command
# and .ci/run pin it, so the extra pulls no other build (on PyPI's Linux x86-64 index, the CUDA one).
BUILD_MODULES = ("torch", "transformers", "onnx")
HOST_EXTRA = ("torch", "transformers", "gguf", "accelerate", "onnx", "safetensors", "matplotlib", "triton")
TORCH_PIN = "torch==2.13.0"
HOST_INSTALL = f"pip install {TORCH_PIN} && pip install 'edgesdk[host]'"


def _importable(name: str) -> bool:
    """Whether module ``name`` can be imported here, without importing it (torch takes seconds)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # an import hook that refuses it, or a module left as None in sys.modules
        return False


def host_modules_error(command: str, missing: list[str]) -> EdgeSDKError:
    """The refusal of ``command`` (``'edgesdk build'``, ``build_bundle()``) where the host extra's ``missing``
    modules are not installed: a build runs on the host, and a board's install is the runtime alone."""
    names = " and ".join(filter(None, (", ".join(missing[:-1]), missing[-1])))
    return EdgeSDKError(
        f"{command} needs {names}, which this Python ({sys.executable}) does not have: building a bundle runs on "
        "the host, and a board's install (pip install edgesdk) is the runtime alone",
        f"on the host: {HOST_INSTALL} (the host extra: {', '.join(HOST_EXTRA)}), build there, then "
        "'edgesdk deploy BUNDLE --host user@board' ships the bundle to the board")


def _host_requirement(name: str) -> str:
    """The host extra's requirement for module ``name`` as this edgesdk's metadata pins it (``onnx>=1.16``;
    torch's :data:`TORCH_PIN`), for the install that mends a mismatched one; the name alone where the metadata is
    not there (a source checkout run without an install)."""
    if name == "torch":
        return TORCH_PIN
    import importlib.metadata
    import re

    try:
        requires = importlib.metadata.requires("edgesdk") or []
    except importlib.metadata.PackageNotFoundError:
        requires = []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if "host" in marker and re.match(rf"{re.escape(name)}\s*(?:[<>=!~;]|$)", spec.strip()):
            return spec.strip()
    return name


def host_module_mismatch(command: str, name: str, exc: ImportError) -> EdgeSDKError:
    """The refusal of ``command`` where host module ``name`` is installed but the build's import of it failed
    (``from onnx import X`` on a release without X, a submodule it lacks): another release than the host extra
    asks for, which is no missing module and was reported as one."""
    import importlib.metadata

    try:
        version = f"version {importlib.metadata.version(name)}"
    except importlib.metadata.PackageNotFoundError:
        version = "a version this Python cannot tell"
    requirement = _host_requirement(name)
    return EdgeSDKError(
        f"{command} needs {name}, and the {name} this Python ({sys.executable}) has ({version}) does not match "
        f"what the build imports: {exc}",
        f"install the release the host extra asks for: pip install --upgrade '{requirement}' (or {HOST_INSTALL})")


@contextmanager
def host_modules(command: str):
    """Refuse ``command`` up front, naming the missing modules, where the host extra's modules every build imports
    (:data:`BUILD_MODULES`) are not installed; and an import of the build's modules that fails on another host
    module: either was a ModuleNotFoundError traceback from deep in the exporter. Only a module that is not there
    is named missing; a host module that is there but fails the import (a name or submodule its release lacks) is
    named as installed and not matching, with its version and the install of the release the extra asks for."""
    missing = [name for name in BUILD_MODULES if not _importable(name)]
    if missing:
        raise host_modules_error(command, missing)
    try:
        yield
    except ImportError as exc:
        name = (exc.name or "").partition(".")[0]
        if name not in HOST_EXTRA:
            raise
        if isinstance(exc, ModuleNotFoundError) and not _importable(name):
            raise host_modules_error(command, [name]) from exc
        raise host_module_mismatch(command, name, exc) from exc


@click.command()
@click.option("--target", "-t", required=True, help="Board profile: name, alias (orin-nx, rpi5 …) or YAML path.")
@click.option("--model", "-m", default="smollm2-135m", show_default=True,
              help="Model alias, Hugging Face directory or .gguf file.")
@click.option("--out", "-o", type=click.Path(),  # text: an empty --out is refused, where Path("") is "."
              help="Bundle directory [bundles/<model>[+<adapter>...]-<target>].")
@click.option("--lora", "loras", multiple=True, metavar="ADAPTER",
              help="LoRA adapter merged into the model before any stage, scale 1 (repeatable): a PEFT adapter "
                   "directory or a GGUF LoRA adapter, as llama.cpp's --lora.")
@click.option("--lora-scaled", "scaled_loras", multiple=True, nargs=2, type=(str, float), metavar="ADAPTER SCALE",
              help="LoRA adapter merged with a user scale (repeatable), as llama.cpp's --lora-scaled.")
@click.option("--recipe", help="Recipe name or YAML path [the target's default_recipe].")
@click.option("--max-context", default=4096, show_default=True, help="Longest sequence the bundle accepts; 0: the model's own (its max_position_embeddings).")
@click.option("--resume", is_flag=True, help="Continue a killed build from its work directory (<out>.build).")
@click.option("--keep-work", is_flag=True, help="Keep the work directory (checkpoints) after success.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
@click.option("--data", "data_files", multiple=True, type=click.Path(path_type=Path),  # a directory: _data_files
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
def build(target, model, out, loras, scaled_loras, recipe, max_context, resume, keep_work, no_progress, data_files,
          data_skip_chars, generated_sequences, overrides, weight_bits, ffn_ratio, prune_layers, distill_steps, density):
    """Build a bundle for a board: load, compress (recipe stages), export ONNX, verify, package.

    A checkpoint is written after every stage; after a kill, run the same command with --resume. LoRA adapters
    (--lora, --lora-scaled) are merged into the weights as W + scale * alpha / r * B @ A, --lora ones first.
    """
    with host_modules("'edgesdk build'"):
        from edgesdk.build.pipeline import BuildConfig, shortcut_overrides
        from edgesdk.build.pipeline import build as run_build
        from edgesdk.compress.data import DataConfig
        from edgesdk.export.onnx_export import ExportConfig
        from edgesdk.models.lora import LoraAdapter

    out = _bundle_out(out)
    _data_files(data_files)
    if data_skip_chars and not data_files:
        click.echo(f"edgesdk build: warning: --data-skip-chars {data_skip_chars} is not used: it leaves out the head "
                   "of each --data file, and no --data is given", err=True)
    shortcuts = shortcut_overrides(target, recipe, {"--ffn-ratio": ffn_ratio, "--prune-layers": prune_layers,
                                                    "--distill-steps": distill_steps, "--density": density},
                                   tuple(overrides))
    data = DataConfig(files=tuple(str(f) for f in data_files), skip_chars=data_skip_chars,
                      generated_sequences=generated_sequences)
    try:
        adapters = tuple(LoraAdapter(str(path)) for path in loras) + \
            tuple(LoraAdapter(str(path), float(scale), option="--lora-scaled") for path, scale in scaled_loras)
        bundle = run_build(BuildConfig(target=target, model=model, adapters=adapters, out=out, recipe=recipe,
                                       overrides=shortcuts + tuple(overrides), data=data,
                                       weight_bits=int(weight_bits) if weight_bits else None,
                                       export=ExportConfig(max_context=max_context), resume=resume,
                                       keep_work=keep_work, progress=not no_progress))
    except KeyboardInterrupt:  # the pipeline has said what it kept; exit as a shell reports a SIGINT, not click's 1
        click.echo("edgesdk build: stopped (Ctrl-C)", err=True)
        sys.exit(130)
    where = shlex.quote(str(bundle.path))
    click.echo(f"edgesdk build: next: edgesdk run {where} --prompt Hello (tries it here); edgesdk deploy {where} "
               "--host user@board (installs it on the board over ssh)", err=True)
    click.echo(str(bundle.path))


def _bundle_out(out: str | None) -> Path | None:
    """--out as a path; an empty one (``--out "$OUT"`` with OUT unset) is refused: as a path it is the current
    directory, which the build filled with the bundle's files, or replaced whole where it was an earlier bundle."""
    if out is None:
        return None
    if out == "":
        raise BuildError("--out '' is empty, and an empty path is the current directory: the bundle would be "
                         "written over it", "pass --out the bundle's directory (--out . for the current directory), "
                         "or leave --out out for bundles/<model>-<target>")
    return Path(out)


def _data_files(data_files: tuple[Path, ...]) -> None:
    """A --data directory is refused in edgesdk's words, naming the files in it that --data takes one each (the
    rest of each file's checks, edgesdk/compress/data.py ``check_files``, run once the recipe is known to train)."""
    for path in data_files:
        if not os.path.isdir(path):  # False too where a parent cannot be searched: check_files names that later
            continue
        try:
            files, unlisted = sorted(child for child in path.iterdir() if child.is_file()), None
        except OSError as exc:
            files, unlisted = [], exc.strerror or str(exc)
        each = " ".join(f"--data {shlex.quote(str(child))}" for child in files[:3]) + (" ..." if len(files) > 3 else "")
        held = f"{path} cannot be listed: {unlisted}" if unlisted else f"{path} holds no files"
        raise BuildError(f"training text {path} is a directory; --data takes a plain-text file",
                         f"pass a plain-text file to --data, e.g. the directory's files, each with its own --data: {each}" if files else
                         f"pass a plain-text file to --data ({held})")


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--no-verify", is_flag=True, help="Skip reading the file back and comparing every tensor with the bundle.")
def export(bundle, output, no_verify):
    """Write BUNDLE as a GGUF file for llama.cpp and the tools built on it (OUTPUT: a .gguf file or a directory).

    The weights are the bundle's own, re-encoded without rounding again: INT4 blocks become Q4_0,
    INT8 blocks Q8_0, float weights F32 (so do quantized weights in blocks of 16, or of a width
    that is no multiple of 32, which ggml's 32-weight blocks cannot hold: exact, only larger).
    Needs the host extra (the gguf package) and an ort-fused bundle of a llama / mistral / smollm3 / qwen2 / qwen3 / gemma3 model (Phi-3 and Granite bundles are
    llama); layers pruned to different widths are written as llama.cpp's deci architecture (llama,
    mistral and qwen2 only: deci lacks qwen3's and gemma3's query / key norms and smollm3's layers
    without rotary; a qwen2 layer that lost query heads is refused, since llama.cpp sizes its query bias
    as the model width)."""
    try:
        import gguf  # noqa: F401
        import onnx  # noqa: F401
    except ImportError as exc:
        raise EdgeSDKError(f"'edgesdk export' reads the bundle's graph with onnx and writes with gguf ({exc})",
                           "pip install 'edgesdk[host]' (or: pip install onnx gguf)") from exc
    from edgesdk.export.gguf_export import (
        PER_LAYER_ARCHITECTURE,
        GGUFExportConfig,
        GGUFExportNote,
        export_gguf,
    )

    with warnings.catch_warnings():  # the export's notes are printed below, as the command's own lines
        warnings.simplefilter("ignore", GGUFExportNote)
        report = export_gguf(bundle, output, GGUFExportConfig(verify=not no_verify))
    notes = [f"llama.cpp tokenizes {note}" for note in report.notes] + report.file_notes + report.partial_notes
    for note in notes:
        shown = note.replace("\n", "\\n")  # one line each (a note may quote a template's "</s>\n")
        click.echo(f"edgesdk: note: {shown}", err=True)
    types = ", ".join(f"{count} {kind}" for kind, count in sorted(report.tensor_types.items()))
    checked = "not read back" if no_verify else f"{report.verified_tensors} tensors read back bit-exact"
    click.echo(f"{report.path}: {report.size_bytes / 1e6:.1f} MB, {report.architecture} {report.file_type} "
               f"({types}; {checked}) in {report.seconds:.1f} s")
    if report.architecture == PER_LAYER_ARCHITECTURE[0]:
        click.echo(f"pruned layers: written as llama.cpp's {report.architecture} architecture (head counts and FFN "
                   "widths per layer), which llama.cpp runs; transformers' GGUF loader does not")
    click.echo(f"run it with llama.cpp: llama-cli -m {shlex.quote(str(report.path))}")  # as build's "next:" line
