"""The TensorRT engine step: built on the board, because engines are tied to the exact TensorRT
version, GPU and module that built them (reference/targets-thermal.md §3, "Engine portability").

Engines are cached under ``<root>/engines/<bundle-id>/jp<JetPack>-trt<TensorRT>-sm<SM>-<module>/``, so a
JetPack upgrade (new TensorRT) builds a new one, a root moved to another module of the same SM (an Orin NX
and an Orin Nano are both sm_87; reference §3: engines are not to be shared across device models) builds
its own, and a redeploy of the same bundle reuses it. A directory an older edgesdk named without the module
is not taken for this key: the engine is built again. The
builder is ``edgesdk engine build RELEASE --out CACHE_DIR`` run by the board's edgesdk
(edgesdk/runtime/tensorrt_engine.py); it writes ``engine.plan`` and ``engine.json`` and renames
the directory into place only when complete. A key directory found there is still handed to the
builder, which reuses the engine when it is whole and rebuilds it otherwise. The runtime's ``tensorrt`` backend looks for it in the same place. This step says plainly when
it is skipped and why (not a Jetson, a graph TensorRT does not take, no TensorRT, a runtime whose
Python cannot import it, or a board edgesdk older than the builder).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgesdk.deploy.probe import BoardFacts
from edgesdk.deploy.remote import Board
from edgesdk.deploy.transport import DeployError
from edgesdk.runtime.tensorrt_engine import JETSON_TENSORRT, cache_key, engine_module

__all__ = ["NO_BUILDER", "BuilderStatus", "EngineDecision", "build_engine", "builder_status", "cache_key",
           "decide", "engine_key", "planned_engine_bytes"]


# What runs the bundle instead of a TensorRT engine: ONNX Runtime, whose aarch64 wheel on PyPI (what the runtime's
# install gets) has the CPU provider only; a Jetson's GPU needs onnxruntime-gpu from the Jetson wheels.
NO_TENSORRT_FALLBACK = ("the runtime falls back to ONNX Runtime, on the CPU (pip's aarch64 onnxruntime has no GPU "
                        "provider)")
DEPLOY_AGAIN = "then deploy again (it builds the engine)"


@dataclass(frozen=True)
class EngineDecision:
    """Whether to build, and the line that explains it."""

    build: bool
    message: str
    cache_dir: str | None = None


def decide(facts: BoardFacts, gpu_sm: int | None, bundle_id: str, board: Board, builder: BuilderStatus,
           graph_form: str = "standard") -> EngineDecision:
    """The engine step for this board and bundle (see module docstring)."""
    if facts.board.family != "jetson":
        return EngineDecision(False, f"skipped: not a Jetson (the board is a {facts.board.family} machine)")
    if graph_form != "standard":
        return EngineDecision(False, f"skipped: TensorRT builds from the standard ONNX graph, and this bundle's graph "
                                     f"is '{graph_form}' (ONNX Runtime runs it; a Jetson recipe such as 'jetson' "
                                     "gives a standard graph)")
    if not facts.tensorrt:
        return EngineDecision(False, "skipped: TensorRT was not found on the Jetson (neither the Python 'tensorrt' "
                                     f"module nor the 'tensorrt' package); {NO_TENSORRT_FALLBACK}. Fix: "
                                     f"{JETSON_TENSORRT}, {DEPLOY_AGAIN}")
    if not (facts.raw.get("tensorrt") or {}).get("python"):
        return EngineDecision(False, f"skipped: TensorRT {facts.tensorrt} is installed but its Python bindings are "
                                     f"not importable (JetPack's python3-libnvinfer); {NO_TENSORRT_FALLBACK}. Fix: "
                                     f"{JETSON_TENSORRT}, {DEPLOY_AGAIN}")
    gpu_problem = facts.raw.get("gpu_problem")
    if gpu_problem:  # 'edgesdk engine check' imports TensorRT only: the build would fail on "no CUDA device"
        problem, fix = gpu_problem
        return EngineDecision(False, f"skipped: TensorRT {facts.tensorrt} is present, but {problem}; the runtime "
                                     f"falls back to ONNX Runtime on the CPU. Fix: {fix}")
    module = engine_module(facts.board)
    key = engine_key(facts, gpu_sm, builder)
    same = f"JetPack, TensorRT, SM and module ({module})" if module else "JetPack, TensorRT and SM"
    cache = board.path("engines", bundle_id, key)
    cached = key in (facts.raw.get("engines") or [])
    if not builder.available:
        if cached:
            return EngineDecision(False, f"cached: engines/{bundle_id}/{key} was built on this board for the same "
                                         f"{same} (not checked: {builder.reason})", cache)
        return EngineDecision(False, f"skipped: TensorRT {facts.tensorrt} is present, but {builder.reason}; the "
                                     f"engine would be cached as engines/{bundle_id}/{key}", cache)
    if cached:  # the probe sees a directory; the builder checks the engine in it and rebuilds one that is not whole
        return EngineDecision(True, f"cached: engines/{bundle_id}/{key} was built on this board for the same "
                                    f"{same}; 'edgesdk engine build' checks it (and rebuilds it if it is damaged)",
                              cache)
    return EngineDecision(True, f"building the TensorRT engine into engines/{bundle_id}/{key}", cache)


def engine_key(facts: BoardFacts, gpu_sm: int | None, builder: BuilderStatus) -> str:
    """The cache key :func:`decide` names the engine directory by. The builder keys its engine by the TensorRT it
    imports and the GPU it finds ('edgesdk engine check' says both); the probe's system-Python TensorRT and the
    bundle's target SM (``gpu_sm``) stand in only for what the builder did not say."""
    return cache_key(facts.board.jetpack, builder.tensorrt or facts.tensorrt, builder.sm or gpu_sm,
                     engine_module(facts.board))


def planned_engine_bytes(facts: BoardFacts, manifest: dict, files: dict[str, dict],
                         builder: BuilderStatus | None = None) -> int:
    """Disk space the engine step may take under ``engines/<bundle-id>/`` (0 where :func:`decide` builds none, as
    the probe tells: not a Jetson, another graph form, no TensorRT or its bindings, no usable GPU), for the disk
    check before the transfer. An engine already there counts 0, as does a builder that says it cannot build: the
    directory is named after the TensorRT and GPU the board's builder (``builder``, :func:`builder_status`) reports
    (:func:`engine_key`); without its answer, after the probe's system-Python TensorRT and the bundle's target SM,
    which name the same directory unless the runtime imports another TensorRT or the bundle names no SM (then a
    short disk fails the engine step, before anything is switched, where the check would have refused the
    deploy; the deploy asks the builder before the transfer only where it is already on the board, and passes
    ``builder`` then, not where it installs a runtime first). The
    serialized plan holds the network's weights, at most at the graph's own precision (INT8 for a Q/DQ graph,
    FP16 or FP32 otherwise), so it is taken to be as large as the bundle in memory (probe.memory_bytes: its files,
    the weights inflated); the builder writes it beside its directory and renames it into place, so it needs that
    much free at once."""
    from edgesdk.deploy.probe import memory_bytes

    if (facts.board.family != "jetson" or manifest["graph"].get("form", "standard") != "standard"
            or not facts.tensorrt or not (facts.raw.get("tensorrt") or {}).get("python")
            or facts.raw.get("gpu_problem")):
        return 0
    sm = (manifest["target"].get("gpu") or {}).get("sm")
    if builder is not None and not builder.available:
        return 0
    if engine_key(facts, sm, builder or BuilderStatus(True)) in (facts.raw.get("engines") or []):
        return 0
    return memory_bytes(manifest, files)


@dataclass(frozen=True)
class BuilderStatus:
    """Whether the board's edgesdk can build an engine, and if not, why (a clause of a sentence); where it can, the
    TensorRT version and GPU SM its ``edgesdk engine check`` reported (None when it printed neither)."""

    available: bool
    reason: str = ""
    tensorrt: str | None = None
    sm: int | None = None


NO_BUILDER = BuilderStatus(False, "the board's edgesdk has no TensorRT engine builder yet ('edgesdk engine "
                                  "check' and 'build'; deploy a newer edgesdk runtime)")


def builder_status(board: Board, edgesdk: list[str], runtime_key: str | None = None) -> BuilderStatus:
    """Ask the board's edgesdk whether its own Python imports TensorRT and sees a usable CUDA device
    (``edgesdk engine check``).

    The probe's answer is about the board's system Python; the runtime's venv sees JetPack's TensorRT only when it
    was made with system site-packages. ``runtime_key`` names the runtime that answers (None where it is not one
    of the deploy root's): one whose key ends in ``-site`` sees them already, so its refusal has another cause.
    """
    proc = board.transport.run([*edgesdk, "engine", "check"], timeout=120, what="edgesdk engine check")
    if proc.returncode == 0:
        return BuilderStatus(True, "", *_checked_build(proc.stdout.decode("utf-8", "replace")))
    message = proc.stderr.decode("utf-8", "replace")
    if "No such command" in message:
        return NO_BUILDER
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    # edgesdk's own refusal is its "error: ..." line; anything else (a Python traceback of an edgesdk or a
    # tensorrt that fails to import in another way, or warnings printed first) ends with the line that says why,
    # where the first line was "Traceback (most recent call last):" or a warning
    said = [line for line in lines if line.startswith("error: ")]
    problem = (said[0].removeprefix("error: ") if said else lines[-1]) if lines else f"exit status {proc.returncode}"
    if problem.startswith("no CUDA device is usable"):  # TensorRT imports; the GPU does not answer
        return BuilderStatus(False, f"the board's GPU cannot be used ({problem}; check the board's CUDA driver, "
                                    "CUDA_VISIBLE_DEVICES, and that the deploy user may open the GPU)")
    board_fix = next((line.removeprefix("fix: ") for line in lines if line.startswith("fix: ")), None)
    return BuilderStatus(False, f"the board's edgesdk cannot use it ({problem}; "
                                f"{_builder_fix(problem, runtime_key, board_fix)})")


def _checked_build(stdout: str) -> tuple[str | None, int | None]:
    """TensorRT version and SM from the ``10.3.0 sm87`` line ``edgesdk engine check`` prints last, or (None, None)
    for an answer of another form (a board edgesdk that printed only the version)."""
    words = (stdout.strip().splitlines() or [""])[-1].split()
    if len(words) == 2 and words[1].startswith("sm") and words[1][2:].isdigit():
        return words[0], int(words[1][2:])
    return None, None


def _builder_fix(problem: str, runtime_key: str | None, board_fix: str | None) -> str:
    """The fix for a board's edgesdk that cannot use TensorRT. A runtime venv made without system site-packages
    does not see JetPack's TensorRT, and deploying with them is the fix; for a runtime that sees them already (key
    ending in ``-site``) or a TensorRT older than the builder takes, that flag changes nothing: the board's own
    'fix:' line says what does (install python3-libnvinfer, use JetPack 6), as it does for an edgesdk that is no
    runtime of the deploy root (``runtime_key`` None), which the flag does not make."""
    too_old = "is older than" in problem
    if not too_old and runtime_key is not None and not runtime_key.endswith("-site"):
        return "deploy with --runtime-venv-system-site-packages so the runtime sees JetPack's TensorRT"
    # a runtime key None: the answering edgesdk is none of the deploy root's runtimes (--no-install, --to DIR),
    # which the flag does not make
    cause = "" if too_old or runtime_key is None else (f"runtime/{runtime_key} sees the board's system "
                                                       "site-packages already, so the cause is on the board: ")
    return cause + (board_fix or "check that the board's Python (--remote-python) imports it: "
                                 "python3 -c 'import tensorrt; print(tensorrt.__version__)'")


ENGINE_LOG_LINES = 8


def _is_trt_line(line: str) -> bool:
    """Whether ``line`` is TensorRT's log: ``[TRT] [E] message`` from edgesdk's stderr logger, or the default
    ``trt.Logger``'s ``[12/06/2026-08:55:02] [TRT] [E] message`` (an older edgesdk on the board)."""
    return line.startswith("[TRT] ") or (line.startswith("[") and "] [TRT] " in line)


def build_engine(board: Board, edgesdk: list[str], release: str, decision: EngineDecision) -> None:
    """Run the board's engine builder, writing into the cache directory for this JetPack/TensorRT/SM/module.

    A failed build is reported with TensorRT's own log first and the builder's error under it: the builder's
    logger writes TensorRT's ``[TRT] [E]`` lines that say why the build failed to stderr, among the
    ``edgesdk engine:`` progress lines, and edgesdk's ``error:`` line, which points to "its log above", under
    them; an older edgesdk on the board used TensorRT's default ``trt.Logger``, which writes them to stdout
    (NVIDIA/TensorRT#4306). The ``[TRT]`` lines of both are picked out with a budget of their own, so that the
    progress lines do not push them out of the tail, and the rest of stderr's tail follows."""
    proc = board.transport.run([*edgesdk, "engine", "build", release, "--out", decision.cache_dir], timeout=7200,
                               what="the TensorRT engine build")
    if proc.returncode != 0:
        from edgesdk.deploy.session import stderr_tail

        stdout = proc.stdout.decode("utf-8", "replace").strip().splitlines()
        stderr = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        trt_log = [line for line in [*stdout, *stderr] if _is_trt_line(line)][-ENGINE_LOG_LINES:]
        tail = stderr_tail("\n".join(line for line in stderr if not _is_trt_line(line)), lines=ENGINE_LOG_LINES)
        raise DeployError(f"the TensorRT engine build failed on {board.label} (exit {proc.returncode}):\n    "
                          + "\n    ".join([*trt_log, *tail] or ["(no output)"]),
                          "see the builder's message above; the board keeps its current release")
