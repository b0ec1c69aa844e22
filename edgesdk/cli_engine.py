"""``edgesdk engine``: build the TensorRT engine of a bundle on the board that will run it.

Registered on the main CLI by one line at the bottom of ``edgesdk/cli.py``. ``edgesdk deploy``
runs ``edgesdk engine check`` on the board (can this edgesdk's own Python import TensorRT, and is a
CUDA device usable?) and
then ``edgesdk engine build RELEASE --out CACHE_DIR`` there (edgesdk/deploy/engine.py). TensorRT
is imported inside the commands, so ``--help`` works on any machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from edgesdk.cli_options import NamedPath


@click.group()
def engine():
    """TensorRT engines: build one for a bundle on this machine's GPU.

    \b
      edgesdk engine build bundles/smollm2-135m-orin-nano-8gb
      edgesdk engine build releases/ID --out engines/ID/KEY   # what deploy runs on a Jetson
    """


@engine.command("build")
# not exists=True, file_okay=False: click's "Directory 'b.tar' is a file." came before verification's refusals, which
# name an archive (with the unpack that opens it), a model (with the build), and a bundle a killed write left aside
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--out", type=NamedPath("engine directory", "--out engines/my-bundle", file_okay=False),
              help="Engine directory [<deploy root>/engines/<bundle-id>/<key> for a deployed release, else "
                   "$EDGESDK_CACHE/engines/<bundle-id>/<key>]. run, serve, eval and bench look in those two places; "
                   "one elsewhere they use only when $EDGESDK_ENGINE_DIR names it.")
# TensorRT takes the workspace as a size_t of bytes and caps it at the device's memory: 1 TiB is more than any GPU has,
# where a value past 2**44 MB no longer fits the size_t and failed as a TypeError once the graph was parsed
@click.option("--workspace-mb", type=click.IntRange(min=16, max=1 << 20), default=1024, show_default=True,
              help="TensorRT builder workspace (tactic scratch memory) in MB.")
@click.option("--max-seq", type=click.IntRange(min=1), default=None,
              help="Longest prefill chunk the engine's profile allows [min(512, max_context)].")
@click.option("--strongly-typed", is_flag=True,
              help="Keep the ONNX types (no FP16/INT8 builder flags); always so on TensorRT >= 11.")
@click.option("--timing-cache", type=NamedPath("timing cache file", "--timing-cache trt.cache", dir_okay=False),
              help="Timing cache file [$EDGESDK_CACHE/tensorrt/timing-trt<version>-sm<SM>-<module>.cache; on a machine "
                   "that cannot tell its Jetson module, timing-trt<version>-sm<SM>.cache].")
@click.option("--force", is_flag=True, help="Rebuild even when a matching engine is cached.")
@click.option("--json", "as_json", is_flag=True, help="Print engine.json (with path and cached) on stdout.")
def engine_build(bundle, out, workspace_mb, max_seq, strongly_typed, timing_cache, force, as_json):
    """Build BUNDLE's TensorRT engine (engine.plan + engine.json) from its standard ONNX graph.

    The engine is valid for this TensorRT version and GPU only; a cached one for the same bundle,
    TensorRT, SM, --max-seq and typing is reused unless --force. Prints the engine path.
    """
    from edgesdk.runtime.tensorrt_engine import build_engine

    # build_engine verifies the bundle, then refuses the graph facts run refuses (check_runnable) before it builds
    info = build_engine(bundle, out=out, workspace_mb=workspace_mb, force=force, max_seq=max_seq,
                        strongly_typed=strongly_typed or None, timing_cache=timing_cache,
                        log=lambda message: click.echo(f"edgesdk engine: {message}", err=True))
    click.echo(json.dumps(info, indent=2) if as_json else info["path"])


@engine.command("check")
def engine_check():
    """Exit 0 when this edgesdk's Python can import TensorRT (a new enough one) and a CUDA device is usable,
    printing TensorRT's version and the device's SM: an engine build needs both (it fails on "no CUDA device is
    usable" where the driver is missing or too old, or CUDA_VISIBLE_DEVICES hides the GPU)."""
    from edgesdk.runtime.tensorrt_engine import import_tensorrt, require_sm

    version = import_tensorrt().__version__
    click.echo(f"{version} sm{require_sm()}")
