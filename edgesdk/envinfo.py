"""What ``edgesdk env`` prints: package versions, ONNX Runtime providers, CUDA / TensorRT presence,
the detected board, the CPU clocks (governor, current and maximum) and the thermal zones' temperatures.

Package versions come from the installed distributions' metadata (``importlib.metadata``), so
torch and transformers are never imported here; ONNX Runtime and TensorRT are imported inside
:func:`collect_env` only, to list ONNX Runtime's execution providers and check TensorRT. GPU presence is
looked for without running anything on it: ``nvidia-smi`` on PATH, the device nodes ``/dev/nvidia0`` (desktop
driver) or ``/dev/nvhost-ctrl-gpu`` (Jetson nvgpu driver) under the root, and the CUDA runtime / TensorRT
libraries the dynamic loader can find (``ctypes.util.find_library``). TensorRT counts as there only where its
Python module imports and creates a builder (as jetson-containers' TensorRT test and trtexec do): an installed
package or a library found says nothing of a GPU it can build for. That check is no cheap one: the builder is
made on the GPU in a Python of its own (:func:`tensorrt_check`), given up to ``BUILDER_CHECK_TIMEOUT_S`` (120 s).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import edgesdk
from edgesdk.board import detect_board

# shown name -> distribution names to try, in order (the first one installed wins)
PACKAGES: dict[str, tuple[str, ...]] = {
    "numpy": ("numpy",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tokenizers": ("tokenizers",),
    "torch": ("torch",),
    "transformers": ("transformers",),
    "onnx": ("onnx",),
    "triton": ("triton",),
    # pip's TensorRT: the "tensorrt" meta package, or one CUDA line's package installed without it (TensorRT's pip
    # install guide: tensorrt-cu13, what the meta package picks in recent releases, tensorrt-cu12, tensorrt-cu11)
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11"),
}

# shown names whose distributions install one and the same import package: two of them installed together overwrite
# each other's files, and the one installed last decides what runs (ONNX Runtime: onnxruntime installed beside
# onnxruntime-gpu leaves only the CPU provider, microsoft/onnxruntime#6183, #26996)
SHARED_IMPORT_PACKAGE = frozenset({"onnxruntime"})

NOT_INSTALLED = "not installed"
# nvgpu's uapi header (include/uapi/linux/nvgpu-ctrl.h): "Legacy node: /dev/nvhost-ctrl-gpu device, New hierarchy:
# /dev/nvgpu/igpu0/ctrl"; a kernel that creates only the new one (the out-of-tree nvgpu on a newer kernel) has a GPU too
GPU_DEVICE_NODES = ("dev/nvidia0", "dev/nvhost-ctrl-gpu", "dev/nvgpu/igpu0/ctrl")


def _metadata_version(dist: metadata.Distribution) -> str | None:
    """The version a distribution's metadata holds, or None where it holds none: a ``.dist-info`` folder left
    without its METADATA file (a pip install or uninstall cut short) reads as None, or KeyError on the Pythons whose
    metadata raises for a missing field."""
    try:
        return dist.version or None
    except KeyError:
        return None


def package_version(*distributions: str) -> str:
    """Version of the first installed distribution among ``distributions``, else "not installed".

    An installed copy whose metadata holds no version is passed over for a later one that does; where none does, the
    package is shown as installed without a version, with the fix, rather than as None (``metadata.version``'s
    answer), which ``env`` printed as "-", as a package not installed, and ``--json`` as null."""
    broken = None
    for name in distributions:
        for dist in metadata.distributions(name=name):
            version = _metadata_version(dist)
            if version is not None:
                return version if name == distributions[0] else f"{version} ({name})"
            broken = broken or name
    if broken is not None:
        return (f"installed, version unknown ({broken}'s metadata holds none, a pip install or uninstall cut short; "
                f"pip install --force-reinstall {broken})")
    return NOT_INSTALLED


def shared_package_conflict(*distributions: str) -> str | None:
    """A sentence naming every one of ``distributions`` (which install the same import package) installed, with
    the fix: only one of them may be, and the first one's version alone hid the clash; None when at most one is."""
    installed = [f"{name} {package_version(name)}" for name in distributions if package_version(name) != NOT_INSTALLED]
    if len(installed) < 2:
        return None
    return (f"{', '.join(installed[:-1])} and {installed[-1]} are installed together: they overwrite each other's "
            "files (pip uninstall all of them, then install the one this machine needs)")


def _ort_providers() -> tuple[list[str], str | None]:
    """ONNX Runtime's execution providers, or none and why. A module that imports but cannot list them is an install
    left incomplete (one of onnxruntime / onnxruntime-gpu uninstalled after both were installed takes the shared
    ``__init__.py`` with it, microsoft/onnxruntime#6183): the report names where it was imported from and the fix,
    where an AttributeError ended ``env`` itself, on the machine whose report was wanted."""
    try:
        import onnxruntime
    except Exception as exc:  # ImportError, or OSError from a missing shared library
        return [], f"{type(exc).__name__}: {exc}"
    try:
        return [str(name) for name in onnxruntime.get_available_providers()], None
    except Exception as exc:  # AttributeError from a partial install, or the library's own error
        where = getattr(onnxruntime, "__file__", None) or ", ".join(getattr(onnxruntime, "__path__", None) or [])
        return [], (f"{type(exc).__name__}: {exc} (the onnxruntime imported from {where or '?'} cannot list its "
                    "execution providers: an install left incomplete; pip uninstall onnxruntime onnxruntime-gpu, "
                    "then pip install the one this machine needs)")


# Run by tensorrt_check in a Python of its own, with the caller's sys.path (argv[1]): TensorRT keeps the first logger
# a builder or runtime is given for the whole process (tensorrt_engine.stderr_logger), so one made for this check
# and dropped would be the one a later engine build in the caller's process logs through. Prints one JSON line:
# {"builder": created or not, "messages": TensorRT's errors and the exception where none was created}.
BUILDER_CHECK = r"""
import json, sys
sys.path[:] = json.loads(sys.argv[1])
import tensorrt as trt
messages = []


class Collect(trt.ILogger):
    def __init__(self):
        trt.ILogger.__init__(self)

    def log(self, severity, msg):
        if int(severity) <= int(trt.ILogger.Severity.ERROR):
            messages.append(str(msg).strip())


try:
    builder = trt.Builder(Collect())
except Exception as exc:  # pybind11's TypeError for the null builder TensorRT gives without a CUDA device
    messages.append(type(exc).__name__ + ": " + str(exc))
    builder = None
sys.stdout.write("\n" + json.dumps({"builder": builder is not None, "messages": messages}) + "\n")
"""
BUILDER_CHECK_TIMEOUT_S = 120  # a Jetson's first CUDA start takes seconds; a GPU that hangs takes forever


def tensorrt_check(package: str, libnvinfer: str | None) -> tuple[bool, str]:
    """Whether TensorRT runs here, and what was found, in words: its Python module imported (its version and
    file), and whether ``trt.Builder`` could be created on this machine's GPU, with TensorRT's own errors where it
    could not. The builder is made in a Python of its own (BUILDER_CHECK), so this process's TensorRT is given no
    logger. ``package``: the installed distribution's version (:func:`package_version`), ``libnvinfer``: the
    library the dynamic loader finds, both shown where the module does not import."""
    from edgesdk.errors import RuntimeBackendError
    from edgesdk.runtime.tensorrt_engine import import_tensorrt

    try:
        trt = import_tensorrt()
    except RuntimeBackendError as exc:
        library = f"libnvinfer found ({libnvinfer})" if libnvinfer else "no libnvinfer found"
        if package == NOT_INSTALLED and not libnvinfer:
            return False, "not found: no tensorrt Python package, no libnvinfer"
        return False, (f"not usable: package {package}, {library}, but {exc.problem} (fix: {exc.fix})")
    found = f"Python module {trt.__version__} ({getattr(trt, '__file__', None) or '?'})"
    argv = [sys.executable, "-c", BUILDER_CHECK, json.dumps(sys.path)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=BUILDER_CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, (f"{found}, but creating a builder did not finish in {BUILDER_CHECK_TIMEOUT_S} s (a GPU "
                       "that does not answer?)")
    except OSError as exc:
        return False, f"{found}, but the builder check could not start {sys.executable!r} ({exc})"
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    try:
        answer = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("messages"), list):
        said = proc.stderr.strip()[-400:] or "no error"
        return False, (f"{found}, but the builder check ({sys.executable} -c ...) ended with exit "
                       f"{proc.returncode} and no answer ({said})")
    if not answer.get("builder"):
        said = "; ".join(str(message) for message in answer["messages"]) or "TensorRT gave no builder and no error"
        return False, f"{found}, but no builder could be created on this machine ({said})"
    return True, f"{found}; a builder was created"


def collect_env(root: str | os.PathLike = "/") -> dict:
    """Gather the environment report as a JSON-friendly dict.

    Keys: ``edgesdk``, ``python``, ``platform``, ``packages`` (name -> version), ``package_conflicts``,
    ``onnxruntime_providers``, ``onnxruntime_error``, ``gpu``, ``board``, ``memory``, ``cpufreq`` (driver and
    policies) and ``thermal_zones`` (name -> °C). ``gpu.tensorrt`` is true only where TensorRT's Python module
    imports and creates a builder (:func:`tensorrt_check`), and ``gpu.tensorrt_found`` says what was found.
    ``package_conflicts`` is a sentence for each set of distributions that install one import package and are
    installed together, an empty list when none are: always there, so that a script reading ``env --json`` need not tell a missing key from no clash.

    On this machine (``root`` "/"), the thermal zones and cpufreq are read where ``$EDGESDK_THERMAL_ROOT`` and
    ``$EDGESDK_CPUFREQ_ROOT`` put them, as ``thermal sensors``, the guard and ``bench`` read them: in a container with
    the board's ``/sys`` mounted elsewhere, ``env`` reported no zones and no cpufreq while ``thermal sensors`` listed
    them. Another ``root`` (a board's tree) is read as a whole.
    """
    packages = {shown: package_version(*names) for shown, names in PACKAGES.items()}
    conflicts = [conflict for shown, names in PACKAGES.items()
                 if shown in SHARED_IMPORT_PACKAGE and (conflict := shared_package_conflict(*names)) is not None]
    providers, ort_error = _ort_providers()
    nvidia_smi = shutil.which("nvidia-smi")
    device_nodes = [f"/{rel}" for rel in GPU_DEVICE_NODES if os.path.exists(os.path.join(root, rel))]
    libcudart = ctypes.util.find_library("cudart")
    libnvinfer = ctypes.util.find_library("nvinfer")
    tensorrt, tensorrt_found = tensorrt_check(packages["tensorrt"], libnvinfer)
    from edgesdk.thermal.cpufreq import cpufreq_root
    from edgesdk.thermal.sensors import THERMAL_DIR, thermal_root

    here = Path(root) == Path("/")  # this machine: the roots the environment moves apply
    return {
        "edgesdk": edgesdk.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "package_conflicts": conflicts,
        "onnxruntime_providers": providers,
        "onnxruntime_error": ort_error,
        "gpu": {
            # A GPU is present when a driver tool or a device node is; a CUDA runtime library alone
            # (a toolkit on a CPU-only host) runs nothing.
            "cuda_device": bool(nvidia_smi or device_nodes),
            "cuda_runtime": libcudart is not None,
            "nvidia_smi": nvidia_smi,
            "device_nodes": device_nodes,
            "libcudart": libcudart,
            # TensorRT runs here: its Python module imports and creates a builder; tensorrt_found says what was found
            "tensorrt": tensorrt,
            "tensorrt_found": tensorrt_found,
            "libnvinfer": libnvinfer,
        },
        "board": detect_board(root).to_dict(),
        "memory": _memory_info(Path(root)),
        "cpufreq": _cpufreq_info(Path(cpufreq_root() if here else root)),
        "thermal_zones": _thermal_zones(Path(thermal_root() if here else Path(root) / THERMAL_DIR)),
    }


def _cpufreq_info(root: Path) -> dict:
    """The cpufreq driver and each policy's governor and clocks under ``root`` (what ``bench`` records around its
    tests): a board held by the powersave governor or capped below its hardware maximum decodes far slower, which a
    bug report about speed needs to show. A machine without cpufreq (a container, a VM) gives none and no policies."""
    from edgesdk.runtime.bench_conditions import read_clocks, read_driver

    return {"driver": read_driver(root), "policies": read_clocks(root)}


def _thermal_zones(thermal_dir: Path) -> dict[str, float | None]:
    """Each sysfs thermal zone in ``thermal_dir`` (``/sys/class/thermal``'s ``thermal_zone*``, named by its ``type``,
    as ``edgesdk thermal`` names them) and its temperature in °C, None where it gives no reading (an offline sensor, a
    failed read): a hot or throttling board explains slow or failing runs. None there: an empty mapping."""
    from edgesdk.thermal.sensors import SysfsThermal, parse_millidegree

    zones = {}
    for name, directory in SysfsThermal.discover(thermal_dir).items():
        try:
            text = (directory / "temp").read_text(encoding="ascii", errors="replace")
        except OSError:  # ENODATA while a sensor has no data yet, EIO, permissions
            text = None
        zones[name] = parse_millidegree(text) if text is not None else None
    return zones


def _memory_info(root: Path) -> dict:
    """Huge-page support for the weight stream (edgesdk/runtime/huge_pages.py), from the kernel files under
    ``root`` as the rest of the report."""
    from edgesdk.runtime.huge_pages import THP_MODE_UNDER_ROOT, commands_use_huge_pages, thp_mode

    mode, libc = thp_mode(root / THP_MODE_UNDER_ROOT), platform.libc_ver()
    return {"transparent_huge_pages": mode, "c_library": " ".join(part for part in libc if part) or None,
            "run_eval_use_huge_pages": commands_use_huge_pages(dict(os.environ), mode, libc, root)}


def _show(value: object) -> str:
    """A value as one row shows it: "-" for none (None, an empty list or string: textwrap.fill gives an empty string
    no line, which dropped the row's key), yes/no for a flag, a list space-separated."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set, frozenset)):
        return " ".join(str(v) for v in value) if value else "-"
    return str(value)


def _cuda_runtime_text(gpu: dict) -> str | bool | None:
    """The ``cuda_runtime`` row: what was found, the CUDA runtime library (``libcudart``) the dynamic loader finds,
    which alone says nothing of CUDA running here; without a CUDA device it says the library has none to run on (a
    toolkit or a pip CUDA wheel on a CPU-only host)."""
    found = gpu.get("cuda_runtime")
    if not isinstance(found, bool):
        return found
    if not found:
        return "no libcudart found"
    library = f"library found ({gpu['libcudart']})" if gpu.get("libcudart") else "library found"
    return library if gpu.get("cuda_device") else f"{library}, but no CUDA device to run on"


def _tensorrt_text(gpu: dict) -> str | bool | None:
    """The ``tensorrt`` row: what was found (``tensorrt_found``), not a bare yes that an installed package alone
    gave; the flag where a report lacks the words."""
    return gpu.get("tensorrt_found") or gpu.get("tensorrt")


def _gpu_rows(gpu: dict) -> list[tuple[str, object]]:
    shown = {"cuda_runtime": _cuda_runtime_text, "tensorrt": _tensorrt_text}
    return [(key, shown[key](gpu) if key in shown else value) for key, value in gpu.items()
            if key != "tensorrt_found"]


def _mhz_text(value: object) -> str:
    return "?" if value is None else f"{value:g}"


def _cpufreq_rows(cpufreq: dict) -> list[tuple[str, object]]:
    """The ``cpu clocks`` rows: the driver, then each policy's CPUs, governor and current / maximum clock against
    the hardware's maximum; one "-" row where the machine has no cpufreq."""
    policies = [policy for policy in cpufreq.get("policies") or [] if isinstance(policy, dict)]
    if not policies and not cpufreq.get("driver"):
        return [("cpufreq", None)]
    rows: list[tuple[str, object]] = [("driver", cpufreq.get("driver"))]
    for policy in policies:
        rows.append((str(policy.get("policy") or "?"),
                     f"cpus {policy.get('cpus') or '?'}, governor {policy.get('governor') or '?'}, "
                     f"{_mhz_text(policy.get('cur_mhz'))} MHz now, max {_mhz_text(policy.get('max_mhz'))} MHz "
                     f"(hardware {_mhz_text(policy.get('hardware_max_mhz'))} MHz)"))
    return rows


def format_env(info: dict) -> str:
    """Render :func:`collect_env`'s dict as aligned ``key: value`` lines under group headings."""
    providers = info.get("onnxruntime_providers") or []
    gpu = info.get("gpu") or {}
    ort_rows = [(str(i + 1), name) for i, name in enumerate(providers)]
    if info.get("onnxruntime_error"):
        ort_rows.append(("error", info["onnxruntime_error"]))
    groups = [
        ("edgesdk", [("version", info.get("edgesdk"))]),
        ("python", [("version", info.get("python")), ("platform", info.get("platform"))]),
        ("packages", [*(info.get("packages") or {}).items(),
                      *(("conflict", conflict) for conflict in info.get("package_conflicts") or [])]),
        ("onnxruntime providers", ort_rows or [("providers", None)]),
        ("gpu", _gpu_rows(gpu)),
        ("board", list((info.get("board") or {}).items())),
        ("memory", list((info.get("memory") or {}).items())),
        ("cpu clocks", _cpufreq_rows(info.get("cpufreq") or {})),
        ("thermal zones", [(name, "no reading" if value is None else f"{value:.1f} °C")
                           for name, value in (info.get("thermal_zones") or {}).items()] or [("zones", None)]),
    ]
    width = max(len(key) for _, rows in groups for key, _ in rows)
    indent = " " * (width + 5)
    lines = []
    for title, rows in groups:
        lines.append(f"{title}:")
        for key, value in rows:
            first = f"  {key:<{width}} : "
            lines.append(textwrap.fill(_show(value), 110, initial_indent=first, subsequent_indent=indent))
    return "\n".join(lines)
