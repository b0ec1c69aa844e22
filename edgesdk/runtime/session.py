"""Open a bundle for generation: verify it, check its target, pick a backend, load the tokenizer.

Backends are a table (``OPENERS``): name -> opener that returns a DecoderBackend or raises
RuntimeBackendError whose problem is the reason, noted as ``"{name}: {reason}"``. The chain is
the profile's ``runtime.backend`` then its ``fallbacks`` (or ``--backend``); the first that
opens is used and every note says why each backend was or was not.

* ``ort-cpu`` / ``ort-cuda`` / ``ort-trt``: ONNX Runtime with those execution providers; the
  TensorRT EP caches its engines in ``ort-trt`` under the first writable of the bundle's engine
  directories (``tensorrt_engine.engine_bases``: the deploy root's ``engines/<bundle-id>``, else the
  user cache's).
* ``tensorrt``: the engine ``edgesdk engine build`` made (edgesdk/runtime/tensorrt_backend.py).
* ``triton``: the block-sparse weights on the Triton kernels (edgesdk/runtime/triton_backend.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.bundle import Bundle, check_runnable, model_positions, verify_bundle
from edgesdk.errors import BundleError, EdgeSDKError, RuntimeBackendError
from edgesdk.runtime.backend import DecoderBackend, close_backend
from edgesdk.runtime.ort_backend import MAX_THREADS
from edgesdk.runtime.text import ChatTokenizer

# backend name -> onnxruntime execution providers it needs
ORT_PROVIDERS = {
    "ort-cpu": ["CPUExecutionProvider"],
    "ort-cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "ort-trt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}
NOT_BUILT = "not built into this edgesdk release"


@dataclass
class Runtime:
    """A loaded bundle ready to generate."""

    bundle: Bundle
    backend: DecoderBackend
    tokenizer: ChatTokenizer
    notes: list[str] = field(default_factory=list)  # why each backend was or was not used
    threads: int = 1  # intra-op threads the backend was opened with
    # each backend of the chain tried before the one that runs -> why it did not open ({}: the first opened), as
    # open_runtime's open of the chain recorded it: what eval --json reports, read here, not rebuilt from notes
    backend_reasons: dict[str, str] = field(default_factory=dict)

    def cap_context(self, tokens: int, source: str = "-c") -> None:
        """Hold this runtime to a context of ``tokens``, at most the one it holds now (the bundle's, fixed when it
        was built), as llama.cpp's ``-c N`` makes N the run's context: the backend's ``max_context``, which every
        bound reads (a prompt past it refused, a chat's oldest exchanges left out at it, a server's ``n_ctx``), is
        lowered; nothing is reloaded. The backends that grow their KV cache as it fills (the ONNX Runtime ones, the
        triton backend) then never hold more than ``tokens``; the tensorrt backend's cache, allocated at the built
        context when its engine loads, keeps its size. A larger context is refused: the graph's KV cache, rotary
        tables and TensorRT profiles were sized for the built one, and a CUDA graph captured by the triton backend
        holds its cache's addresses, which growing it again would leave stale. ``source``: what asked for the cap,
        as a refusal past it names it and the setting its fix raises (the backend's ``context_source``:
        :data:`edgesdk.bundle.CONTEXT_SOURCES`): ``-c``, LLAMA_ARG_CTX_SIZE where the environment gave it, load()'s
        ``n_ctx``."""
        held = int(self.backend.max_context)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= held:
            built = getattr(self.backend, "built_context", None) or held
            if isinstance(tokens, int) and not isinstance(tokens, bool) and held < tokens <= built:
                # capped before: the bundle holds it, but a cap only lowers; a rebuild would change nothing
                raise EdgeSDKError(f"a context of {tokens} tokens for bundle {self.bundle.path}: this runtime is "
                                   f"held to {held} of the bundle's {built}, and a runtime's context can only be "
                                   "lowered", f"pass at most {held}, or open the bundle again with the larger "
                                   f"context (-c {tokens}, context={tokens})")
            raise EdgeSDKError(f"a context of {tokens!r} tokens for bundle {self.bundle.path}: expected a whole "
                               f"number from 1 to the {held} it holds",
                               f"pass at most {held}, or rebuild the bundle with 'edgesdk build --max-context N' "
                               "for a larger one" if held == built else
                               f"pass at most {held}, or open the bundle again with a context up to its {built} "
                               "(-c N, context=N); past that, rebuild it with 'edgesdk build --max-context N'")
        if tokens == held:
            return
        if getattr(self.backend, "built_context", None) is None:  # the first cap: what the backend held is the built
            self.backend.built_context = held  # a refusal past the cap names both, and raising -c as its fix
        self.backend.context_source = source  # ... or raising what held it, where that was not -c
        self.backend.max_context = tokens
        decoder = getattr(self.backend, "decoder", None)  # the triton backend's, which grows its cache to its own
        if decoder is not None and getattr(decoder, "max_context", 0) > tokens:
            decoder.max_context = tokens
        self.notes.append(f"context {tokens} tokens (the bundle's {self._built_context()})")

    def _built_context(self) -> int | str:
        """The context the bundle was built with (its manifest's), as a note names it beside a capped one."""
        return (self.bundle.manifest.get("graph") or {}).get("max_context", "?")


# each bundle's resolved directory -> the context every runtime opened of it holds while :func:`context_limits` runs,
# and what asked for it (Runtime.cap_context's ``source``)
_CONTEXT_LIMITS: dict[Path, int] = {}
_CONTEXT_SOURCES: dict[Path, str] = {}


def context_limit(path: Path) -> int | None:
    """The context :func:`context_limits` holds the bundle at ``path`` to now, None where it sets none: what an
    unloaded model of a server describes as its context (edgesdk.serve.model_pool.GraphFacts), as the runtime
    opened of it will hold."""
    return _CONTEXT_LIMITS.get(Path(path).resolve())


@contextlib.contextmanager
def context_limits(limits: dict[Path, int], source: str = "-c"):
    """While the block runs, :func:`open_runtime` holds each runtime it opens of a bundle in ``limits`` (its
    directory -> a context of at most its own) to that context (:meth:`Runtime.cap_context`): a server's ``-c N``,
    which holds for each model it loads, the first at start and the others as requests name them, and each again
    after an unload. ``source``: what asked for them (``-c``, or LLAMA_ARG_CTX_SIZE where the environment gave
    them), which a refusal past one names (:meth:`Runtime.cap_context`). Left, the limits are gone, so that nothing
    opened later in the process is held by them."""
    kept, kept_sources = dict(_CONTEXT_LIMITS), dict(_CONTEXT_SOURCES)
    _CONTEXT_LIMITS.update({Path(path).resolve(): int(tokens) for path, tokens in limits.items()})
    _CONTEXT_SOURCES.update({Path(path).resolve(): source for path in limits})
    try:
        yield
    finally:
        _CONTEXT_LIMITS.clear()
        _CONTEXT_LIMITS.update(kept)
        _CONTEXT_SOURCES.clear()
        _CONTEXT_SOURCES.update(kept_sources)


def check_target(bundle: Bundle, expected_target: str | None, ignore_target: bool, terms: str = "cli") -> str | None:
    """Refuse a bundle built for another board, or on a Jetson or Raspberry Pi whose target cannot be told (as deploy
    does). Returns a note when running a board bundle on a host. ``terms``:
    whose names a refusal's fix and the note give the choices, ``"cli"`` the command line's (``--target``,
    ``--ignore-target``, ``edgesdk build --target``) or ``"python"`` :func:`edgesdk.load`'s (``target=``,
    ``ignore_target=True``, :func:`edgesdk.build_bundle`), as :func:`edgesdk.profile.get_profile` takes them."""
    from edgesdk.board import detect_board
    from edgesdk.profile import get_profile

    python = terms == "python"
    if ignore_target:
        given = f"target={expected_target!r}" if python else f"--target {expected_target}"
        unchecked = "" if expected_target is None else f", so {given} is not checked"
        skipped = "ignore_target=True" if python else "--ignore-target"
        return f"target check skipped ({skipped}{unchecked}); bundle built for {bundle.target}"
    if expected_target is not None:
        verify_target = get_profile(expected_target, terms).name
        if bundle.target != verify_target:
            raise BundleError(
                f"bundle {bundle.path} was built for target '{bundle.target}', not '{verify_target}'",
                _rebuild_fix(verify_target, python),
            )
        return None
    board = detect_board()
    if board.family in ("jetson", "rpi") and not board.suggested_target:
        raise BundleError(_unknown_board_problem(bundle, board), _unknown_board_fix(bundle, python))
    if board.family in ("jetson", "rpi") and board.suggested_target != bundle.target:
        seen = ", ".join(part for part in (board.model, board.module_words()) if part) or board.architecture
        raise BundleError(
            f"bundle {bundle.path} was built for '{bundle.target}' but this board is '{board.suggested_target}' "
            f"({seen}){_note_words(board)}",
            _rebuild_fix(board.suggested_target, python),
        )
    if board.family == "host" and bundle.target != "host":
        return f"running a bundle for '{bundle.target}' on a development host ({board.architecture})"
    return None


def _unknown_board_problem(bundle: Bundle, board) -> str:
    """Why a bundle is refused on a Jetson or Raspberry Pi that matches no shipped profile (a module without one, a
    container that hides the device tree's model, a 32-bit userland), as deploy refuses it
    (edgesdk/deploy/probe.py ``check_target``): the bundle may be for another board, and nothing would say so."""
    module = f"{board.module_words()}, " if board.module else ""
    return (f"cannot tell which target profile matches this {board.family} board (model {board.model!r}, {module}"
            f"{board.architecture or 'architecture unknown'}), so bundle {bundle.path}, built for "
            f"'{bundle.target}', is refused{_note_words(board)}")


def _note_words(board) -> str:
    """Why the board's detected target may be wrong (the model string and the module disagree, or the compatible
    names two modules), as a refusal's tail; "" where detection noted nothing."""
    return f"; {board.detection_note}" if board.detection_note else ""


def _unknown_board_fix(bundle: Bundle, python: bool) -> str:
    """The ways through :func:`_unknown_board_problem`: skip the check or name the board's target: a shipped
    profile by its name, a profile of the user's own by its YAML file (get_profile reads a path; the check then
    holds the bundle to that profile's name)."""
    from edgesdk.profile import shipped_profiles

    skip = "ignore_target=True" if python else "--ignore-target"
    if bundle.target not in shipped_profiles():
        yaml = f"PATH/TO/{bundle.target}.yaml"
        given = f"target={yaml!r}" if python else f"--target {yaml}"
        return (f"pass {given}, the profile '{bundle.target}' the bundle was built from (or {skip}), once you have "
                "checked this board is one the bundle was built for")
    given = f"target={bundle.target!r}" if python else f"--target {bundle.target}"
    return f"pass {given} (or {skip}) once you have checked this board is one the bundle was built for"


def _rebuild_fix(target: str, python: bool) -> str:
    """The fix for a bundle built for another board than ``target``: build one for it, or run it anyway, in the
    command line's words or (``python``) in those of edgesdk.build_bundle() and edgesdk.load()."""
    if python:
        return (f"build one for it with edgesdk.build_bundle({target!r}, ...) (on a host), or pass "
                "ignore_target=True")
    return f"build it with 'edgesdk build --target {target}', or pass --ignore-target"


CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def _cgroup_quota(directory: Path) -> float | None:
    """The CPUs the cgroup ``directory`` may use, or None where it sets no limit (or has no cpu controller files):
    cgroup v2's ``cpu.max`` "$MAX $PERIOD" ("max" unlimited; Linux Documentation/admin-guide/cgroup-v2.rst),
    cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 unlimited; Documentation/scheduler/sched-bwc.rst)."""
    try:
        quota, _, period = (directory / "cpu.max").read_text().strip().partition(" ")
    except OSError:
        try:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            return None
    try:
        quota_us, period_us = int(quota), int(period or 100000)
    except ValueError:  # "max": no limit
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def cgroup_cpu_limit(proc_cgroup: Path | None = None, root: Path | None = None) -> float | None:
    """The CPUs this process's cgroups allow (``docker run --cpus``, a systemd ``CPUQuota=``, a Kubernetes CPU limit):
    the tightest quota on the path of each hierarchy ``/proc/self/cgroup`` names and on its ancestors, as a limit on
    a parent holds for its children; None where none is set. Inside a container its own cgroup is mounted at the
    root, so a path not there is read from the root. Affinity does not show a quota: ``docker --cpus 2`` on an
    8-core Orin leaves ``sched_getaffinity`` at 8, and 8 spinning threads then run throttled a quarter of the time."""
    proc_cgroup = PROC_CGROUP if proc_cgroup is None else proc_cgroup
    root = CGROUP_ROOT if root is None else root
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers and "cpu" not in controllers.split(","):
            continue
        bases = [root] if not controllers else [root / controllers, root / "cpu"]  # v2 unified; v1 cpu controller
        parts = [part for part in path.split("/") if part]
        for base in bases:
            for depth in range(len(parts), -1, -1):
                limit = _cgroup_quota(base.joinpath(*parts[:depth]))
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, a cpuset), at most its cgroup CPU quota
    rounded up (:func:`cgroup_cpu_limit`; the JVM and .NET count a quota so), at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(cores, 1)


def _available_providers() -> list[str]:
    """The execution providers of the installed onnxruntime, or a RuntimeBackendError when it cannot be
    imported (a GPU wheel built for another JetPack misses its CUDA libraries), so the chain goes on."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RuntimeBackendError(f"onnxruntime cannot be imported by Python {sys.version.split()[0]}: {exc}",
                                  "pip install onnxruntime (on a Jetson, the onnxruntime-gpu wheel for its JetPack "
                                  "and Python from jetson-containers / Jetson Zoo); 'edgesdk env' shows what is "
                                  "installed") from exc
    return list(ort.get_available_providers())


def ort_trt_profile(graph: dict):
    """The explicit TensorRT optimization profile of a standard-form graph run by the ort-trt backend, or None for
    the fused forms, whose contrib ops TensorRT does not run: a pass of up to ``tensorrt_engine.DEFAULT_MAX_SEQ``
    tokens after any past length. The backend runs a longer prompt in passes of that many (``max_prefill``), as
    the tensorrt backend does, so the engine's activation memory is sized for 512 tokens, not max_context."""
    from edgesdk.runtime import tensorrt_engine as te

    return te.profile_shapes(graph) if graph.get("form", "standard") == "standard" else None


def ort_trt_options(bundle: Bundle) -> dict:
    """TensorRT EP options: engine and timing caches beside the bundle's engines, INT8 for a Q/DQ graph, FP16, and
    for the standard graph form the explicit optimization profile of :func:`ort_trt_profile`
    (:func:`tensorrt_engine.ort_profile_options`), which holds every shape the backend feeds, so the engine is
    built once: without one the EP rebuilt it at every step whose past was longer than any before."""
    from edgesdk.runtime import tensorrt_engine as te

    cache = next((base / "ort-trt" for base in te.engine_bases(bundle.path, bundle.bundle_id)
                  if _writable_directory(base / "ort-trt")), None)
    graph, target = bundle.manifest["graph"], bundle.manifest["target"]
    options = {"trt_fp16_enable": "fp16" in (target.get("precisions") or ()),
               "trt_int8_enable": graph.get("dtype") == te.QDQ_DTYPE}
    profile = ort_trt_profile(graph)
    if profile is not None:
        options.update(te.ort_profile_options(profile))
    if cache is not None:
        options.update({"trt_engine_cache_enable": True, "trt_engine_cache_path": str(cache),
                        "trt_timing_cache_enable": True, "trt_timing_cache_path": str(cache)})
    return options


def _writable_directory(directory: Path) -> bool:
    """Whether ``directory`` is, or can be made, a directory this process writes files in: created where missing,
    then a file made and removed in it. An existing directory passed ``mkdir(exist_ok=True)`` however it was
    protected (another user's deploy root, a read-only mount, an immutable directory), and the TensorRT EP, which
    does not check its writes, then built its engines again at every start without a word."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError:
        return False
    return True


def _ort_opener(name: str) -> Callable[[Bundle, int, bool], DecoderBackend]:
    """An ONNX Runtime backend with the execution providers of ``name`` (ORT_PROVIDERS)."""

    def open_ort(bundle: Bundle, threads: int, spinning: bool) -> DecoderBackend:
        from edgesdk.runtime.ort_backend import OrtBackend
        from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
        from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

        missing = [p for p in ORT_PROVIDERS[name] if p not in _available_providers()]
        if missing:
            raise RuntimeBackendError(f"onnxruntime here lacks {', '.join(missing)}")
        graph = bundle.manifest["graph"]
        backend_class = {"ort-fused": OrtFusedBackend, "ort-fused-gated": OrtGatedBackend}.get(graph.get("form"),
                                                                                              OrtBackend)
        providers = ORT_PROVIDERS[name]
        # The TensorRT EP's options go in with the session: set_providers() afterwards would reload
        # the model from its path, which for inflated weights on an older ORT is already gone.
        provider_options = [ort_trt_options(bundle), {}, {}] if name == "ort-trt" else None
        try:
            backend = backend_class(bundle.file(graph["file"]), graph, threads, providers, spinning=spinning,
                                    provider_options=provider_options)
        except RuntimeBackendError as exc:
            raise RuntimeBackendError(f"failed to load ({exc.problem})", exc.fix) from exc
        except MemoryError as exc:  # the first KV buffers, sized by the manifest's graph facts
            raise BundleError(f"bundle {bundle.path}: the KV cache its manifest describes (kv_heads "
                              f"{graph['kv_heads']!r:.60}, head_dim {graph['head_dim']}) does not fit in memory",
                              "rebuild the bundle with 'edgesdk build' (the manifest's graph facts were edited)") from exc
        try:
            check_graph_matches(bundle, backend)
        except BaseException:  # the session goes now, not when the error's traceback (kept at a REPL) lets it go
            backend.close()
            raise
        profile = ort_trt_profile(graph) if name == "ort-trt" else None
        if profile is not None:  # a longer prompt runs in passes the engine's profile holds
            backend.max_prefill = profile.max_seq
        if name != "ort-cpu":
            backend.name = name
        return backend

    return open_ort


def check_graph_matches(bundle: Bundle, backend) -> None:
    """Refuse a manifest whose graph facts do not describe the ONNX graph an ONNX Runtime ``backend``
    opened: the layers and their KV heads, head_dim, the vocabulary, and the form (the inputs the
    backend feeds and the outputs it reads). The hashes matched, so the manifest was edited with them;
    left alone, each of these is an onnxruntime error in the first step or logits read at the wrong width."""
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

    graph = bundle.manifest["graph"]
    inputs = {value.name: value.shape for value in backend.session.get_inputs()}
    outputs = {value.name: value.shape for value in backend.session.get_outputs()}
    kv_heads, head_dim, vocab = graph["kv_heads"], graph["head_dim"], graph["vocab_size"]
    problems = []
    layers = sum(1 for name in inputs if name.startswith("past_key_values.") and name.endswith(".key"))
    if layers != len(kv_heads):
        problems.append(f"'graph.kv_heads' lists {len(kv_heads)} layers; the graph has {layers}")
    for index, heads in enumerate(kv_heads):
        shape = inputs.get(f"past_key_values.{index}.key") or []
        if len(shape) == 4 and isinstance(shape[1], int) and shape[1] != heads:
            problems.append(f"'graph.kv_heads[{index}]' is {heads}; the graph's layer {index} has {shape[1]}")
    shapes = [shape for name, shape in inputs.items() if name.startswith("past_key_values.") and len(shape) == 4]
    widths = sorted({shape[3] for shape in shapes if isinstance(shape[3], int)})
    if widths and widths != [head_dim]:
        problems.append(f"'graph.head_dim' is {head_dim}; the graph's KV cache has {', '.join(map(str, widths))}")
    logits = outputs.get("logits") or []
    if logits and isinstance(logits[-1], int) and logits[-1] != vocab:
        problems.append(f"'graph.vocab_size' is {vocab}; the graph's logits have {logits[-1]}")
    fused, gated = isinstance(backend, OrtFusedBackend), isinstance(backend, OrtGatedBackend)
    fed = {"input_ids", "num_logits_to_keep"} | {name for name in inputs if name.startswith("past_key_values.")}
    fed |= {"seqlens_k", "total_sequence_length"} if fused else set()
    fed |= {"tau"} if gated or (fused and "tau" in (graph.get("inputs") or {})) else set()
    read = {"logits"} | ({"gates", "power"} if gated else set())
    form = graph.get("form", "standard")
    for kind, names in (("input", fed - inputs.keys()), ("output", read - outputs.keys())):
        if names:
            problems.append(f"'graph.form' is {form!r}, whose backend needs the {kind} "
                            f"{', '.join(map(repr, sorted(names)))} the graph lacks")
    if inputs.keys() - fed:
        problems.append(f"'graph.form' is {form!r}, whose backend does not feed the graph's input "
                        f"{', '.join(map(repr, sorted(inputs.keys() - fed)))}")
    if problems:
        raise BundleError(f"bundle {bundle.path}: the manifest's graph facts do not describe {graph['file']}:\n  - "
                          + "\n  - ".join(problems),
                          "rebuild the bundle with 'edgesdk build' (its manifest was edited along with its hashes)")


def _open_tensorrt(bundle: Bundle, threads: int, spinning: bool) -> DecoderBackend:
    from edgesdk.runtime.tensorrt_backend import open_tensorrt_backend

    return open_tensorrt_backend(bundle, threads)


def _open_triton(bundle: Bundle, threads: int, spinning: bool) -> DecoderBackend:
    from edgesdk.runtime.triton_backend import open_triton_backend

    return open_triton_backend(bundle, threads)


# backend name -> opener: returns a DecoderBackend or raises RuntimeBackendError(reason)
OPENERS: dict[str, Callable[[Bundle, int, bool], DecoderBackend]] = {
    **{name: _ort_opener(name) for name in ORT_PROVIDERS},
    "tensorrt": _open_tensorrt,
    "triton": _open_triton,
}


def open_backend(bundle: Bundle, names: list[str], threads: int, spinning: bool = True
                 ) -> tuple[DecoderBackend, list[str]]:
    """Try backends in order; return the first that loads and a note per backend tried. The backend gets the
    ``model_positions`` the bundle's manifest records (edgesdk.bundle.model_positions), which its refusals of a
    sequence past max_context, and generate's of a prompt past it, name as the most a rebuild gives."""
    backend, notes, _ = _open_chain(bundle, names, threads, spinning)
    return backend, notes


def _open_chain(bundle: Bundle, names: list[str], threads: int, spinning: bool
                ) -> tuple[DecoderBackend, list[str], dict[str, str]]:
    """:func:`open_backend`, with each backend refused before the one returned -> its reason (the first reason
    where a name comes twice): :attr:`Runtime.backend_reasons`, kept where the refusals happen so that no reader
    rebuilds the chain."""
    notes: list[str] = []
    reasons: dict[str, str] = {}
    fixes: dict[str, str] = {}  # backend name -> the fix its opener gave with its reason
    for name in names:
        opener = OPENERS.get(name)
        if opener is None:
            notes.append(f"{name}: {NOT_BUILT}")
            reasons.setdefault(name, NOT_BUILT)
            continue
        try:
            backend = opener(bundle, threads, spinning)
        except RuntimeBackendError as exc:
            notes.append(f"{name}: {exc.problem}")
            reasons.setdefault(name, exc.problem)
            if exc.fix:
                fixes.setdefault(name, exc.fix)
            continue
        backend.model_positions = model_positions(bundle.manifest)
        notes.append(f"{name}: used")
        return backend, notes, reasons
    raise RuntimeBackendError(f"no backend could run bundle {bundle.path}: " + "; ".join(notes),
                              _install_hint(names, fixes, bundle.manifest.get("edgesdk_version")))


def _install_hint(names: list[str], fixes: dict[str, str] | None = None, built_by: object = None) -> str:
    """What to do for the backends that were asked for: the fix a backend's opener gave with its reason (a bundle
    without block-sparse weights, CUDA libraries that do not load, an engine to rebuild), else what to install for
    it, or for a backend this edgesdk does not have (NOT_BUILT): the edgesdk release that built the bundle
    (``built_by``, the manifest's edgesdk_version) where it is another, else the backends this one has (no release of
    this version knows the name). The CPU one is the way out, unless it was tried and failed: then its own fix is
    what to do."""
    from edgesdk import __version__

    fixes = fixes or {}
    hints = {"ort-cuda": "onnxruntime-gpu (JetPack: the jetson-containers / Jetson Zoo wheel)",
             "ort-trt": "onnxruntime-gpu built with TensorRT, and TensorRT itself (JetPack)",
             "tensorrt": "TensorRT's Python bindings (JetPack), then 'edgesdk engine build BUNDLE'",
             "triton": "torch and triton with CUDA (the bundle's kernels/ for this GPU)"}
    unknown = "the bundle's runtime names it, and this edgesdk has no such backend: " + (
        f"install the edgesdk release that built the bundle (pip install edgesdk=={built_by})"
        if isinstance(built_by, str) and built_by != __version__ else
        f"edgesdk {__version__} knows no backend of that name, and the manifest names no other release to install; "
        f"its backends are {', '.join(OPENERS)}")
    wanted = [f"{name}: {fixes.get(name) or hints.get(name, unknown)}" for name in names if name != "ort-cpu"]
    if "ort-cpu" in names:
        last = f"ort-cpu: {fixes['ort-cpu']}" if fixes.get("ort-cpu") else \
            "ort-cpu: needs onnxruntime (pip install edgesdk)"
    else:  # the needs clause only where onnxruntime is missing: here it would send the user to install what they have
        last = "or pass --backend ort-cpu" + ("" if importlib.util.find_spec("onnxruntime") else
                                             " (needs onnxruntime: pip install edgesdk)")
    return "; ".join([*wanted, last])


# the warnings :func:`open_runtime` prints, with --verbose or without, each said once in a process that opens many
# runtimes (a server's models as requests name them, a draft model beside its target)
_SAID_ONCE: set[str] = set()


def ort_conflict_note() -> str | None:
    """A warning where both ONNX Runtime distributions, onnxruntime and onnxruntime-gpu, are installed (edgesdk.envinfo
    finds them, from their metadata alone: nothing is imported), else None. Both write the module ``onnxruntime``,
    and the one installed last is what runs: on a Jetson, ``pip install edgesdk`` puts PyPI's CPU onnxruntime over
    JetPack's onnxruntime-gpu, and every run fell back to ort-cpu, saying only that ort-cuda's providers were missing,
    while ``edgesdk env`` alone named the clash. Uninstalling onnxruntime alone takes the files they share with it
    (microsoft/onnxruntime#6183), so the fix uninstalls both and installs the GPU wheel again."""
    from edgesdk.envinfo import PACKAGES, shared_package_conflict

    conflict = shared_package_conflict(*PACKAGES["onnxruntime"])
    if conflict is None:
        return None
    return (f"warning: {conflict}; the one installed last is the onnxruntime that runs, and PyPI's onnxruntime has "
            "only the CPU provider: pip uninstall -y onnxruntime onnxruntime-gpu, then install onnxruntime-gpu again "
            "(on a Jetson the wheel for its JetPack, from Jetson Zoo or jetson-containers), and edgesdk after it with "
            "pip install --no-deps (uninstalling onnxruntime alone takes the files it shares with onnxruntime-gpu)")


def fallback_line(used: str, chain: list[str], backend_notes: list[str]) -> str | None:
    """The line that says which backend runs where it is not the first of ``chain`` (the bundle's runtime chain,
    or the --backend asked for, which is then the only one and never a fallback), with each skipped backend's
    reason from :func:`open_backend`'s notes; None where the first one opened."""
    if not chain or used == chain[0]:
        return None
    skipped = [note for note in backend_notes if note != f"{used}: used"]
    return f"backend {used} ({'; '.join(skipped)})"


def open_runtime(path: Path, backend: str | None = None, threads: int | None = None,
                 expected_target: str | None = None, ignore_target: bool = False,
                 spinning: bool = True, verbose: bool = False, terms: str = "cli",
                 name: str | None = None, context: int | None = None, context_source: str = "-c") -> Runtime:
    """Verify the bundle (hashes, then target) before loading anything, then load it. ``terms``: whose names the
    target's refusals and notes give the choices (:func:`check_target`): ``"python"`` where :func:`edgesdk.load` is
    the caller, the command line's otherwise. ``verbose`` prints every note on stderr; without it, a backend that
    opened in place of the bundle's first choice is said in one line (:func:`fallback_line`), except to the Python
    API, whose ``notes`` hold it. ``name``: the bundle as those lines name it where a process opens more than one (a
    draft model, a server's several models): ``edgesdk: NAME: backend ort-cpu (...)``; None: one bundle, unnamed.
    ``context``: the context the runtime holds, at most the bundle's (:meth:`Runtime.cap_context`); None: the one
    :func:`context_limits` sets for the bundle, else the bundle's. ``context_source``: what asked for ``context``
    (:meth:`Runtime.cap_context`'s ``source``: ``-c``, LLAMA_ARG_CTX_SIZE, load()'s ``n_ctx``)."""
    if backend and backend not in OPENERS:
        raise RuntimeBackendError(f"--backend {backend!r} is not a backend of this edgesdk",
                                  f"pick one of {', '.join(OPENERS)}, or leave it out to use the bundle's own")
    bundle = verify_bundle(Path(path))
    check_runnable(bundle)
    notes = []
    target_note = check_target(bundle, expected_target, ignore_target, terms)
    if target_note:
        notes.append(target_note)
    defaults = bundle.manifest["runtime"]
    chain = [backend] if backend else [defaults["backend"], *defaults.get("fallbacks", [])]
    if threads is None:
        # The profile's thread count is for its board; never oversubscribe the cores we have.
        threads = min(int(defaults["threads"]), usable_cores())
        notes.append(f"{threads} threads (profile {defaults['threads']}, {usable_cores()} usable cores)")
    elif isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        # every backend's bound, before one is opened (ggml's GGML_MAX_N_THREADS: llama.cpp refuses a count past it)
        option = "threads=N" if terms == "python" else "--threads N"
        raise EdgeSDKError(f"threads={threads!r}: expected a whole number from 1 to {MAX_THREADS}",
                           f"pass {option} with N from 1 to the board's {usable_cores()} usable cores, or leave it "
                           "out for the profile's count")
    elif threads > usable_cores():
        # Spinning thread pools on more threads than cores wreck each other: say so even without --stats.
        option = "threads" if terms == "python" else "--threads"
        print(f"edgesdk: warning: {threads} threads on {usable_cores()} usable cores oversubscribes them and "
              f"slows decoding; leave {option} out to use at most {usable_cores()}", file=sys.stderr)
    engine, backend_notes, reasons = _open_chain(bundle, chain, threads, spinning)
    notes += backend_notes
    # which onnxruntime runs is what two distributions writing it left: said wherever an ONNX Runtime backend was tried
    conflict = ort_conflict_note() if any(name in ORT_PROVIDERS for name in chain) else None
    if conflict is not None:
        notes.append(conflict)
    facts = bundle.manifest["tokenizer"]
    template = facts.get("chat_template")
    try:
        tokenizer = ChatTokenizer(bundle.file(facts["file"]), facts, bundle.file(template) if template else None)
    except BaseException:  # a tokenizer.json this tokenizers cannot read: the backend goes now, not with the traceback
        close_backend(engine)
        raise
    runtime = Runtime(bundle=bundle, backend=engine, tokenizer=tokenizer, notes=notes, threads=threads,
                      backend_reasons=reasons)
    if context is None:
        context = context_limit(bundle.path)
        context_source = _CONTEXT_SOURCES.get(Path(bundle.path).resolve(), context_source)
    if context is not None:
        try:
            runtime.cap_context(context, context_source)
        except BaseException:  # refused: the backend goes now, not with the traceback
            close_backend(engine)
            raise
    said = f"edgesdk: {name}: " if name else "edgesdk: "
    if verbose:
        for note in notes:
            if note == conflict:
                continue  # the install, not the bundle: said below, once a process
            # one line each: a backend's refusal can span lines (a loader's message), and deploy's smoke test reads
            # these lines back to tell the backend used from those skipped (deploy/session.py backend_used)
            print(f"{said}{' '.join(part.strip() for part in note.splitlines() if part.strip())}", file=sys.stderr)
    elif terms != "python" and (line := fallback_line(engine.name, chain, backend_notes)) is not None:
        # a slower backend than the bundle's first choice, said without --stats (llama.cpp says where its layers
        # went, ollama ps GPU or CPU); the Python API keeps these in Model.notes
        print(f"{said}{line}", file=sys.stderr)
    if conflict is not None and (verbose or terms != "python") and conflict not in _SAID_ONCE:
        # the install, not the bundle: said once a process, unnamed, with --stats too (a server's models, a draft
        # model beside its target each open a runtime)
        _SAID_ONCE.add(conflict)
        print(f"edgesdk: {conflict}", file=sys.stderr)
    return runtime
