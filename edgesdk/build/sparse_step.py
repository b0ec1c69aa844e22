"""The export step's block-sparse part: compressed weights, their check against PyTorch, and the
GPU kernels compiled ahead of time for the target's SM (issue: INT8 block-sparse engine)."""

from __future__ import annotations

from pathlib import Path

from edgesdk.errors import BuildError

KERNELS_DIR = "kernels"


def export_sparse_parts(model, export_dir: Path, export_config, profile, validation, progress: bool) -> dict:
    """Write sparse/, sparsity.json and (GPU targets) kernels/sm_XX/ under ``export_dir``; returns
    the manifest's ``sparse`` record."""
    from edgesdk.compress.sparsify import recorded_masks
    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse, validate_sparse

    recorded = recorded_masks(model)
    if recorded is not None and recorded[0] != profile.sparsity_block:
        raise BuildError(
            f"the sparsify stage dropped {recorded[0]} x {recorded[0]} blocks, but {profile.name}'s block-sparse "
            f"weights and kernels use its sparsity_block, {profile.sparsity_block} x {profile.sparsity_block}",
            f"leave sparsify.block_size unset (or set it to {profile.sparsity_block}), or use a profile whose "
            "sparsity_block matches",
        )
    record = export_sparse(model, export_dir, SparseExportConfig(block=profile.sparsity_block,
                                                                 layout=export_config.sparse_layout),
                           export_config.max_context)
    record["validation"] = validate_sparse(model, export_dir, record, validation)
    if profile.gpu is not None:
        record["kernels"] = compile_kernels(profile, export_dir / KERNELS_DIR, record)
    return record


def check_kernel_sm(profile) -> None:
    """Raise BuildError when the profile's GPU has an SM the block-sparse kernels have no launch settings for
    (:data:`edgesdk.kernels.tuning.SM_DEFAULTS`), so no kernels can be compiled for it; a profile without a GPU
    needs none. The pipeline checks this before any stage runs, :func:`compile_kernels` again at export."""
    from edgesdk.kernels.tuning import SM_DEFAULTS

    gpu = profile.gpu
    if gpu is not None and gpu.sm not in SM_DEFAULTS:  # a user's own board: the tuning is known per SM only
        raise BuildError(
            f"{profile.name}'s GPU is sm_{gpu.sm}, and the block-sparse kernels have launch settings only for "
            f"{', '.join(f'sm_{sm}' for sm in sorted(SM_DEFAULTS))}, so they cannot be "
            "compiled for it",
            "set export.sparse=false (or use a recipe without the block-sparse export): the bundle then runs on "
            "TensorRT or ONNX Runtime")


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def compile_kernels(profile, out_dir: Path, record: dict) -> dict:
    """AOT-compile the decode kernels for the profile's SM (Triton's compiler; no GPU needed), for what the
    exported model needs: ``record``'s block (the profile's sparsity_block) and layout, head_dim, and each
    layer's query heads per KV head (rounded up to a power of two, as the kernels' ``BLOCK_G``). Raises
    BuildError when one of them does not compile, instead of shipping a bundle that fails at its first token, and
    when the SM is one the kernels have no launch settings for (:data:`edgesdk.kernels.tuning.SM_DEFAULTS`)."""
    import dataclasses

    from edgesdk.kernels.aot import compile_for_target, default_variants
    from edgesdk.kernels.tuning import tuning_for

    check_kernel_sm(profile)
    gpu = profile.gpu
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise BuildError(f"the {profile.name} bundle needs its GPU kernels compiled ahead of time, and Triton's "
                         f"compiler is not importable ({exc})",
                         "pip install 'edgesdk[host]' (it pins triton), or set export.sparse=false") from exc

    block = int(record["block"])  # the profile's sparsity_block: a power of two (checked when it is read)
    tuning = dataclasses.replace(tuning_for(gpu.sm), bsr_block=(block, block))
    groups = sorted({_next_pow2(int(layer["heads"]) // max(1, int(layer["kv_heads"]))) for layer in record["layers"]})
    windows = sorted({layer.get("window") for layer in record["layers"]}, key=lambda window: window or 0)
    variants = default_variants(tuning, head_dims=(_next_pow2(int(record["head_dim"])),), group_blocks=groups,
                                layouts=(record.get("layout", "plain"),), windows=windows)  # Gemma 3: per window
    compiled = compile_for_target(gpu.sm, out_dir, tuning, variants=variants)
    failed = {k.name: k.error for k in compiled if not k.ok}
    if failed:
        name, error = next(iter(sorted(failed.items())))
        raise BuildError(
            f"{len(failed)} of the {len(compiled)} GPU kernels the {profile.name} bundle needs did not compile for "
            f"sm_{gpu.sm} ({', '.join(sorted(failed))}); {name}: {error}",
            "use a profile whose runtime is not triton (TensorRT / ONNX Runtime), set export.sparse=false, or "
            "install the triton release edgesdk pins (pip install 'edgesdk[host]')")
    return {"sm": gpu.sm, "dir": f"{KERNELS_DIR}/sm_{gpu.sm}", "kernels": sorted(k.name for k in compiled if k.ok),
            "failed": failed}


def bundle_files(export_dir: Path, record: dict | None) -> list[str]:
    """Relative names of the sparse part's files under ``export_dir`` (for the bundle): the weights, sparsity.json
    and, for a GPU target, the kernel directory's ``index.json`` and the files its compiled variants list, not
    whatever else the directory holds (an earlier compile's variants, which the board's loader never reads)."""
    if not record:
        return []
    names = [record["weights"], record["sparsity"]]
    kernels = record.get("kernels")
    if kernels:
        names += _kernel_files(export_dir, kernels["dir"])
    return names


def _kernel_files(export_dir: Path, kernel_dir: str) -> list[str]:
    """``kernel_dir/index.json`` and, for each compiled variant it lists, the files the board's loader reads
    (edgesdk/kernels/loader.py): its metadata (``meta_path``) and the cubin and PTX the metadata names, relative
    to ``export_dir``. BuildError when the index or a metadata file is not there or not the compiler's."""
    import json

    index_path = export_dir / kernel_dir / "index.json"
    listed: set[str] = set()
    read = index_path
    try:
        for entry in json.loads(index_path.read_text())["kernels"]:
            if not entry.get("ok", True):
                continue
            meta_name = entry.get("meta_path") or f"{entry['name']}.json"
            read = export_dir / kernel_dir / meta_name
            files = json.loads(read.read_text())["files"]
            listed.update((meta_name, files["cubin"], files["ptx"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BuildError(f"the compiled kernels' {'index' if read == index_path else 'metadata'} {read} is not "
                         f"readable as the compiler writes it ({type(exc).__name__}: {exc})",
                         "build again (the export is redone); the kernel directory must be left as the compiler "
                         "wrote it") from exc
    if not all(isinstance(name, str) and "/" not in name and name not in ("", ".", "..") for name in listed):
        raise BuildError(f"the compiled kernels in {export_dir / kernel_dir} name a file outside it: "
                         f"{sorted(map(str, listed))}", "build again (the export is redone)")
    return [f"{kernel_dir}/{name}" for name in ("index.json", *sorted(listed))]
