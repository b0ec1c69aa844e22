"""The TensorRT engine step: built on the board, because engines are tied to the exact TensorRT
version, GPU and module that built them (reference/targets-thermal.md §3, "Engine portability").

Engines are cached under ``<root>/engines/<bundle-id>/jp<JetPack>-trt<TensorRT>-sm<SM>/``, so a
JetPack upgrade (new TensorRT) builds a new one and a redeploy of the same bundle reuses it. The
builder is ``edgesdk engine build RELEASE --out CACHE_DIR`` run by the board's edgesdk
(edgesdk/runtime/tensorrt_engine.py); it writes ``engine.plan`` and ``engine.json`` and renames
the directory into place only when complete, so a non-empty key directory is a finished engine.
The runtime's ``tensorrt`` backend looks for it in the same place. This step says plainly when
it is skipped and why (not a Jetson, no TensorRT, or a board edgesdk older than the builder).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError
from edgesdk.runtime.tensorrt_engine import cache_key

__all__ = ["EngineDecision", "build_engine", "cache_key", "decide", "has_engine_builder"]


@dataclass(frozen=True)
class EngineDecision:
    """Whether to build, and the line that explains it."""

    build: bool
    message: str
    cache_dir: str | None = None


def decide(facts: BoardFacts, gpu_sm: int | None, bundle_id: str, board: Board, has_builder: bool) -> EngineDecision:
    """The engine step for this board and bundle (see module docstring)."""
    if facts.board.family != "jetson":
        return EngineDecision(False, f"skipped: not a Jetson (the board is a {facts.board.family} machine)")
    if not facts.tensorrt:
        return EngineDecision(False, "skipped: TensorRT was not found on the Jetson (neither the Python 'tensorrt' "
                                     "module nor the 'tensorrt' package); the runtime falls back to ONNX Runtime")
    if not (facts.raw.get("tensorrt") or {}).get("python"):
        return EngineDecision(False, f"skipped: TensorRT {facts.tensorrt} is installed but its Python bindings are "
                                     "not importable (JetPack's python3-libnvinfer)")
    key = cache_key(facts.board.jetpack, facts.tensorrt, gpu_sm)
    cache = board.path("engines", bundle_id, key)
    if key in (facts.raw.get("engines") or []):
        return EngineDecision(False, f"cached: engines/{bundle_id}/{key} was built on this board for the same "
                                     "JetPack, TensorRT and SM", cache)
    if not has_builder:
        return EngineDecision(False, f"skipped: TensorRT {facts.tensorrt} is present, but the board's edgesdk has no "
                                     f"TensorRT engine builder yet ('edgesdk engine build'; deploy a newer edgesdk "
                                     f"runtime); the engine would be cached as engines/{bundle_id}/{key}", cache)
    return EngineDecision(True, f"building the TensorRT engine into engines/{bundle_id}/{key}", cache)


def has_engine_builder(board: Board, edgesdk: list[str]) -> bool:
    """Whether the board's edgesdk has an ``engine build`` command."""
    proc = board.transport.run([*edgesdk, "engine", "build", "--help"], timeout=120)
    return proc.returncode == 0


def build_engine(board: Board, edgesdk: list[str], release: str, decision: EngineDecision) -> None:
    """Run the board's engine builder, writing into the cache directory for this JetPack/TensorRT/SM."""
    proc = board.transport.run([*edgesdk, "engine", "build", release, "--out", decision.cache_dir], timeout=7200)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-8:]
        raise DeployError(f"the TensorRT engine build failed on {board.label}:\n    " + "\n    ".join(tail),
                          "see the builder's message above; the board keeps its current release")
