"""Open a bundle for generation: verify it, check its target, pick a backend, load the tokenizer."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgesdk.bundle import Bundle, verify_bundle
from edgesdk.errors import BundleError, RuntimeBackendError
from edgesdk.runtime.backend import DecoderBackend
from edgesdk.runtime.text import ChatTokenizer

# backend name -> onnxruntime execution providers it needs
ORT_PROVIDERS = {
    "ort-cpu": ["CPUExecutionProvider"],
    "ort-cuda": ["CUDAExecutionProvider", "CPUExecutionProvider"],
    "ort-trt": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
}


@dataclass
class Runtime:
    """A loaded bundle ready to generate."""

    bundle: Bundle
    backend: DecoderBackend
    tokenizer: ChatTokenizer
    notes: list[str] = field(default_factory=list)  # why each backend was or was not used


def check_target(bundle: Bundle, expected_target: str | None, ignore_target: bool) -> str | None:
    """Refuse a bundle built for another board. Returns a note when running a board bundle on a host."""
    from edgesdk.board import detect_board
    from edgesdk.profile import get_profile

    if ignore_target:
        return f"target check skipped (--ignore-target); bundle built for {bundle.target}"
    if expected_target is not None:
        verify_target = get_profile(expected_target).name
        if bundle.target != verify_target:
            raise BundleError(
                f"bundle {bundle.path} was built for target '{bundle.target}', not '{verify_target}'",
                f"build it with 'edgesdk build --target {verify_target}', or pass --ignore-target",
            )
        return None
    board = detect_board()
    if board.family in ("jetson", "rpi") and board.suggested_target and board.suggested_target != bundle.target:
        raise BundleError(
            f"bundle {bundle.path} was built for '{bundle.target}' but this board is '{board.suggested_target}' "
            f"({board.model})",
            f"build it with 'edgesdk build --target {board.suggested_target}', or pass --ignore-target",
        )
    if board.family == "host" and bundle.target != "host":
        return f"running a '{bundle.target}' bundle on a development host ({board.architecture})"
    return None


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def open_backend(bundle: Bundle, names: list[str], threads: int, spinning: bool = True
                 ) -> tuple[DecoderBackend, list[str]]:
    """Try backends in order; return the first that loads and a note per backend tried."""
    from edgesdk.runtime.ort_backend import OrtBackend
    from edgesdk.runtime.ort_fused_backend import OrtFusedBackend
    from edgesdk.runtime.ort_gated_backend import OrtGatedBackend

    graph = bundle.manifest["graph"]
    backend_class = {"ort-fused": OrtFusedBackend, "ort-fused-gated": OrtGatedBackend}.get(graph.get("form"),
                                                                                          OrtBackend)
    notes: list[str] = []
    available = _available_providers()
    for name in names:
        if name not in ORT_PROVIDERS:
            notes.append(f"{name}: not built into this edgesdk release")
            continue
        missing = [p for p in ORT_PROVIDERS[name] if p not in available]
        if missing:
            notes.append(f"{name}: onnxruntime here lacks {', '.join(missing)}")
            continue
        try:
            backend = backend_class(bundle.file(graph["file"]), graph, threads, ORT_PROVIDERS[name],
                                    spinning=spinning)
        except RuntimeBackendError as exc:
            notes.append(f"{name}: failed to load ({exc.problem})")
            continue
        notes.append(f"{name}: used")
        return backend, notes
    raise RuntimeBackendError(
        f"no backend could run bundle {bundle.path}: " + "; ".join(notes),
        "install onnxruntime (pip install edgesdk) or pass --backend ort-cpu",
    )


def open_runtime(path: Path, backend: str | None = None, threads: int | None = None,
                 expected_target: str | None = None, ignore_target: bool = False,
                 spinning: bool = True, verbose: bool = False) -> Runtime:
    """Verify the bundle (hashes, then target) before loading anything, then load it."""
    bundle = verify_bundle(Path(path))
    notes = []
    target_note = check_target(bundle, expected_target, ignore_target)
    if target_note:
        notes.append(target_note)
    defaults = bundle.manifest["runtime"]
    chain = [backend] if backend else [defaults["backend"], *defaults.get("fallbacks", [])]
    if threads is None:
        # The profile's thread count is for its board; never oversubscribe the cores we have.
        threads = min(int(defaults["threads"]), usable_cores())
        notes.append(f"{threads} threads (profile {defaults['threads']}, {usable_cores()} usable cores)")
    engine, backend_notes = open_backend(bundle, chain, threads, spinning)
    notes += backend_notes
    facts = bundle.manifest["tokenizer"]
    template = facts.get("chat_template")
    tokenizer = ChatTokenizer(bundle.file(facts["file"]), facts, bundle.file(template) if template else None)
    if verbose:
        for note in notes:
            print(f"edgesdk: {note}", file=sys.stderr)
    return Runtime(bundle=bundle, backend=engine, tokenizer=tokenizer, notes=notes)
