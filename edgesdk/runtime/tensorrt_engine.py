"""Build a TensorRT engine from a bundle's standard-op ONNX graph, and find it again at run time.

``edgesdk engine build BUNDLE`` runs :func:`build_engine` on the board (engines are tied to the
TensorRT version, GPU and SM that built them: TensorRT developer guide, "Engine Compatibility").
It writes ``engine.plan`` (the serialized engine) and ``engine.json`` (TensorRT version, SM,
module, bundle id, build time, flags, profile and I/O shapes) into one directory per bundle and key::

    <deploy root>/engines/<bundle-id>/jp<JetPack>-trt<TensorRT>-sm<SM>-<module>/   bundle under <root>/releases/
    $EDGESDK_CACHE/engines/<bundle-id>/jp…-trt…-sm…-<module>/                      any other bundle

On a machine that is not a Jetson the module is the CUDA device's name (``NVIDIA-GeForce-RTX-4090``):
engines are specific to the GPU model, not only its SM, unless built with hardware compatibility
(TensorRT developer guide, "Hardware Compatibility"), which edgesdk's builder does not ask for.

The module is part of the key because the SM is not enough: AGX Orin, Orin NX and Orin Nano are
all sm_87, and TensorRT warns that "Using an engine plan file across different models of devices
is not recommended and is likely to affect performance or even cause errors" (an INT8 engine built
on an AGX Orin 64GB failed on an Orin NX 16GB with "Cask unknown internal error"): one engine per
(module SKU, JetPack), reference targets-thermal.md §3, "Engine portability". The module is the
board's target profile (``orin-nx-16gb``: the device-tree model, sized by MemTotal), or the
device-tree model itself for a Jetson no profile matches. Engines written before the module was
recorded (``engine.json`` format 1, a key without it) are refused by name on a board whose module
is known, and rebuilt.

The directory appears complete or not at all (written beside it, flushed to the disk, then
renamed), so the deploy probe never mistakes a half-written build for a cached engine, even after
a power cut.

Build choices (TensorRT developer guide sections):

* The ONNX graph is parsed with ``OnnxParser.parse_from_file`` ("Importing a Model Using the
  ONNX Parser"), which also reads the graph's external weight file next to it.
* Precision ("Strongly Typed Networks", "Explicit Quantization", and the 10.x -> 11.x migration
  guide). TensorRT >= 11 only builds strongly typed networks and has no FP16/INT8 builder flags:
  the ONNX types decide, INT8 where the graph has Q/DQ pairs. On TensorRT 8.5-10 the network is
  *weakly* typed unless the graph itself is half precision (or ``--strongly-typed``): our graphs
  are float32 outside the Q/DQ pairs, and strong typing would pin norms, attention and the head
  to float32, whereas with the FP16 flag (when the profile lists fp16) TensorRT may run them in
  half precision on the tensor cores. The INT8 flag is set for a Q/DQ graph, as explicit
  quantization on a weakly typed network expects (the ONNX Runtime TensorRT EP does the same:
  strong typing only when neither FP16 nor INT8 is enabled).
* ``SPARSE_WEIGHTS`` when the profile's sparsity list has "2:4" ("Structured Sparsity"); it
  only changes kernels for weights that are 2:4 sparse.
* One optimization profile ("Optimization Profiles", "Working with Dynamic Shapes"): batch 1;
  ``seq`` 1 / 1 / max_seq (decode is the hot path, prefill is chunked by max_seq); ``past_seq``
  0 / max_context // 2 / max_context - 1; ``num_logits_to_keep`` is a shape tensor (it feeds a
  Slice), so its *values* get a range, 1 / 1 / max_seq ("Execution Tensors vs. Shape Tensors").
  Zero-length past tensors are empty tensors ("Empty Tensors").
* A timing cache per TensorRT version and SM ("Timing Cache"), shared by the builds of every
  bundle, under ``$EDGESDK_CACHE/tensorrt/``.
* ``build_serialized_network`` gives the plan; nothing is deserialized at build time.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path

from edgesdk.errors import RuntimeBackendError
from edgesdk.hashing import sha256_file
from edgesdk.models.sources import cache_dir

ENGINE_FILE = "engine.plan"
INFO_FILE = "engine.json"
ENGINE_DIR_ENV = "EDGESDK_ENGINE_DIR"  # an explicit directory holding engine.plan (+ engine.json)
QDQ_DTYPE = "int8-qdq"  # GraphSpec.dtype of export/qdq_graph.py
DEFAULT_MAX_SEQ = 512  # longest prefill chunk the profile allows; bounds activation memory
DEFAULT_WORKSPACE_MB = 1024  # TensorRT's default is all device memory, shared with the OS on a Jetson
MIN_TENSORRT = (8, 5)  # name-based tensor API, set_input_shape, execute_async_v3
INFO_FORMAT = 2  # 2: records the module the engine was built on

JETSON_TENSORRT = ("sudo apt install python3-libnvinfer (JetPack's bindings for the system Python 3.10; a virtual "
                   "environment sees them only with --system-site-packages)")
TENSORRT_FIX = f"on a Jetson: {JETSON_TENSORRT}; on an x86 machine with an NVIDIA GPU: pip install tensorrt"


def tensorrt_fix(target: dict | None = None, bundle: Path | str | None = None) -> str:
    """How to get TensorRT for the engine of a bundle built for ``target`` (its manifest's target record; None: any
    bundle). An engine runs only on the GPU and module that built it (module docstring), so a Jetson bundle's engine is
    built on the Jetson, never on an x86 machine; the x86 advice is for a target that is itself a machine with a GPU."""
    target = target if isinstance(target, dict) else {}
    name = target.get("name") or "the board"
    build = f"edgesdk engine build {shlex.quote(str(bundle))}" if bundle is not None else "edgesdk engine build BUNDLE"
    if target.get("family") == "jetson":
        return (f"build the engine on the {name} itself (an engine is tied to the GPU's SM and the Jetson module that "
                f"built it: one built on an x86 GPU or another Jetson module does not run on the {name}): 'edgesdk "
                f"deploy' builds it there, or run '{build}' on the {name}, where TensorRT comes with JetPack: "
                f"{JETSON_TENSORRT}")
    if target and not target.get("gpu"):
        return (f"the bundle's target {name} has no NVIDIA GPU (its profile has no gpu section), so no TensorRT "
                f"engine runs it: run it with ONNX Runtime (edgesdk run), or build the model for a Jetson target "
                f"(--target orin-nx-16gb, ...) and build that bundle's engine on the Jetson")
    if target:
        return f"on the {name} (the machine with the NVIDIA GPU that runs the engine): pip install tensorrt"
    return TENSORRT_FIX


# --- where engines live ------------------------------------------------------------------------


def _clean(text) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in str(text))


def cache_key(jetpack: str | None, tensorrt: str | None, sm: int | str | None, module: str | None = None) -> str:
    """``jp6.2-trt10.3.0-sm87-orin-nx-16gb``: what an engine is valid for (module docstring). Without a
    module (a machine that cannot tell its own) the key is ``jp6.2-trt10.3.0-sm87``."""
    key = f"jp{_clean(jetpack or 'unknown')}-trt{_clean(tensorrt or 'unknown')}-sm{_clean(sm or 'unknown')}"
    return f"{key}-{_clean(module)}" if module else key


def engine_module(board) -> str | None:
    """The module an engine built on ``board`` (an :class:`edgesdk.board.BoardInfo`) is tied to: its target
    profile name on a Jetson (``orin-nano-8gb``: the device-tree model, sized by MemTotal), else the cleaned
    device-tree model of a Jetson no profile matches; None where the board cannot be told (not a Jetson, or a
    container that hides the device tree)."""
    if board.family != "jetson":
        return None
    if board.suggested_target:
        return board.suggested_target
    model = (board.model or "").strip().strip("\x00").strip()
    return _clean(model.replace(" ", "-")) if model else None


def engine_bases(bundle_path: Path, bundle_id: str) -> list[Path]:
    """The ``engines/<bundle-id>`` directories for a bundle, most specific first.

    A bundle deployed as ``<root>/releases/<id>`` (or reached through ``<root>/current``) has its
    engines in ``<root>/engines/<id>`` (edgesdk/deploy/board_common.py); every bundle may also
    have them in the user cache.
    """
    bases = []
    resolved = Path(bundle_path).resolve()
    if resolved.parent.name == "releases":
        bases.append(resolved.parent.parent / "engines" / bundle_id)
    bases.append(cache_dir() / "engines" / bundle_id)
    return list(dict.fromkeys(bases))


def default_out(bundle_path: Path, bundle_id: str, key: str) -> Path:
    """Where ``edgesdk engine build`` writes without ``--out``."""
    return engine_bases(bundle_path, bundle_id)[0] / key


def read_info(directory: Path) -> dict:
    """``engine.json`` of an engine directory, or {} when absent, unreadable or not an object."""
    try:
        info = json.loads((Path(directory) / INFO_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _mismatch(directory: Path, info: dict, bundle_id: str, tensorrt: str, sm: int,
              module: str | None = None) -> str | None:
    """Why the engine in ``directory`` (described by ``info``) cannot run here, or None when it can.

    ``module`` is this board's (:func:`engine_module`); where it is None (this machine cannot tell) the
    engine's module is not checked, as the JetPack is not where /etc/nv_tegra_release is missing.

    The plan is checked against the size and sha256 its ``engine.json`` recorded, as a bundle's
    files are against its manifest: a damaged plan either fails to deserialize or runs wrong weights.
    """
    if not info:
        return f"it has no readable {INFO_FILE}"
    if info.get("bundle_id") != bundle_id:
        return f"it was built for bundle {info.get('bundle_id')}, not {bundle_id}"
    if str(info.get("tensorrt")) != str(tensorrt):
        return f"it was built by TensorRT {info.get('tensorrt')}, this is TensorRT {tensorrt}"
    if str(info.get("sm")) != str(sm):
        return f"it was built for sm_{info.get('sm')}, this GPU is sm_{sm}"
    if module is not None and info.get("module") != module:
        if info.get("module") is None and isinstance(info.get("format"), int) and info["format"] >= INFO_FORMAT:
            # format 2 records the module; None means the builder could not tell its own (no device-tree model,
            # as in a container that hides /proc/device-tree), not an engine from before modules were recorded
            return (f"it was built where the module could not be told (its {INFO_FILE} records none: no device-tree "
                    f"model there, as in a container that hides /proc/device-tree, or a GPU whose name an older edgesdk "
                    f"did not record), and engines are not to be shared across modules or GPU models of one SM; this "
                    f"board is {module}")
        if info.get("module") is None:
            return (f"it does not record the module it was built on (an engine.json of format "
                    f"{info.get('format', '?')}, before edgesdk keyed engines by module), and engines are not to be "
                    f"shared across modules of one SM; this board is {module}")
        return (f"it was built on {info.get('module')}, this board is {module} (same sm_{sm}, but TensorRT engines "
                "are not to be shared across device models)")
    plan = Path(directory) / ENGINE_FILE
    size = plan.stat().st_size
    recorded = info.get("engine_bytes")
    if recorded is not None and size != recorded:
        shown = f"{recorded:,}" if isinstance(recorded, int) else repr(recorded)
        return f"its {ENGINE_FILE} is damaged ({size:,} bytes, {INFO_FILE} says {shown})"
    if info.get("engine_sha256") is not None and sha256_file(plan) != info["engine_sha256"]:
        return f"its {ENGINE_FILE} is damaged (sha256 differs from {INFO_FILE})"
    return None


def find_engine(bundle_path: Path, bundle_id: str, tensorrt: str, sm: int, jetpack: str | None,
                module: str | None = None) -> tuple[Path, dict]:
    """The engine directory for this bundle, TensorRT version, SM and module, with its ``engine.json``.

    ``module`` is this board's (:func:`engine_module`); None asks :func:`board_module`.
    ``$EDGESDK_ENGINE_DIR`` names the directory outright. Otherwise the exact cache key is tried
    under each of :func:`engine_bases`, then any sibling directory whose ``engine.json`` matches
    (the JetPack part of the key comes from /etc/nv_tegra_release, which a container may lack).
    """
    if module is None:
        module = board_module()
    explicit = os.environ.get(ENGINE_DIR_ENV)
    build = f"edgesdk engine build {bundle_path}"
    build_hint = f"build one with '{build}'"
    if explicit:
        directory = Path(explicit)
        if not (directory / ENGINE_FILE).is_file():
            raise RuntimeBackendError(f"${ENGINE_DIR_ENV}={explicit} holds no {ENGINE_FILE}",
                                      f"build one there with '{build} --out {explicit}', or unset ${ENGINE_DIR_ENV}")
        info = read_info(directory)
        why = _mismatch(directory, info, bundle_id, tensorrt, sm, module)
        if why:
            raise RuntimeBackendError(f"the engine in ${ENGINE_DIR_ENV}={explicit} does not fit: {why}",
                                      f"rebuild it there with '{build} --out {explicit} --force', or unset "
                                      f"${ENGINE_DIR_ENV} (or point it at this bundle's engine directory)")
        return directory, info
    key = cache_key(jetpack, tensorrt, sm, module)
    bases = engine_bases(bundle_path, bundle_id)
    rejected = []
    for base in bases:
        if (base / key / ENGINE_FILE).is_file():
            info = read_info(base / key)
            why = _mismatch(base / key, info, bundle_id, tensorrt, sm, module)
            if why is None:
                return base / key, info
            rejected.append(f"{base / key} ({why})")
    for base in bases:
        for directory in sorted(p for p in base.glob("*") if p.is_dir() and p.name not in (key, "ort-trt")
                                and not p.name.startswith(".")):
            if (directory / ENGINE_FILE).is_file():
                info = read_info(directory)
                why = _mismatch(directory, info, bundle_id, tensorrt, sm, module)
                if why is None:
                    return directory, info
                if module is not None and info.get("tensorrt") == tensorrt and str(info.get("sm")) == str(sm) \
                        and info.get("bundle_id") == bundle_id:  # fits but for its module: say so
                    rejected.append(f"{directory} ({why})")
    looked = " or ".join(str(base / key) for base in bases)
    on = f", {module}" if module else ""
    problem = f"no TensorRT engine for bundle {bundle_id} (TensorRT {tensorrt}, sm_{sm}{on}) in {looked}"
    if rejected:
        problem += "; rejected " + "; ".join(rejected)
    raise RuntimeBackendError(problem, f"{build_hint} (deploy builds it on a Jetson), or set ${ENGINE_DIR_ENV}")


# --- TensorRT and the GPU ----------------------------------------------------------------------


def import_tensorrt(target: dict | None = None, bundle: Path | str | None = None):
    """The ``tensorrt`` module, or a RuntimeBackendError saying what is missing and how to get it; ``target`` (the
    manifest's target record of the bundle whose engine is wanted, at ``bundle``) picks the fix
    (:func:`tensorrt_fix`)."""
    python = f"Python {sys.version_info.major}.{sys.version_info.minor} ({sys.executable})"
    fix = tensorrt_fix(target, bundle)
    try:
        import tensorrt
    except ImportError as exc:
        raise RuntimeBackendError(f"TensorRT's Python module 'tensorrt' cannot be imported by {python}: {exc}",
                                  fix) from exc
    if not hasattr(tensorrt, "__version__"):  # a directory named tensorrt on sys.path imports as a namespace package
        where = ", ".join(getattr(tensorrt, "__path__", None) or [str(getattr(tensorrt, "__file__", "?"))])
        raise RuntimeBackendError(f"the 'tensorrt' that {python} imports ({where}) is not TensorRT's Python module "
                                  "(it has no __version__)", f"rename or move that directory; then {fix}")
    version = tuple(int(part) for part in tensorrt.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_TENSORRT:
        raise RuntimeBackendError(
            f"TensorRT {tensorrt.__version__} on {python} is older than "
            f"{'.'.join(map(str, MIN_TENSORRT))} (the name-based tensor API and execute_async_v3)",
            newer_tensorrt_fix(target, bundle),
        )
    return tensorrt


def newer_tensorrt_fix(target: dict | None = None, bundle: Path | str | None = None) -> str:
    """How to get a TensorRT of at least MIN_TENSORRT for a bundle built for ``target`` (as :func:`tensorrt_fix`): a
    Jetson's comes with JetPack (pip's tensorrt wheels are not built for it), an x86 GPU machine's from pip."""
    target = target if isinstance(target, dict) else {}
    name = f"the {target['name']}" if target.get("name") else "the board"
    jetson = (f"flash {name if target.get('name') else 'the Jetson'} with JetPack 6 (TensorRT 10; JetPack 5.1's "
              f"TensorRT {'.'.join(map(str, MIN_TENSORRT))} is the oldest that runs engines here), then {JETSON_TENSORRT}")
    pip = "pip install --upgrade 'tensorrt>=10'"
    if target.get("family") == "jetson":
        return jetson
    if target and not target.get("gpu"):
        return tensorrt_fix(target, bundle)
    if target:
        return f"on {name} (the machine with the NVIDIA GPU that runs the engine): {pip}"
    return f"on a Jetson: {jetson}; on an x86 machine with an NVIDIA GPU: {pip}"


_SEVERITY_LETTERS = "FEWIV"  # TensorRT's severities in order: internal error, error, warning, info, verbose
_STDERR_LOGGERS: dict[type, object] = {}  # one per tensorrt module (its ILogger): TensorRT keeps one per process


def stderr_logger(trt):
    """A TensorRT logger that writes warnings and errors to stderr, as ``[TRT] [W] message``, the default
    ``trt.Logger``'s form. The default writes to stdout, though its docs say stderr (NVIDIA/TensorRT#4306, confirmed
    by NVIDIA): on stdout its warnings would land in the answer ``edgesdk run`` writes there and in the text the
    deploy smoke test reads. The same logger serves the builder and the runtime, as TensorRT keeps one per process
    (a second one is refused with a warning)."""
    logger = _STDERR_LOGGERS.get(trt.ILogger)
    if logger is None:
        class StderrLogger(trt.ILogger):
            def __init__(self):
                trt.ILogger.__init__(self)

            def log(self, severity, msg):
                level = int(severity)
                if level <= int(trt.ILogger.Severity.WARNING):
                    letter = _SEVERITY_LETTERS[level] if 0 <= level < len(_SEVERITY_LETTERS) else "?"
                    print(f"[TRT] [{letter}] {msg}", file=sys.stderr, flush=True)

        logger = _STDERR_LOGGERS[trt.ILogger] = StderrLogger()
    return logger


def tensorrt_major(version: str) -> int:
    return int(str(version).split(".")[0])


def _cudart():
    """libcudart through ctypes (no Python package needed), or None."""
    import ctypes
    import ctypes.util

    names = [ctypes.util.find_library("cudart"), "libcudart.so", "libcudart.so.12", "libcudart.so.11.0",
             "/usr/local/cuda/lib64/libcudart.so"]
    for name in filter(None, names):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cuda_device_sm(device: int = 0) -> tuple[int | None, str]:
    """Compute capability of a CUDA device as ``87``, and how it was found (or why it was not)."""
    import ctypes

    lib = _cudart()
    if lib is not None:
        count = ctypes.c_int(0)
        error = lib.cudaGetDeviceCount(ctypes.byref(count))
        if error != 0:  # no driver, one older than this runtime, no device: the runtime's own words say which
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            text = (lib.cudaGetErrorString(error) or b"").decode(errors="replace") or "unknown error"
            return None, f"the CUDA runtime {getattr(lib, '_name', 'libcudart')} reports: {text} (error {error})"
        if count.value <= device:
            return None, f"the CUDA runtime sees {count.value} CUDA device(s), not device {device}"
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        # cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76 (CUDA runtime API, enum cudaDeviceAttr)
        if lib.cudaDeviceGetAttribute(ctypes.byref(major), 75, device) == 0 and \
                lib.cudaDeviceGetAttribute(ctypes.byref(minor), 76, device) == 0:
            return major.value * 10 + minor.value, "libcudart"
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart
        except ImportError:
            cudart = None
    if cudart is not None:
        err, prop = cudart.cudaGetDeviceProperties(device)
        if err == cudart.cudaError_t.cudaSuccess:
            return prop.major * 10 + prop.minor, "cuda-python"
        return None, f"cuda-python: {err}"
    try:
        import torch
    except ImportError:
        return None, "neither libcudart, cuda-python nor torch is available to query the GPU"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor, "torch"


def require_sm(target: dict | None = None, bundle: Path | str | None = None) -> int:
    """This machine's CUDA compute capability, or a RuntimeBackendError; ``target`` and ``bundle`` as for
    :func:`import_tensorrt`."""
    sm, how = cuda_device_sm()
    if sm is None:
        check = ("check CUDA_VISIBLE_DEVICES, and that the CUDA runtime is installed and no newer than the driver "
                 "(JetPack's own CUDA)")
        if isinstance(target, dict) and target:
            fix = f"{tensorrt_fix(target, bundle)}; on a machine with the GPU, {check}"
        else:
            fix = f"build and run TensorRT engines on the board itself (engines are tied to its GPU); {check}"
        raise RuntimeBackendError(f"no CUDA device is usable here ({how})", fix)
    return sm


def board_jetpack() -> str | None:
    from edgesdk.board import detect_board

    return detect_board().jetpack


def board_module() -> str | None:
    """This board's module for the engine key (:func:`engine_module`), or None. On a machine that is not a
    Jetson it is the CUDA device's name (``NVIDIA-GeForce-RTX-4090``): an engine is specific to the GPU model
    it was built on, not only to its compute capability (an RTX 4090 and an L40 are both sm_89), unless it was
    built with hardware compatibility (TensorRT developer guide, "Hardware Compatibility": "By default,
    TensorRT engines are compatible only with the type of device where they were built"), which this
    builder does not ask for."""
    from edgesdk.board import detect_board

    board = detect_board()
    module = engine_module(board)
    if module is None and board.family != "jetson":
        name = cuda_device_name()
        module = gpu_module(name) if name else None
    return module


def gpu_module(name: str) -> str:
    """The engine key's module for a discrete GPU named ``name`` (cudaDeviceProp.name)."""
    return _clean(name.strip().replace(" ", "-"))


def cuda_device_name(device: int = 0) -> str | None:
    """The CUDA device's name (``cudaDeviceProp.name``, e.g. "NVIDIA GeForce RTX 4090"), or None where no
    CUDA runtime answers. ``name`` is the first member of cudaDeviceProp (char[256]) in every CUDA version,
    so the struct is read into a buffer larger than any version's struct (about 1 KB)."""
    import ctypes

    lib = _cudart()
    if lib is not None:
        props = ctypes.create_string_buffer(16384)
        get = getattr(lib, "cudaGetDeviceProperties_v2", None) or getattr(lib, "cudaGetDeviceProperties", None)
        if get is not None and get(props, device) == 0:
            name = props.raw[:256].split(b"\0", 1)[0].decode("utf-8", "replace").strip()
            if name:
                return name
    try:
        import torch
    except ImportError:
        return None
    try:
        return torch.cuda.get_device_name(device) if torch.cuda.is_available() else None
    except (RuntimeError, AssertionError):
        return None


# --- what to build -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileShapes:
    """The optimization profile: min/opt/max of every dynamic input, from the manifest's graph facts."""

    shapes: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # execution inputs
    values: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]  # shape-tensor inputs
    max_seq: int
    max_context: int

    def to_json(self) -> dict:
        pack = lambda triple: dict(zip(("min", "opt", "max"), (list(t) for t in triple), strict=True))  # noqa: E731
        return {"shapes": {name: pack(t) for name, t in self.shapes.items()},
                "values": {name: pack(t) for name, t in self.values.items()},
                "max_seq": self.max_seq, "max_context": self.max_context}


def io_names(graph: dict) -> dict:
    """Input and output names of the standard graph (export/llama_graph.py ``GraphSpec.to_json``)."""
    inputs, outputs = graph.get("inputs") or {}, graph.get("outputs") or {}
    past = inputs.get("past", "past_key_values.{i}.{kind}")
    present = outputs.get("present", "present.{i}.{kind}")
    layers = range(len(graph["kv_heads"]))
    return {"ids": inputs.get("ids", "input_ids"), "keep": inputs.get("keep", "num_logits_to_keep"),
            "logits": outputs.get("logits", "logits"),
            "past": [past.format(i=i, kind=kind) for i in layers for kind in ("key", "value")],
            "present": [present.format(i=i, kind=kind) for i in layers for kind in ("key", "value")]}


def profile_shapes(graph: dict, max_seq: int | None = None) -> ProfileShapes:
    """min / opt / max for ``seq`` and ``past_seq`` (see the module docstring) from ``max_context``. ``max_seq``
    defaults to min(512, max_context); one above max_context is refused (no chunk of a prompt can be longer than
    the context), as TensorRT refuses a shape outside a profile, rather than cut to it without a word. So is one that is
    no whole number of at least 1 (``--max-seq``'s own range), rather than read as the default (0), as 1 (-3) or cut
    (2.5)."""
    max_context = int(graph["max_context"])
    if max_seq is not None and (isinstance(max_seq, bool) or not isinstance(max_seq, Integral)
                                or max_seq < 1):
        raise RuntimeBackendError(
            f"max_seq={max_seq!r}: expected a whole number of at least 1 (the longest prefill chunk the engine's "
            "profile allows)", f"pass max_seq=1 to {max_context}, or None for min({DEFAULT_MAX_SEQ}, max_context)")
    if max_seq and int(max_seq) > max_context:
        raise RuntimeBackendError(
            f"--max-seq {max_seq} is more than the bundle's max_context {max_context}: no prefill chunk can be "
            "longer than the context", f"pass --max-seq {max_context} or less, or leave it out for "
            f"min({DEFAULT_MAX_SEQ}, max_context)")
    seq_max = max(1, min(max_context, int(max_seq or DEFAULT_MAX_SEQ)))
    past_max = max(0, max_context - 1)
    past_opt = min(past_max, max_context // 2)
    names = io_names(graph)
    head_dim = int(graph["head_dim"])
    shapes = {names["ids"]: ((1, 1), (1, 1), (1, seq_max))}
    for name, kv in zip(names["past"], [kv for kv in graph["kv_heads"] for _ in range(2)], strict=True):
        shapes[name] = ((1, int(kv), 0, head_dim), (1, int(kv), past_opt, head_dim), (1, int(kv), past_max, head_dim))
    values = {names["keep"]: ((1,), (1,), (seq_max,))}
    return ProfileShapes(shapes=shapes, values=values, max_seq=seq_max, max_context=max_context)


def ort_profile_options(shapes: ProfileShapes) -> dict[str, str]:
    """``shapes`` as ONNX Runtime's TensorRT execution provider takes an explicit optimization profile: its
    ``trt_profile_min_shapes``, ``trt_profile_opt_shapes`` and ``trt_profile_max_shapes`` options, each
    ``name:1x3x0x64,name:...`` (a shape tensor's values written as its shape).

    Without them the EP makes the profile from the shapes it has seen and rebuilds the engine whenever an input
    falls outside it (onnxruntime's tensorrt_execution_provider.cc, ``ApplyProfileShapesFromInputTensorValue``:
    "Update maximum dimension" sets ``engine_update``): a decoder's past grows by one token at every step, so every
    decode step built (and with the engine cache, wrote) a new engine."""
    ranges = {**shapes.shapes, **shapes.values}
    return {f"trt_profile_{bound}_shapes": ",".join(f"{name}:{'x'.join(map(str, triple[index]))}"
                                                    for name, triple in ranges.items())
            for index, bound in enumerate(("min", "opt", "max"))}


@dataclass(frozen=True)
class BuildPlan:
    """Network typing and builder flags (``BuilderFlag`` member names), each with its reason."""

    strongly_typed: bool
    flags: tuple[str, ...]
    reasons: tuple[str, ...] = field(default=())


def plan_build(tensorrt_version: str, graph: dict, target: dict, strongly_typed: bool | None = None) -> BuildPlan:
    """Typing and flags for this TensorRT version, graph and target profile (module docstring)."""
    major = tensorrt_major(tensorrt_version)
    qdq = graph.get("dtype") == QDQ_DTYPE
    flags: list[str] = []
    reasons: list[str] = []
    if major >= 11:
        strong = True
        reasons.append(f"strongly typed: TensorRT {tensorrt_version} builds only strongly typed networks; the ONNX "
                       "types decide (INT8 inside the Q/DQ pairs, the graph's float type elsewhere)")
    elif strongly_typed and major < 9:
        raise RuntimeBackendError(
            f"--strongly-typed needs TensorRT >= 9 (strongly typed networks); this is TensorRT {tensorrt_version}",
            "drop --strongly-typed: the build then uses weak typing with the INT8/FP16 flags the graph and profile ask for")
    elif graph.get("dtype") in ("float16", "bfloat16") and major < 9:
        if graph.get("dtype") == "bfloat16":
            raise RuntimeBackendError(
                f"the graph is bfloat16, which TensorRT {tensorrt_version} cannot build (bfloat16 came with TensorRT 9)",
                "rebuild the bundle with float16 or float32 weights, or use a JetPack with TensorRT >= 9")
        strong = False
        flags.append("FP16")
        reasons.append(f"weakly typed with FP16: TensorRT {tensorrt_version} has no strongly typed networks (9+), so "
                       "the FP16 flag keeps the float16 graph's layers in half precision")
    elif strongly_typed or graph.get("dtype") in ("float16", "bfloat16"):
        strong = True
        reasons.append("strongly typed: " + ("requested (--strongly-typed)" if strongly_typed else
                                             f"the graph is {graph.get('dtype')} already"))
    else:
        strong = False
        # a Q/DQ graph's dtype names its quantization ("int8-qdq"); its tensors outside the pairs are float32
        outside = "float32" if qdq else graph.get("dtype") or "float32"
        reasons.append(f"weakly typed: the graph is {outside}" + (" outside its Q/DQ pairs" if qdq else "") +
                       "; strong typing would keep every non-quantized layer in float32")
        if qdq:
            flags.append("INT8")
            reasons.append("INT8: the graph is explicitly quantized (Q/DQ pairs on the decoder linears)")
        if "fp16" in (target.get("precisions") or ()):
            flags.append("FP16")
            reasons.append(f"FP16: profile {target.get('name')} lists fp16; layers outside the Q/DQ pairs may run in "
                           "half precision")
    if "2:4" in (target.get("sparsity") or ()):
        flags.append("SPARSE_WEIGHTS")
        reasons.append(f"SPARSE_WEIGHTS: profile {target.get('name')} lists 2:4 sparsity (sparse tensor cores)")
    return BuildPlan(strongly_typed=strong, flags=tuple(flags), reasons=tuple(reasons))


def check_graph_form(graph: dict, what: str = "TensorRT") -> None:
    """TensorRT parses standard ONNX ops only; the fused forms use ONNX Runtime contrib ops."""
    form = graph.get("form", "standard")
    if form != "standard":
        raise RuntimeBackendError(
            f"{what} needs the standard graph form, this bundle's graph is '{form}' (ONNX Runtime contrib ops)",
            "build the bundle with a standard-form recipe for TensorRT: --recipe int8-qdq (or fp32-standard)",
        )


# --- the build ---------------------------------------------------------------------------------


def _dims(dims) -> list[int]:
    return [int(d) for d in dims]


def _dtype_name(dtype) -> str:
    return str(getattr(dtype, "name", dtype)).lower()


def _timing_cache_path(tensorrt_version: str, sm: int, module: str | None = None) -> Path:
    """Tactic timings are measured on this module's clocks and SM count: one cache per module too."""
    return cache_dir() / "tensorrt" / f"timing-{cache_key(None, tensorrt_version, sm, module).split('-', 1)[1]}.cache"


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _parse(trt, network, logger, model: Path):
    """Fill ``network`` from the ONNX graph at ``model``; returns the parser, which the caller keeps until the
    engine is built: the network points into weights the parser owns (TensorRT developer guide, "Importing a Model
    Using the ONNX Parser": the parser is not to be deleted before the builder has run), and the Python object frees
    them when its last reference goes."""
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(model)):
        # onnx-tensorrt records no IParserError when the file itself cannot be read or decoded (ModelImporter::
        # parseFromFile only logs "Failed to parse ONNX model from file"): the message then ended in ": "
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or [
            "the parser recorded no error; TensorRT's log above says why (as when it cannot read or decode the file)"]
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise RuntimeBackendError(f"TensorRT {trt.__version__} could not parse {model}: " + "; ".join(errors[:5]) + more,
                                  "check that the bundle's graph is the standard form (opset 17) and that this "
                                  "TensorRT supports its ops; 'edgesdk verify' the bundle")
    return parser


def _apply_profile(trt, builder, network, config, shapes: ProfileShapes) -> None:
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        name = tensor.name
        if tensor.is_shape_tensor:
            if name not in shapes.values:
                raise RuntimeBackendError(f"the graph's input '{name}' is a shape tensor edgesdk has no range for",
                                          "this is a bug in edgesdk's export or engine builder")
            profile.set_shape_input(name, *[list(v) for v in shapes.values[name]])
        elif name in shapes.shapes:
            profile.set_shape(name, *shapes.shapes[name])
        elif any(d < 0 for d in _dims(tensor.shape)):
            raise RuntimeBackendError(f"the graph has a dynamic input '{name}' {_dims(tensor.shape)} that the standard "
                                      "decoder interface does not have", "rebuild the bundle with this edgesdk")
    if config.add_optimization_profile(profile) < 0:  # -1: TensorRT found the profile invalid (its log says why)
        raise RuntimeBackendError(
            f"TensorRT {trt.__version__} refused the optimization profile edgesdk made for this graph "
            f"({_profile_text(shapes)}); TensorRT's log above says which input and why",
            "'edgesdk verify' the bundle (its graph must have the standard decoder inputs); if it is sound, report "
            "this with TensorRT's log: it is a bug in edgesdk's engine builder")


def _profile_text(shapes: ProfileShapes) -> str:
    """``input_ids 1x1/1x1/1x512, ...``: min/opt/max of the first inputs in ``shapes``, for an error message."""
    ranges = {**shapes.shapes, **shapes.values}
    return ", ".join(f"{name} " + "/".join("x".join(map(str, bound)) for bound in triple)
                     for name, triple in list(ranges.items())[:3]) + (", ..." if len(ranges) > 3 else "")


def _load_timing_cache(config, path: Path, log: Callable[[str], None]):
    data = b""
    if path.is_file():
        data = path.read_bytes()
    cache = config.create_timing_cache(data)  # None (some releases) or refused by set: a damaged or foreign file
    if cache is None or not config.set_timing_cache(cache, False):
        log(f"timing cache {path} does not fit this TensorRT/GPU; starting a new one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
    else:
        log(f"timing cache {path} ({len(data)} bytes)" if data else f"new timing cache {path}")


def _save_timing_cache(config, path: Path, log: Callable[[str], None]) -> None:
    """Keep the build's tactic timings for the next build; a failure costs only that, never the engine."""
    try:
        _write_atomic(path, bytes(config.get_timing_cache().serialize()))
    except OSError as exc:
        log(f"could not save the timing cache {path}: {exc.strerror or exc}; the next build times its tactics again")


def build_engine(bundle_path: Path, out: Path | None = None, workspace_mb: int = DEFAULT_WORKSPACE_MB,
                 force: bool = False, max_seq: int | None = None, strongly_typed: bool | None = None,
                 timing_cache: Path | None = None, log: Callable[[str], None] = lambda message: None) -> dict:
    """Build (or find cached) the engine of a bundle; returns its ``engine.json`` with ``path``/``cached``."""
    from edgesdk import __version__
    from edgesdk.bundle import check_runnable, verify_bundle

    bundle = verify_bundle(Path(bundle_path))  # a bundle TensorRT could never build is named first
    # the graph facts the profile is sized from, refused as 'edgesdk engine build' and run refuse them: verification
    # takes a manifest without graph.max_context (deploy and pack need none), which was a KeyError in profile_shapes
    check_runnable(bundle)
    graph = bundle.manifest["graph"]
    check_graph_form(graph)
    shapes = profile_shapes(graph, max_seq)  # a --max-seq the bundle cannot take is refused before TensorRT is asked
    trt = import_tensorrt(bundle.manifest.get("target"), bundle_path)
    sm = require_sm(bundle.manifest.get("target"), bundle_path)
    jetpack = board_jetpack()
    module = board_module()
    key = cache_key(jetpack, trt.__version__, sm, module)
    out = _absolute(out) if out else default_out(bundle.path, bundle.bundle_id, key)
    _refuse_foreign_out(out)
    plan = plan_build(trt.__version__, graph, bundle.manifest["target"], strongly_typed)
    info = read_info(out)
    if not force and (out / ENGINE_FILE).is_file():
        why = _mismatch(out, info, bundle.bundle_id, trt.__version__, sm, module) or \
            _built_otherwise(info, plan, shapes)
        if why is None:
            log(f"cached: {out / ENGINE_FILE} (built {info.get('built')}); --force rebuilds it")
            return {**info, "path": str(out / ENGINE_FILE), "cached": True}
        log(f"rebuilding {out / ENGINE_FILE}: {why}")

    _check_writable(out)  # before the minutes of the build, not after them
    for reason in plan.reasons:
        log(reason)
    started = time.monotonic()
    logger = stderr_logger(trt)
    builder = trt.Builder(logger)
    network_flags = 0
    if plan.strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        network_flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    if tensorrt_major(trt.__version__) < 10:  # always explicit batch from TensorRT 10 on (flag deprecated)
        network_flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    network = builder.create_network(network_flags)
    model = bundle.file(graph["file"])
    log(f"parsing {model}")
    parser = _parse(trt, network, logger, model)  # holds the network's weights: alive until the build is done

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb) << 20)
    for flag in plan.flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    _apply_profile(trt, builder, network, config, shapes)
    cache_path = Path(timing_cache) if timing_cache else _timing_cache_path(trt.__version__, sm, module)
    _load_timing_cache(config, cache_path, log)

    log(f"building for sm_{sm}{f' ({module})' if module else ''} with TensorRT {trt.__version__} (flags: {', '.join(plan.flags) or 'none'}, "
        f"workspace {workspace_mb} MB); this takes minutes on a Jetson")
    serialized = builder.build_serialized_network(network, config)
    del parser  # the plan holds its own copy of the weights
    if serialized is None:
        raise RuntimeBackendError(f"TensorRT {trt.__version__} failed to build an engine for {model} (see its log "
                                  "above)", "try a larger --workspace-mb, or free GPU memory (stop other services)")
    plan_bytes = bytes(serialized)
    _save_timing_cache(config, cache_path, log)

    io = {"inputs": [{"name": t.name, "shape": _dims(t.shape), "dtype": _dtype_name(t.dtype),
                      "shape_tensor": bool(t.is_shape_tensor)}
                     for t in (network.get_input(i) for i in range(network.num_inputs))],
          "outputs": [{"name": t.name, "shape": _dims(t.shape), "dtype": _dtype_name(t.dtype)}
                      for t in (network.get_output(i) for i in range(network.num_outputs))]}
    info = {"format": INFO_FORMAT, "bundle_id": bundle.bundle_id, "bundle": str(bundle.path),
            "target": bundle.target, "graph": {"form": graph.get("form", "standard"), "dtype": graph.get("dtype")},
            "tensorrt": trt.__version__, "sm": sm, "jetpack": jetpack, "module": module, "key": key,
            "built": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "build_seconds": round(time.monotonic() - started, 1),
            "strongly_typed": plan.strongly_typed, "flags": list(plan.flags), "reasons": list(plan.reasons),
            "workspace_mb": int(workspace_mb), "profile": shapes.to_json(), "io": io,
            "engine_bytes": len(plan_bytes), "engine_sha256": hashlib.sha256(plan_bytes).hexdigest(),
            "timing_cache": str(cache_path), "python": sys.version.split()[0], "edgesdk_version": __version__}
    _commit(out, plan_bytes, info)
    log(f"wrote {out / ENGINE_FILE} ({len(plan_bytes) / 1e6:.1f} MB) in {info['build_seconds']} s")
    return {**info, "path": str(out / ENGINE_FILE), "cached": False}


def _process_alive(pid: str) -> bool:
    """Whether the process ``pid`` (text) exists on this machine."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _built_otherwise(info: dict, plan: BuildPlan, shapes: ProfileShapes) -> str | None:
    """How the engine ``info`` describes differs from what this build asks for, or None."""
    built = {"strongly typed": info.get("strongly_typed"), "flags": info.get("flags"),
             "max seq": (info.get("profile") or {}).get("max_seq")}
    asked = {"strongly typed": plan.strongly_typed, "flags": list(plan.flags), "max seq": shapes.max_seq}
    differ = [f"{name} {built[name]} (asked: {asked[name]})" for name in asked if built[name] != asked[name]]
    return "it was built with " + ", ".join(differ) if differ else None


def _absolute(out: Path) -> Path:
    """``out`` as an absolute path with ``.`` and ``..`` worked out (``os.path.abspath``, links kept).

    The engine directory is written beside ``out`` and renamed onto it, which needs a name: ``--out .`` (rebuilding
    the engine of the directory one stands in) has none, and ``Path('.').with_name(...)`` raised ValueError once the
    engine was built, losing the build; ``--out engines/..`` would have been staged beside the wrong directory."""
    return Path(os.path.abspath(out))


def _check_writable(out: Path) -> None:
    """Create ``out``'s parent and try a directory beside ``out``, as :func:`_commit` will, before the build: an
    unwritable place (another user's deploy root, a read-only mount, a file where a directory is asked for) was
    found only when the engine was written, minutes later, as an OSError traceback that lost the engine."""
    probe = out.with_name(f".{out.name}.probe-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe.mkdir(exist_ok=True)  # one a killed build left: a container's build runs as the same PID each time
        probe.rmdir()
    except OSError as exc:
        raise RuntimeBackendError(f"cannot write the TensorRT engine directory {out}: {exc.strerror or exc}",
                                  "pass --out a directory this user can write (or run as the user that owns it)") \
            from exc


def _refuse_foreign_out(out: Path) -> None:
    """An existing ``out`` is replaced whole, so it may hold nothing but an engine's own files, and be a directory: a
    file there (``out=model.plan``, as trtexec's ``--saveEngine`` names the plan itself) was renamed to a hidden
    ``.model.plan.old-<pid>`` beside the engine directory put in its place, once the minutes of the build were spent."""
    if out.exists() and not out.is_dir():
        raise RuntimeBackendError(
            f"the engine directory {out} is a file; a build writes {ENGINE_FILE} and {INFO_FILE} into a directory "
            "and puts that directory in the place it names",
            f"name a directory (not the plan file itself), such as --out {out.parent / 'engine'}, or move {out.name} "
            "away first")
    foreign = sorted(p.name for p in out.iterdir() if p.name not in (ENGINE_FILE, INFO_FILE)) if out.is_dir() else []
    if foreign:
        raise RuntimeBackendError(
            f"the engine directory {out} holds files that are not an engine's ({', '.join(foreign[:5])}); "
            f"a build replaces the whole directory",
            f"name a directory of its own: --out {out / 'engine'}")


def _commit(out: Path, plan_bytes: bytes, info: dict) -> None:
    """Write engine.plan and engine.json beside ``out``, then rename the directory into place."""
    out = _absolute(out)
    _refuse_foreign_out(out)
    for pattern in (f".{out.name}.partial-*", f".{out.name}.old-*"):  # left by a build killed while writing
        for stale in out.parent.glob(pattern):                          # or while swapping the engine in
            pid = stale.name.rsplit("-", 1)[-1]
            # This process has made neither yet: one with its pid is an earlier process's (PIDs repeat after a
            # reboot, and a container's build runs as the same PID each time)
            if pid == str(os.getpid()) or not _process_alive(pid):
                shutil.rmtree(stale, ignore_errors=True)
    staging = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        (staging / ENGINE_FILE).write_bytes(plan_bytes)
        (staging / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        for written in (staging / ENGINE_FILE, staging / INFO_FILE, staging):  # on disk before the rename
            _fsync(written)                                                      # names them complete
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk keeps no half engine
        raise RuntimeBackendError(f"cannot write the TensorRT engine ({len(plan_bytes):,} bytes) into {out.parent}: "
                                  f"{exc.strerror or exc}", "free space there (or pass --out elsewhere) and build "
                                  "again") from exc
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)
    try:  # the engine is in place and whole; the flush only makes its name survive a power cut
        _fsync(out.parent)
    except OSError:
        pass


def _fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries, to the disk (a power cut keeps what was flushed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
