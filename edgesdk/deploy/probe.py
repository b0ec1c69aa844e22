"""What the board is, and whether a bundle may go onto it (target, memory, disk).

The board-side helper returns raw facts (device-tree model, ``/etc/nv_tegra_release``,
``/proc/cpuinfo``, ``/proc/meminfo``, free space under the deploy root, Python, TensorRT, the
installed runtime and releases); this module reads them with the same code that ``edgesdk env``
uses on a board (:mod:`edgesdk.board`), by laying them out as a small file tree.
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgesdk.board import (
    BoardInfo,
    detect_board,
    jetson_modules,
    read_device_tree_compatible,
    suggest_target_and_note,
    userland_arch,
)
from edgesdk.deploy.transport import DeployError
from edgesdk.weights_file import loaded_bytes

MB = 1_000_000
# Space a runtime install takes: the venv and edgesdk alone when the board's own packages are
# inherited; with numpy, onnxruntime, tokenizers, pydantic ... otherwise (measured: 237 MB on
# x86-64 with Python 3.11; the estimate leaves room for larger aarch64 / GPU wheels).
RUNTIME_BYTES_INHERITED = 40 * MB
RUNTIME_BYTES_FULL = 400 * MB
DISK_MARGIN_BYTES = 64 * MB


@dataclass
class BoardFacts:
    """The probe's answer, with the board detected the way ``edgesdk env`` detects it."""

    raw: dict
    board: BoardInfo
    root: str
    free_bytes: int
    mem_total: int | None
    mem_available: int | None
    tensorrt: str | None
    python_version: tuple[int, ...]
    state: dict = field(default_factory=dict)

    @classmethod
    def from_probe(cls, raw: dict) -> BoardFacts:
        with tempfile.TemporaryDirectory(prefix="edgesdk-probe-") as tmp:
            root = Path(tmp)
            # device_tree_compatible: absent from the probe of a helper older than it (the model alone tells then)
            files = {"proc/device-tree/model": raw.get("device_tree_model"),
                     "proc/device-tree/compatible": raw.get("device_tree_compatible"),
                     "etc/nv_tegra_release": raw.get("nv_tegra_release"),
                     "proc/cpuinfo": raw.get("cpuinfo"),
                     "proc/meminfo": _meminfo_text(raw.get("memory") or {})}
            for rel, text in files.items():
                if text is not None:
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    (root / rel).write_text(text, encoding="utf-8")
            detected = detect_board(root)
            modules = jetson_modules(read_device_tree_compatible(root))
        arch = userland_arch(raw.get("arch"), (raw.get("python") or {}).get("bits"))
        target, note, note_target = suggest_target_and_note(detected.model, detected.family, arch,
                                                            detected.memory_gib, modules)
        board = replace(detected, architecture=arch, suggested_target=target, detection_note=note,
                        note_target=note_target)
        memory = raw.get("memory") or {}
        trt = raw.get("tensorrt") or {}
        return cls(raw=raw, board=board, root=raw["root"], free_bytes=int(raw["disk"]["free"]),
                   mem_total=memory.get("MemTotal"), mem_available=memory.get("MemAvailable"),
                   tensorrt=trt.get("version"), python_version=tuple(raw["python"]["version"]),
                   state=raw.get("state") or {})

    def disk_where(self) -> str:
        """Where the free space was measured: the deploy root, or, where it does not exist (a first deploy, or a
        mistyped --to), the nearest directory above it that does, which the board measures instead."""
        measured = (self.raw.get("disk") or {}).get("path")
        if not measured or measured == self.root:
            return self.root
        return f"{measured} (the nearest existing directory above {self.root}, which does not exist)"

    def describe(self) -> str:
        """One line for the deploy log."""
        b = self.board
        what = b.model or f"{b.family} machine"
        parts = [what, b.architecture or "?"]
        if b.l4t:
            parts.append(f"L4T {b.l4t} (JetPack {b.jetpack or 'unknown'})")
        parts.append(f"TensorRT {self.tensorrt}" if self.tensorrt else "no TensorRT")
        parts.append("Python " + ".".join(map(str, self.python_version)))
        if self.mem_total:
            # a kernel older than 3.14 has no MemAvailable in /proc/meminfo: how much is free is then unknown, not 0
            free = "free unknown" if self.mem_available is None else f"{self.mem_available / 2**30:.1f} free"
            parts.append(f"{self.mem_total / 2**30:.1f} GiB RAM ({free})")
        parts.append(f"{self.free_bytes / 2**30:.1f} GiB free in {self.disk_where()}")
        runtime = (self.raw.get("runtime") or {}).get("stamp")
        parts.append(f"edgesdk runtime {runtime['version']}" if runtime else "no edgesdk runtime yet")
        return ", ".join(parts)


def detection_note(board: BoardInfo, bundle_target: str) -> str:
    """``board.detection_note`` (edgesdk/board.py: the device tree's model string and its module disagree, or it
    names several modules), worded for deploy, "" where there is none. Its advice, "pass --target X", is that of
    ``edgesdk env`` and ``build``: deploy takes no --target, and matches the bundle's target to the profile it
    suggests, so a bundle for another module's profile (``board.note_target``) goes on with --ignore-target."""
    reason = board.note_reason()
    if not reason:
        return ""
    profile = board.note_target
    if profile is None:
        advice = (f"deploy a bundle built for the module's profile with --ignore-target (this one was built for "
                  f"'{bundle_target}')")
    elif profile == bundle_target:
        advice = f"this '{bundle_target}' bundle is built for it: pass --ignore-target to deploy it"
    else:
        advice = f"build the bundle with 'edgesdk build --target {profile}' and deploy that with --ignore-target"
    return f"\n{reason}{advice}"


def _meminfo_text(memory: dict) -> str | None:
    if "MemTotal" not in memory:
        return None
    return "".join(f"{key}: {value // 1024} kB\n" for key, value in memory.items())


def _shipped_targets() -> set[str]:
    from edgesdk.profile import shipped_profiles

    return set(shipped_profiles())


def check_target(bundle_target: str, facts: BoardFacts, where: str, ignore: bool) -> str:
    """Refuse a bundle built for another board; returns the line to print. A bundle built for a profile of the
    user's own (``edgesdk build --target FILE.yaml``, edgesdk/profile.py load_profile_file) matches no board the
    probe can name: it is refused with --ignore-target as the way through, not with "add a profile for this
    board" or "build it with --target rpi5", which the user has done or does not want."""
    board_target = facts.board.suggested_target
    if ignore:
        board = f"board is '{board_target}'" if board_target else "board matches no shipped profile"
        return f"target check skipped (--ignore-target): bundle for '{bundle_target}', {board}"
    b = facts.board
    if b.family in ("jetson", "rpi") and b.architecture not in (None, "aarch64"):
        raise DeployError(
            f"{where} ({b.model or b.family}) runs an {b.architecture} userland (its Python "
            f"{'.'.join(map(str, facts.python_version))} is {(facts.raw.get('python') or {}).get('bits', '?')}-bit), "
            f"and the '{bundle_target}' bundle's runtime needs 64-bit Arm (aarch64): ONNX Runtime publishes no "
            "wheels for 32-bit Arm",
            "install the 64-bit OS on the board (64-bit Raspberry Pi OS, or JetPack), or pass --remote-python a "
            "64-bit Python there; --ignore-target deploys anyway")
    note = detection_note(b, bundle_target)
    if bundle_target not in _shipped_targets():
        seen = board_target or f"no shipped profile: model {b.model!r}, {b.architecture}, {b.memory_gib} GiB"
        raise DeployError(
            f"the bundle was built for '{bundle_target}', a target profile of your own (edgesdk build --target "
            f"FILE.yaml), which deploy cannot match to {where} ({seen}), so it is refused{note}",
            "pass --ignore-target to deploy it anyway once you have checked that the profile is for this board"
            + (f", or build it for this board with 'edgesdk build --target {board_target}'" if board_target else ""))
    if board_target is None:
        module = f"{b.module_words()}, " if b.module else ""
        raise DeployError(
            f"cannot tell which target profile matches {where} (model {facts.board.model!r}, {module}"
            f"{facts.board.architecture}, {facts.board.memory_gib} GiB), so the '{bundle_target}' bundle is refused"
            f"{note}",
            f"pass --ignore-target to deploy the '{bundle_target}' bundle anyway, once you have checked that this "
            "board is one it was built for")
    if board_target != bundle_target:
        seen = ", ".join(part for part in (b.model, b.module_words()) if part) or b.architecture
        raise DeployError(
            f"the bundle was built for target '{bundle_target}', but {where} is '{board_target}' ({seen}){note}",
            f"build it for this board with 'edgesdk build --target {board_target}', "
            "or pass --ignore-target to deploy it anyway")
    return f"target '{bundle_target}' matches the board{note}"


def memory_bytes(manifest: dict, files: dict[str, dict]) -> int:
    """What the bundle takes in memory: its files, an entropy-coded weights file at its inflated size
    (edgesdk/weights_file.py: the board holds the inflated bytes, not the coded ones)."""
    packed = manifest["graph"].get("weights")
    return sum(loaded_bytes(name, f["size"], packed) for name, f in files.items())


def check_memory(bundle_bytes: int, budget_mb: int, facts: BoardFacts, where: str,
                 basis: str | None = None) -> list[str]:
    """Refuse a bundle that takes more memory (:func:`memory_bytes`) than the budget or the board's RAM; warn
    when RAM is short now. ``basis`` says where ``budget_mb`` comes from (the profile's budget, or that budget
    cut to the board's RAM: orchestrate._budget_mb)."""
    notes = []
    if bundle_bytes > budget_mb * MB:
        basis = basis or f"the {budget_mb} MB memory budget of the board's profile"
        raise DeployError(
            f"the bundle takes {bundle_bytes / MB:.0f} MB in memory, more than {basis} ({where})",
            "build a smaller bundle (a smaller model, or a recipe that prunes or quantises more)")
    if facts.mem_total is not None and bundle_bytes > facts.mem_total:
        raise DeployError(
            f"the bundle takes {bundle_bytes / MB:.0f} MB in memory but {where} has {facts.mem_total / MB:.0f} MB "
            "of RAM", "build a smaller bundle for this board")
    if facts.mem_available is not None and bundle_bytes > facts.mem_available:
        notes.append(f"warning: {where} has {facts.mem_available / MB:.0f} MB of memory available now, the bundle "
                     f"needs about {bundle_bytes / MB:.0f} MB; stop other programs before running it")
    return notes


def check_disk(send_bytes: int, runtime_bytes: int, facts: BoardFacts, where: str, engine_bytes: int = 0) -> str:
    """Refuse when what deploy would write does not fit in the free space under the deploy root: the bundle files
    it sends, the runtime it installs, and the TensorRT engine it builds under ``engines/`` (``engine_bytes``,
    engine.planned_engine_bytes), all before the transfer, not minutes into the engine build."""
    need = send_bytes + runtime_bytes + engine_bytes + DISK_MARGIN_BYTES
    parts = f"{send_bytes / MB:.1f} MB of bundle files to send"
    if runtime_bytes:
        parts += f" + about {runtime_bytes / MB:.0f} MB for the edgesdk runtime it installs"
    if engine_bytes:
        parts += f" + about {engine_bytes / MB:.1f} MB for the TensorRT engine it builds"
    parts += f" + {DISK_MARGIN_BYTES / MB:.0f} MB margin left free"
    if need > facts.free_bytes:
        raise DeployError(
            f"not enough disk space on {where}: {facts.free_bytes / MB:.1f} MB free in {facts.disk_where()}, deploy "
            f"needs {need / MB:.1f} MB ({parts})",
            disk_fix(facts))
    return f"{facts.free_bytes / MB:.0f} MB free; {parts} = {need / MB:.1f} MB needed"


def disk_fix(facts: BoardFacts) -> str:
    """How to make room for a deploy the disk check refused. Deploy prunes old releases (``--keep``) only after a
    deploy that succeeded, so a lower --keep frees nothing for the refused one: the releases that are neither
    current nor previous are named instead, oldest first, with the command that removes them on the board."""
    keep = {facts.state.get("current"), facts.state.get("previous")}
    old = [r for r in facts.state.get("releases") or [] if r.get("id") not in keep]
    staged = [name for name in facts.state.get("staging") or [] if isinstance(name, str)]
    if not old and not staged:
        return ("free space on the board (it holds no release besides current and previous), or pass --remote-root "
                "on a larger disk")
    held, paths = [], []
    if old:
        named = ", ".join(f"{r['id']} ({r['bytes'] / MB:.1f} MB)" if isinstance(r.get("bytes"), int) else r["id"]
                          for r in old)
        held.append(f"releases that are neither current nor previous, oldest first: {named} (a lower --keep removes "
                    "them only after a deploy that succeeds)")
        paths += [f"{facts.root}/{folder}/{r['id']}" for r in old for folder in ("releases", "engines")]
    if staged:
        held.append(f"the unfinished transfers of interrupted deploys in staging/: {', '.join(staged)} (deploying "
                    "that bundle again goes on from its transfer)")
        paths += [f"{facts.root}/staging/{name}" for name in staged]
    return (f"free space on the board, or pass --remote-root on a larger disk. It holds {'; and '.join(held)}; "
            f"remove those no longer needed, on the board: {shlex.join(['rm', '-rf', *paths])}")
