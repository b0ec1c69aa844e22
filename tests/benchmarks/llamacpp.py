"""llama.cpp (llama-cpp-python) as the speed and quality baseline, for benchmarks only.

GGUF variants of the same model are made with llama.cpp's own quantizer from the source GGUF
(``allow_requantize``: the source is SmolLM2's Q4_1 file, so every variant starts from those
weights, as the bundles do) and cached beside it.

On a CPU with AMX this llama-cpp-python build puts quantized weights in its AMX buffer, whose kernel faults
(SIGSEGV at ``ldtilecfg``: GCC 12 drops the stores to most of the tile configuration, llama.cpp issue #20824);
there every engine here keeps its weights in plain CPU buffers (``use_extra_bufts`` off, llama.cpp's
``--no-extra-bufts``), which :func:`amx_faults` says, and the benchmarks print. A llama-cpp-python built
without AMX (``CMAKE_ARGS=-DGGML_AMX_INT8=OFF``, or by clang) runs with its repacked buffers.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from pathlib import Path

import numpy as np


def amx_faults() -> bool:
    """This CPU has AMX and this llama.cpp build puts weights in its AMX buffer (``AMX_INT8 = 1`` in its system
    info): the combination whose kernel faults. A build without AMX (clang's, or one built with GGML_AMX off)
    keeps its repacked buffers."""
    import llama_cpp

    try:
        amx_cpu = "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return amx_cpu and b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


@contextlib.contextmanager
def plain_cpu_buffers(wanted: bool | None = None):
    """Models loaded inside keep their weights in plain CPU buffers (no AMX or repacked copies) when ``wanted``
    (by default where :func:`amx_faults`)."""
    if not (amx_faults() if wanted is None else wanted):
        yield
        return
    from llama_cpp import llama_cpp as api

    default_params = api.llama_model_default_params

    def model_params():
        params = default_params()
        params.use_extra_bufts = False
        return params

    api.llama_model_default_params = model_params
    try:
        yield
    finally:
        api.llama_model_default_params = default_params


QUANT_TYPES = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
               "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def quantized_gguf(source: Path, kind: str, cache: Path) -> Path:
    """The ``kind`` variant of ``source``, made once with llama_model_quantize."""
    import llama_cpp

    out = cache / f"{source.stem}.{kind}.gguf"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, QUANT_TYPES[kind])
    params.allow_requantize = True
    params.nthread = 2
    partial = out.with_name(out.name + ".partial")
    status = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
    if status != 0:
        raise RuntimeError(f"llama_model_quantize {kind} failed with status {status}")
    partial.rename(out)
    return out


class LlamaCppEngine:
    """Greedy prefill + decode timing and per-window logits through llama.cpp."""

    def __init__(self, gguf: Path, threads: int = 2, context: int = 512, logits_all: bool = False,
                 use_mmap: bool = True):
        import llama_cpp

        self.path = gguf
        # use_mmap=False reads the weights into malloc'd memory, which glibc's huge-page tunable
        # covers as it covers ONNX Runtime's; mapped from the file they stay on 4 KiB pages.
        with plain_cpu_buffers():
            self.llm = llama_cpp.Llama(str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=context,
                                       n_batch=context, logits_all=logits_all, use_mmap=use_mmap, verbose=False)
        self.vocab = self.llm.n_vocab()

    def last_logits(self) -> np.ndarray:
        """Logits (V,) of the last token evaluated, read from llama.cpp itself: without
        ``logits_all`` llama-cpp-python's ``eval`` leaves ``Llama.scores`` unwritten."""
        import llama_cpp

        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm.ctx, -1), shape=(self.vocab,))

    def time_generation(self, prompt: list[int], new_tokens: int) -> tuple[float, float]:
        """(prefill tok/s, decode tok/s), greedy, as edgesdk.runtime.generate times itself."""
        llm = self.llm
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        prefill_s = time.perf_counter() - start
        token = int(np.argmax(self.last_logits()))
        start = time.perf_counter()
        for _ in range(new_tokens - 1):
            llm.eval([token])
            token = int(np.argmax(self.last_logits()))
        decode_s = time.perf_counter() - start
        return len(prompt) / prefill_s, (new_tokens - 1) / decode_s

    def score_window(self, window: np.ndarray) -> np.ndarray:
        """Logits (T, V) of one window from an empty cache (needs ``logits_all=True``)."""
        self.llm.reset()
        self.llm.eval(window.tolist())
        return np.array(self.llm.scores[: len(window)], dtype=np.float32)


def alternated(runners: dict, repeats: int) -> dict[str, list]:
    """Each runner's results over ``repeats`` rounds, engines taking turns with a pause between (one untimed run
    each first): on 2 cores two engines' thread pools must not overlap."""
    for run in runners.values():
        run()
    runs = {name: [] for name in runners}
    for _ in range(repeats):
        for name, run in runners.items():
            time.sleep(1)
            runs[name].append(run())
    return runs
