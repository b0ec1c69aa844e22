"""Ahead-of-time compilation of the decode kernels for one GPU target (SM), on a host without a GPU.

``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", sm, 32), options=...)`` runs
Triton's full pipeline (TTIR -> TTGIR -> LLVM IR -> PTX -> cubin through the bundled ``ptxas``) for a fixed
signature; no device is queried. See ``triton/compiler/compiler.py`` (``ASTSource``, ``compile``) and the Triton
docs. For every variant this writes, under ``out_dir/sm_{sm}/``:

* ``{variant}.cubin``: the SASS for ``sm_{sm}`` that the board loads with ``cuModuleLoadData``;
* ``{variant}.ptx``: the PTX, which a newer driver can JIT for other SMs;
* ``{variant}.json``: launch metadata: kernel (symbol) name, full signature, constexprs, the ordered runtime
  parameters (after them the kernel takes two pointers, Triton's global and profile scratch, null when their
  size is 0; every pointer must be 16-byte aligned), num_warps, num_stages, dynamic shared memory bytes, the grid rule,
  and the SHA-256 of the cubin and of the PTX (every bsr variant's kernel is named ``_bsr_matmul_kernel``, so only
  the hash tells the board's loader a swapped or damaged file);

and ``index.json``: every variant, with the error text for the ones the compiler refused (e.g. an SM too old for
Triton), so a caller can fall back (for instance "Xavier uses TensorRT only").
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .layouts import LAYOUTS
from .tuning import KernelTuning, max_shared_per_block, tuning_for

# Runtime parameter types of each kernel body, in order; "{act}" is the activation dtype of the variant.
_BSR_PARAMS = (
    ("x_ptr", "*{act}"), ("values_ptr", "*i8"), ("col_ptr", "*i32"), ("rowoff_ptr", "*i32"),
    ("scales_ptr", "*fp32"), ("out_ptr", "*{out}"),
    ("M", "i32"), ("N", "i32"), ("K", "i32"),
    ("stride_xm", "i32"), ("stride_xk", "i32"), ("stride_om", "i32"), ("stride_on", "i32"),
)
_BSR_CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "TRANSPOSED", "USE_DOT", "UNROLL", "ATOMIC")
_ATTN_PARAMS = (
    ("q_ptr", "*{act}"), ("k_ptr", "*{act}"), ("v_ptr", "*{act}"), ("len_ptr", "*i32"), ("out_ptr", "*{act}"),
    ("scale", "fp32"), ("GROUP", "i32"), ("D", "i32"),
    ("stride_qb", "i32"), ("stride_qh", "i32"), ("stride_qd", "i32"),
    ("stride_kb", "i32"), ("stride_kh", "i32"), ("stride_kt", "i32"), ("stride_kd", "i32"),
    ("stride_vb", "i32"), ("stride_vh", "i32"), ("stride_vt", "i32"), ("stride_vd", "i32"),
    ("stride_ob", "i32"), ("stride_oh", "i32"), ("stride_od", "i32"),
)
_ATTN_CONSTEXPRS = ("BLOCK_G", "BLOCK_D", "BLOCK_T", "WINDOW")

# Triton's hidden kernel parameters, after the runtime ones (triton 3.9 ``backends/nvidia/driver.py`` launcher:
# global scratch, then profile scratch); what the board's loader appends to every launch
TRAILING_PARAMS = (("global_scratch", "*i8"), ("profile_scratch", "*i8"))

# activation dtypes of a variant ({act} pointers): the ones the board's loader launches (loader._TORCH_DTYPES); Triton
# compiles others too (fp8e4nv, fp64), and the loader then refuses the whole bundle on the board
ACT_DTYPES = ("fp16", "bf16", "fp32")
_ACT_ALIASES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}

_DOT_MIN = 16  # smallest tile edge tl.dot takes (triton_kernels.DOT_MIN; this module imports no triton)
_MAX_WINDOW = 2**31 - 1  # reference.MAX_WINDOW: the kernel's positions are int32 (this module imports no torch)
POINTER_ALIGNMENT = 16  # bytes; every pointer parameter of an AOT kernel must be a multiple of this
# threads a block may have on every GPU (CUDA C++ Programming Guide, "Technical Specifications per Compute
# Capability"): Triton compiles more warps than fit, and cuLaunchKernel refuses the kernel on the board
MAX_THREADS_PER_BLOCK = 1024

# Grid rules: each dimension is an int, a parameter name, or ["cdiv", parameter, constexpr] (ceil division).
_BSR_GRID = {"rule": "(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), 1)",
             "dims": [["cdiv", "N", "BLOCK_N"], ["cdiv", "M", "BLOCK_M"], 1]}
# GEMV: split-K, SPLIT from kernels.tuning.gemv_splits (M * block rows, M * stored blocks, the device's SM count)
_BSR_GEMV_GRID = {"rule": "(cdiv(N, BLOCK_N), cdiv(M, BLOCK_M), SPLIT); SPLIT = tuning.gemv_splits(...)",
                  "dims": [["cdiv", "N", "BLOCK_N"], ["cdiv", "M", "BLOCK_M"], "SPLIT"]}
_ATTN_GRID = {"rule": "(B, Hkv, 1) = (batch rows, kv heads, 1)", "dims": ["B", "Hkv", 1]}


@dataclass(frozen=True)
class KernelVariant:
    """One specialisation to compile: a kernel body, its constexprs, dtypes and launch options."""

    name: str                      # file stem, e.g. "bsr_gemv_plain_32x32_fp16"
    kernel: str                    # key of triton_kernels.KERNEL_BODIES
    constexprs: dict
    num_warps: int
    num_stages: int
    act_dtype: str = "fp16"        # activation / output dtype of the pointers marked {act}
    grid: dict = field(default_factory=dict)
    out_dtype: str | None = None   # BSR output pointer ({out}) when not act_dtype: fp32 for atomic split-K

    def params(self) -> list[tuple[str, str]]:
        table = _BSR_PARAMS if self.kernel == "bsr_matmul" else _ATTN_PARAMS
        return [(name, ty.format(act=self.act_dtype, out=self.out_dtype or self.act_dtype)) for name, ty in table]

    def signature(self) -> dict[str, str]:
        sig = dict(self.params())
        for name in (_BSR_CONSTEXPRS if self.kernel == "bsr_matmul" else _ATTN_CONSTEXPRS):
            sig[name] = "constexpr"
        return sig


@dataclass
class CompiledKernel:
    """The result for one variant on one SM. ``ok`` False: ``error`` says why and no files were written."""

    name: str
    sm: int
    cubin_path: Path | None
    ptx_path: Path | None
    meta_path: Path | None
    kernel_name: str = ""
    shared_memory_bytes: int = 0
    num_warps: int = 0
    num_stages: int = 0
    ok: bool = True
    error: str | None = None


def default_variants(tuning: KernelTuning, act_dtype: str = "fp16", head_dims: Iterable[int] = (64,),
                     group_blocks: Iterable[int] = (1, 4, 8),
                     layouts: Iterable[str] = ("plain", "transposed"),
                     windows: Iterable[int | None] = (None,)) -> list[KernelVariant]:
    """The variants a bundle ships: BSR GEMV (M < 16, 1 row tile, ``gemv_unroll`` blocks a step, split-K into a
    float32 output) and GEMM (``tl.dot`` for blocks of at least 16 x 16, else a broadcast multiply) for each of ``layouts`` at the tuning's block, and GQA decode for each
    head dim ``BLOCK_D`` and query-group bound ``BLOCK_G`` (a pruned group of G heads runs on the smallest
    ``BLOCK_G >= G``), once for each of ``windows``: None compiles full attention (``WINDOW`` 0, named as before
    windows), a number a sliding-window variant (``WINDOW`` baked in, ``_w{window}`` in its name; Gemma 3's
    sliding layers). The defaults are examples; a build passes its model's values (build/sparse_step.py).

    Raises ValueError for a block edge, head dim or group bound that is not a power of two: each is a
    ``tl.arange`` length, which Triton compiles for powers of two only (Triton language docs), and the loader
    runs a head dim of 80 on the ``BLOCK_D`` 128 variant; the message names the value and the power of two to
    pass instead; for a layout not in :data:`.layouts.LAYOUTS` (any other name compiled the plain kernel under
    it); for a window that is not None, 0 (full attention, as the runtime reads a layer's window) or a positive
    integer (a negative one compiled full attention under a ``_w-4`` name); and for an ``act_dtype`` not in
    :data:`ACT_DTYPES` (:func:`_check_act_dtype`). A layout, head dim or group bound given twice (64 and 64.0)
    gives its variants once, as a window given twice does: compiled twice they were listed twice in ``index.json``
    and the board's loader loaded the module twice, keeping one."""
    _check_act_dtype(act_dtype)
    layouts = _once(_check_layouts(layouts))
    windows = _check_windows(windows)
    bn, bk = _check_powers_of_two("the tuning's bsr_block edge", tuning.bsr_block, "block the weights in 16, 32 or 64")
    head_dims = _once(_check_powers_of_two("head_dims entry (BLOCK_D)", head_dims,
                                           "the loader runs a head dim on the smallest compiled BLOCK_D at least as "
                                           "large"))
    group_blocks = _once(_check_powers_of_two("group_blocks entry (BLOCK_G)", group_blocks,
                                              "the loader runs a group of G query heads on the smallest BLOCK_G >= G"))
    variants = []
    for layout in layouts:
        base = {"BLOCK_N": bn, "BLOCK_K": bk, "TRANSPOSED": layout == "transposed"}
        gemv = {"BLOCK_M": 1, **base, "USE_DOT": False, "UNROLL": tuning.gemv_unroll, "ATOMIC": True}
        variants.append(KernelVariant(f"bsr_gemv_{layout}_{bn}x{bk}_{act_dtype}", "bsr_matmul", gemv,
                                      tuning.gemv_num_warps, tuning.num_stages, act_dtype, _BSR_GEMV_GRID, "fp32"))
        # tl.dot needs tiles of at least 16 x 16; smaller blocks run the GEMM as a broadcast multiply
        gemm = {"BLOCK_M": tuning.gemm_block_m, **base, "USE_DOT": min(bn, bk) >= _DOT_MIN, "UNROLL": 1,
                "ATOMIC": False}
        variants.append(KernelVariant(f"bsr_gemm_{layout}_{bn}x{bk}_{act_dtype}", "bsr_matmul", gemm,
                                      tuning.gemm_num_warps, tuning.num_stages, act_dtype, _BSR_GRID))
    for d in head_dims:
        for g in group_blocks:
            for window in windows:
                named = f"_w{window}" if window else ""
                variants.append(KernelVariant(f"gqa_decode_d{d}_g{g}{named}_{act_dtype}", "gqa_decode",
                                              {"BLOCK_G": g, "BLOCK_D": d, "BLOCK_T": tuning.attn_block_t,
                                               "WINDOW": window},
                                              tuning.attn_num_warps, tuning.num_stages, act_dtype, _ATTN_GRID))
    return variants


def _once(values: list) -> list:
    """``values`` with each one kept once, in the order first given."""
    return list(dict.fromkeys(values))


def _act_dtype_refusal(act_dtype: object) -> str | None:
    """Why ``act_dtype`` cannot be a variant's activation dtype, or None for one of :data:`ACT_DTYPES`."""
    if isinstance(act_dtype, str) and act_dtype in ACT_DTYPES:
        return None
    named = str(act_dtype)
    alias = _ACT_ALIASES.get(named[len("torch."):] if named.startswith("torch.") else named)  # torch.float16: fp16
    instead = f"pass {alias!r} (Triton's name for it)" if alias else f"pass one of {ACT_DTYPES}"
    return (f"act_dtype {act_dtype!r} is not an activation dtype the board's loader launches: {instead}; the "
            f"loader refuses every other dtype when it opens the bundle, though Triton compiles some (fp8e4nv, fp64)")


def _check_act_dtype(act_dtype: object) -> None:
    """Raise ValueError (:func:`_act_dtype_refusal`) for an ``act_dtype`` not in :data:`ACT_DTYPES`: Triton's
    compiler refused a torch name (``"float16"``) with a bare ``KeyError: 'float16'`` for every variant, and
    compiled ``"fp8e4nv"`` into a bundle that the board then refused to load."""
    refusal = _act_dtype_refusal(act_dtype)
    if refusal is not None:
        raise ValueError(refusal)


def _check_layouts(layouts: Iterable[str]) -> list[str]:
    """``layouts`` as a list, refusing a name that is not one of :data:`.layouts.LAYOUTS` (the kernel reads a tile
    transposed only for ``"transposed"``, so any other name would compile the plain kernel under that name)."""
    layouts = list(layouts)
    for layout in layouts:
        if layout not in LAYOUTS:
            raise ValueError(f"layouts entry {layout!r} is not a block-sparse layout: pass one of {LAYOUTS} (the "
                             f"layout the weights were exported in, export.sparse_layout)")
    return layouts


def _check_windows(windows: Iterable[int | None]) -> list[int]:
    """``windows`` as the kernel's ``WINDOW`` constexprs, each once, in order: None and 0 are full attention (0,
    as the runtime reads a layer's window), an integer >= 1 the positions a query sees (512.0, as JSON may give
    it, is 512). Raises ValueError naming the value for anything else: a negative window would compile full
    attention under a ``_w-4`` name, and the layer would attend past its window."""
    checked: list[int] = []
    for window in windows:
        value = 0 if window is None else window
        number = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
        if not number or not float(value).is_integer() or not 0 <= value <= _MAX_WINDOW:
            raise ValueError(f"windows entry {window!r} is not a sliding window: pass None (or 0) for full "
                             f"attention, or the number of positions a query sees, itself included, an integer "
                             f"in [1, {_MAX_WINDOW}]")
        if int(value) not in checked:
            checked.append(int(value))
    return checked


def _check_powers_of_two(what: str, values: Iterable[int], why: str) -> list[int]:
    """``values`` as ints (64.0, as JSON or YAML may give it, is 64), refusing one that is not a positive power of
    two (a ``tl.arange`` length), naming ``what``, the value and the power of two to pass instead: the smallest at
    or above it for a positive number, else any positive one."""
    checked = []
    for value in values:
        number = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
        whole = number and float(value).is_integer()
        if not whole or value <= 0 or int(value) & (int(value) - 1):
            instead = (f"pass {1 << (math.ceil(value) - 1).bit_length()}" if number and value > 0
                       else "pass a positive power of two")
            raise ValueError(f"{what} {value!r} is not a power of two, and the kernel tiles by it with tl.arange, "
                             f"which Triton compiles for positive powers of two only: {instead} ({why})")
        checked.append(int(value))
    return checked


def compile_variant(variant: KernelVariant, sm: int):
    """``triton.compile`` one variant for ``sm_{sm}``; returns Triton's CompiledKernel (``.asm``, ``.metadata``)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .triton_kernels import compiler_scope, get_kernel

    fn = get_kernel(variant.kernel, emulated=False)
    signature = variant.signature()
    # pointer arguments are declared 16-byte aligned (what @triton.jit infers for torch allocations), so tile
    # loads vectorise; the loader refuses unaligned pointers (see POINTER_ALIGNMENT)
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", POINTER_ALIGNMENT]]
             for name, ty in signature.items() if ty.startswith("*")}
    src = ASTSource(fn=fn, signature=signature, constexprs=dict(variant.constexprs), attrs=attrs)
    options = {"num_warps": variant.num_warps, "num_stages": variant.num_stages, "enable_fp_fusion": True}
    with compiler_scope():  # under TRITON_INTERPRET=1, triton.language's helpers as the compiler needs them
        return triton.compile(src, target=GPUTarget("cuda", sm, 32), options=options)


def ptx_entry_params(ptx: str, kernel_name: str) -> int | None:
    """How many parameters the PTX declares for ``.entry kernel_name`` (PTX ISA, "Kernel Function Declarations":
    ``.entry name ( .param ..., ... )``); None when the entry or its parameter list is not there to read."""
    found = re.search(r"\.entry\s+" + re.escape(kernel_name) + r"\s*\(([^)]*)\)", ptx)
    return None if found is None else len(re.findall(r"\.param\b", found.group(1)))


def abi_mismatch(variant: KernelVariant, ptx: str, kernel_name: str, triton_version: str) -> str | None:
    """Why the board's loader would launch this compiled kernel wrongly, or None. The loader passes the variant's
    runtime parameters and then :data:`TRAILING_PARAMS`, Triton 3.9's launcher ABI; a Triton that adds, drops or
    renames a hidden parameter compiles a kernel that takes another count, and the driver would read the missing
    ones from whatever memory follows (CUDA Driver API, ``cuLaunchKernel``: the count comes from the image)."""
    declared = ptx_entry_params(ptx, kernel_name)
    passed = len(variant.params()) + len(TRAILING_PARAMS)
    if declared is None or declared == passed:
        return None
    return (f"triton {triton_version} compiled {kernel_name} with {declared} kernel parameters, but the board's "
            f"loader passes {passed} ({len(variant.params())} runtime ones, then "
            f"{', '.join(name for name, _ in TRAILING_PARAMS)}: the launcher ABI of triton 3.9): compile with "
            f"triton==3.9.0 (pip install 'triton==3.9.0'), the version this edgesdk's kernels are written for")


def ptx_isa_version(ptx: str) -> str | None:
    """``"8.8"`` for PTX whose ``.version`` directive says 8.8 (PTX ISA, "PTX Module Directives: .version"): the
    ISA the board's driver must know to JIT it; None when the text has no such directive."""
    found = re.search(r"^\s*\.version\s+(\d+\.\d+)\b", ptx, re.MULTILINE)
    return None if found is None else found.group(1)


def ptxas_release(sm: int) -> str | None:
    """``"12.9, V12.9.86"`` for the ptxas Triton uses for ``sm``: a board driver older than this CUDA release may
    refuse the cubin (and needs a driver at least as new for the PTX)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas_version

        text = get_ptxas_version(sm)
    except Exception:  # noqa: BLE001 - informative only
        return None
    for line in str(text).splitlines():
        if "release" in line:
            return line.split("release", 1)[1].strip()
    return None


def _metadata(variant: KernelVariant, sm: int, compiled, tuning: KernelTuning, files: dict[str, str]) -> dict:
    import triton

    md = compiled.metadata
    cubin = compiled.asm["cubin"]
    return {
        "name": variant.name,
        "kernel_name": md.name,
        "kernel": variant.kernel,
        "sm": sm,
        "target": f"cuda:{sm}",
        "triton_version": triton.__version__,
        "ptx_version": ptx_isa_version(compiled.asm["ptx"]),  # the options' ptx_version is None unless forced
        "ptxas_release": ptxas_release(sm),
        "signature": [[name, ty] for name, ty in variant.signature().items()],  # kernel argument order
        "params": [[name, ty] for name, ty in variant.params()],
        "trailing_params": [list(p) for p in TRAILING_PARAMS],
        "pointer_alignment": POINTER_ALIGNMENT,
        "constexprs": variant.constexprs,
        "act_dtype": variant.act_dtype,
        "num_warps": md.num_warps,
        "num_stages": md.num_stages,
        "threads_per_block": 32 * md.num_warps,
        "shared_memory_bytes": md.shared,
        "global_scratch_size": md.global_scratch_size,
        "global_scratch_align": md.global_scratch_align,
        "profile_scratch_size": md.profile_scratch_size,
        "profile_scratch_align": md.profile_scratch_align,
        "fits_shared_memory": md.shared <= max_shared_per_block(tuning),
        "grid": variant.grid,
        "files": files,
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
        "ptx_sha256": hashlib.sha256(compiled.asm["ptx"].encode("utf-8")).hexdigest(),  # as compile_for_target writes it
        "tuning": tuning.to_dict(),
    }


def compile_for_target(sm: int, out_dir: Path, tuning: KernelTuning | None = None, *,
                       variants: Sequence[KernelVariant] | None = None) -> list[CompiledKernel]:
    """Compile every variant for ``sm_{sm}`` into ``out_dir/sm_{sm}/``; a refused variant is returned with
    ``ok=False`` and its error (and listed in ``index.json``) instead of raising, one whose ``act_dtype`` the
    board's loader does not launch (:data:`ACT_DTYPES`) included. The files of ``sm_{sm}/`` that the new
    ``index.json`` does not list (an earlier compile's) are deleted (:func:`_remove_unlisted`). Raises ValueError
    when two variants share a name (each is written to one ``{name}.cubin`` / ``.ptx`` / ``.json``, and the board's
    loader refuses an ``index.json`` that lists a name twice: loader.py ``first_named_twice``, the one check of
    both) and for a tuning of another SM."""
    from .loader import first_named_twice

    tuning = tuning or tuning_for(sm)
    if tuning.sm != sm:
        raise ValueError(f"tuning is for sm_{tuning.sm}, not sm_{sm}")
    variants = list(variants) if variants is not None else default_variants(tuning)
    twice = first_named_twice(variant.name for variant in variants)
    if twice is not None:
        raise ValueError(f"variants lists {twice!r} twice: each variant is written to {twice}.cubin, .ptx and .json "
                         f"and listed once in index.json; pass each variant once (give different variants different "
                         f"names)")
    target_dir = Path(out_dir) / f"sm_{sm}"
    target_dir.mkdir(parents=True, exist_ok=True)
    results: list[CompiledKernel] = []
    for variant in variants:
        refusal = _act_dtype_refusal(variant.act_dtype)
        if refusal is not None:  # Triton may compile it; the board's loader would refuse the bundle
            results.append(CompiledKernel(variant.name, sm, None, None, None, num_warps=variant.num_warps,
                                          num_stages=variant.num_stages, ok=False, error=refusal))
            continue
        threads = 32 * variant.num_warps
        if threads > MAX_THREADS_PER_BLOCK:  # Triton compiles it; the board's cuLaunchKernel would refuse it
            message = (f"runs {threads} threads a block (num_warps {variant.num_warps}), and CUDA launches at most "
                       f"{MAX_THREADS_PER_BLOCK} on every GPU: use num_warps <= {MAX_THREADS_PER_BLOCK // 32} "
                       "(the tuning's gemv_num_warps, gemm_num_warps or attn_num_warps)")
            results.append(CompiledKernel(variant.name, sm, None, None, None, num_warps=variant.num_warps,
                                          num_stages=variant.num_stages, ok=False, error=message))
            continue
        try:
            compiled = compile_variant(variant, sm)
        except Exception as exc:  # noqa: BLE001 - the compiler's refusal is the result we record
            message = f"{type(exc).__name__}: {exc}".strip()
            results.append(CompiledKernel(variant.name, sm, None, None, None, ok=False, error=message[:2000]))
            continue
        shared, limit = int(compiled.metadata.shared), max_shared_per_block(tuning)
        if shared > limit:  # the driver would refuse it on the board (cuFuncSetAttribute / cuLaunchKernel)
            message = (f"needs {shared} bytes of shared memory per block, and sm_{sm} with {tuning.shared_memory_kb} "
                       f"KB per SM allows {limit}: use a smaller block (bsr_block {tuning.bsr_block}), fewer "
                       f"num_stages ({variant.num_stages}) or a smaller attn_block_t")
            results.append(CompiledKernel(variant.name, sm, None, None, None, shared_memory_bytes=shared,
                                          num_warps=variant.num_warps, num_stages=variant.num_stages, ok=False,
                                          error=message))
            continue
        import triton

        abi = abi_mismatch(variant, compiled.asm["ptx"], compiled.metadata.name, triton.__version__)
        if abi is not None:
            results.append(CompiledKernel(variant.name, sm, None, None, None, shared_memory_bytes=shared,
                                          num_warps=variant.num_warps, num_stages=variant.num_stages, ok=False,
                                          error=abi))
            continue
        cubin_path = target_dir / f"{variant.name}.cubin"
        ptx_path = target_dir / f"{variant.name}.ptx"
        meta_path = target_dir / f"{variant.name}.json"
        cubin_path.write_bytes(compiled.asm["cubin"])
        ptx_path.write_bytes(compiled.asm["ptx"].encode("utf-8"))  # the bytes ptx_sha256 records
        files = {"cubin": cubin_path.name, "ptx": ptx_path.name}
        meta = _metadata(variant, sm, compiled, tuning, files)
        meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        results.append(CompiledKernel(variant.name, sm, cubin_path, ptx_path, meta_path,
                                      kernel_name=meta["kernel_name"], shared_memory_bytes=meta["shared_memory_bytes"],
                                      num_warps=meta["num_warps"], num_stages=meta["num_stages"]))
    index = {
        "sm": sm,
        "ptxas_release": ptxas_release(sm),
        "tuning": tuning.to_dict(),
        "kernels": [{k: (str(v.name) if isinstance(v, Path) else v) for k, v in asdict(r).items()} for r in results],
    }
    _remove_unlisted(target_dir, results)
    (target_dir / "index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return results


def _remove_unlisted(target_dir: Path, results: Sequence[CompiledKernel]) -> None:
    """Delete the ``.cubin`` / ``.ptx`` / ``.json`` files of ``target_dir`` that no compiled variant of
    ``results`` wrote (``index.json`` aside): an earlier compile's variants, or this one's refused ones. The
    loader follows ``index.json`` and never reads them, but a folder copied whole carries them to the board."""
    written = {path.name for result in results if result.ok
               for path in (result.cubin_path, result.ptx_path, result.meta_path) if path is not None}
    for path in target_dir.iterdir():
        if path.suffix in (".cubin", ".ptx", ".json") and path.name != "index.json" and path.name not in written \
                and path.is_file():
            path.unlink()
