"""ONNX Runtime backend (CPU execution provider; GPU providers plug in through ``providers``).

The KV cache never leaves ONNX Runtime: each step binds the previous step's ``present.*``
OrtValues as this step's ``past_key_values.*`` inputs through IO binding, so the decode loop
does no host-side copy of the cache; only the logits of the last position come back to numpy.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from edgesdk.bundle import capped_context, context_fix
from edgesdk.errors import BundleError, EdgeSDKError, RuntimeBackendError
from edgesdk.runtime.backend import (
    HIDDEN_STATES,
    NO_HIDDEN_STATES_OUTPUT,
    REBUILD_FOR_HIDDEN_STATES,
    checked_cache_state,
    checked_decode_id,
    checked_keep_logits,
    checked_rewind,
    checked_token_ids,
    prefill_passes,
)
from edgesdk.weights_file import REBUILD, GraphTensor, open_session, read_graph_tensors

# ONNX Runtime rewrites INT8 QDQ activations to UINT8 on x86 by default, and on a CPU with AVX2 but no
# VNNI its U8S8 kernels add byte-pair products in saturating 16 bits (VPMADDUBSW). Measured on tiny
# QDQ models: 0.8-1.8 % of the logit range off fake quantization with the default, exact (< 0.03 %)
# with INT8 activations kept (S8S8). Every session that may run a QDQ graph sets it.
EXACT_INT8_QDQ = ("session.qdqisint8allowed", "1")


# The most intra-op threads a session takes: ggml's GGML_MAX_N_THREADS, past which llama.cpp refuses a thread count.
MAX_THREADS = 512


def checked_threads(threads: object) -> int:
    """``threads`` as a count of intra-op threads (an int, a numpy integer too), or a RuntimeBackendError: ONNX Runtime
    takes 0 (and a negative count) without a word and sizes its pool by the machine's cores, so a caller that meant
    none or one got a spinning thread per core. A count past :data:`MAX_THREADS` is refused too, as llama.cpp refuses
    one past GGML_MAX_N_THREADS: onnxruntime started a thread for each (a spinning pool of thousands on a board of
    four cores), and one past 2**31 - 1 failed in pybind11's words ("incompatible function arguments"), reported as a
    bundle ONNX Runtime could not load."""
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or not 1 <= threads <= MAX_THREADS:
        raise RuntimeBackendError(f"threads={threads!r}: expected a whole number of intra-op threads of at least 1 "
                                  f"and at most {MAX_THREADS} (onnxruntime reads 0 as one per core)",
                                  "pass threads=N with N >= 1, at most the board's cores (1 where another engine "
                                  "computes beside this one)")
    return int(threads)


def make_session_options(threads: int, spinning: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = checked_threads(threads)
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    # Spinning threads win on an idle board; off where a second engine computes beside this one (the
    # power stage's profiler), since two spinning pools on few cores slow each other down several-fold.
    # The thermal guard's poller sleeps between readings and costs 0.2 % of a step with spinning on.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.add_session_config_entry(*EXACT_INT8_QDQ)
    return options


# The first onnxruntime release PyPI has no wheels of for Python 3.10 (1.24's are cp311 and later): a bundle that
# needs it cannot run under a board's Python 3.10 however pip is asked.
ONNXRUNTIME_PYTHON_311 = (1, 24)
# The rebuilds whose graph needs no onnxruntime that counts the query in GroupQueryAttention's local_window_size
# (export/fused_graph.py SLIDING_WINDOW_ONNXRUNTIME): the standard graph masks the window itself, and a context within
# the window sets none.
WINDOW_REBUILD = ("rebuild the bundle on the host with the standard graph ('edgesdk build --recipe int8-qdq', which "
                  "masks the window itself on any onnxruntime) or with a context within the window ('edgesdk build "
                  "--max-context N', N at most the model's sliding_window, 512 in Gemma 3 270M and 1B)")


def check_onnxruntime_version(installed: str, needed: tuple[tuple[int, int], str] | None, form: str) -> None:
    """Refuse, before loading, a graph form the installed onnxruntime cannot run (its own error
    is an INVALID_GRAPH about an operator's output count, which names neither version)."""
    if needed is None:
        return
    (major, minor), feature = needed
    try:
        have = tuple(int(part) for part in installed.split(".")[:2])
    except ValueError:  # a development build: let the session say whether it can
        return
    if have >= (major, minor):
        return
    rebuild = WINDOW_REBUILD if "local_window_size" in feature else "rebuild the bundle with a recipe without that form"
    if (major, minor) >= ONNXRUNTIME_PYTHON_311 and sys.version_info < (3, 11):
        python = ".".join(str(part) for part in sys.version_info[:3])
        raise RuntimeBackendError(
            f"the bundle's '{form}' graph needs onnxruntime >= {major}.{minor} ({feature}); this machine has "
            f"{installed}, and PyPI's onnxruntime {ONNXRUNTIME_PYTHON_311[0]}.{ONNXRUNTIME_PYTHON_311[1]} and later "
            f"are built for Python 3.11 and newer only: pip install 'onnxruntime>={major}.{minor}' finds none for "
            f"this Python {python}",
            "run the bundle with Python 3.11 or newer on the board: a venv of its own (python3.11 -m venv VENV && "
            f"VENV/bin/pip install edgesdk 'onnxruntime>={major}.{minor}'), or 'edgesdk deploy BUNDLE --host "
            f"user@board --remote-python python3.11', which makes the board's runtime venv with it; or {rebuild}",
        )
    raise RuntimeBackendError(
        f"the bundle's '{form}' graph needs onnxruntime >= {major}.{minor} ({feature}); "
        f"this machine has {installed}",
        f"pip install 'onnxruntime>={major}.{minor}' (on a Jetson, an onnxruntime-gpu wheel of that "
        f"version or later), or {rebuild}",
    )


def check_providers_started(requested: list[str], started: list[str]) -> None:
    """Refuse a session that runs without an execution provider asked for. ONNX Runtime lists a GPU
    provider whose libraries it then cannot load (a CUDA or cuDNN of another JetPack) and opens the
    session on the rest, logging only (onnxruntime issues #17801, #23372): the backend would be
    reported as used while the model runs on the CPU, and the chain would not go on."""
    missing = [provider for provider in requested if provider not in started]
    if missing:
        raise RuntimeBackendError(
            f"onnxruntime could not start {', '.join(missing)}; the session it opened runs on "
            f"{', '.join(started) or 'no provider'} only (onnxruntime logs why)",
            "install the CUDA, cuDNN (and for ort-trt, TensorRT) libraries this onnxruntime-gpu was built for "
            "(on a Jetson, the wheel for its JetPack); 'edgesdk env' shows what is installed; "
            "or pass --backend ort-cpu",
        )


def rotary_problems(tensors: list[GraphTensor], max_context: int) -> list[str]:
    """What in the graph's rotary tables (the cos and sin initializers the exporter names ``rotary.cos`` and
    ``rotary.sin``, or ``rotary.N.cos`` for a model's further rotary settings: export/llama_graph.py
    ``rotary_name``) disagrees with the manifest: a table is (positions, columns), cos and sin alike (their
    width against head_dim is the graph-facts check's, edgesdk/runtime/session.py, which names head_dim
    by the KV cache), and holds every position up to ``max_context``. Past its last
    row the step that reaches that position fails (GroupQueryAttention: "cos_cache dimension 0 shall not
    be less than total_sequence_length"; the standard graph's Gather: an index out of bounds), so the
    bundle is refused here, before any step."""
    tables = {tensor.name: tensor.dims for tensor in tensors if tensor.name.startswith("rotary.")
              and tensor.name.rsplit(".", 1)[-1] in ("cos", "sin")}
    problems = []
    for name, dims in sorted(tables.items()):
        partner = name[:-3] + ("sin" if name.endswith("cos") else "cos")
        if name.endswith("cos") and partner in tables and tables[partner] != dims:
            problems.append(f"the rotary tables {name!r} {dims} and {partner!r} {tables[partner]} differ in shape")
        if len(dims) != 2:
            problems.append(f"the rotary table {name!r} has shape {dims}; expected (positions, columns)")
        elif dims[0] < max_context:
            problems.append(f"'graph.max_context' is {max_context}, but the rotary table {name!r} holds {dims[0]} "
                            f"positions: a sequence longer than {dims[0]} tokens would fail in the step that reaches "
                            "it")
    return problems


class ClosedSession:
    """What a closed backend holds in place of its ``InferenceSession``: any use of it (its inputs, an IO binding, a
    run) is a RuntimeBackendError naming the closed backend, not an AttributeError on None."""

    def __init__(self, backend: str):
        self._backend = backend

    def __getattr__(self, name: str):
        raise closed_error(self._backend, f"session.{name}")


def closed_error(backend: str, call: str) -> RuntimeBackendError:
    """The error of ``call`` on an ONNX Runtime backend that :meth:`OrtDecoderBase.close` gave back."""
    return RuntimeBackendError(f"{call} on the closed {backend} backend: close() gave back its ONNX Runtime session "
                               "(the model's weights) and KV cache",
                               "open the bundle again (edgesdk.load, or open_runtime) to run it; a closed backend "
                               "stays closed")


@contextmanager
def closed_on_error(backend: OrtDecoderBase):
    """Give back ``backend``'s session (:meth:`OrtDecoderBase.close`) where the block fails while the backend is
    being built (its first KV buffers, sized by the graph facts, do not fit in memory): the half-built backend, and
    with it the model's weights, lived on in the error's traceback (a REPL's last one, an error chained by the
    opener, which names the failure as the KV cache's) for as long as that was kept."""
    try:
        yield
    except BaseException:
        backend.close()
        raise


class OrtDecoderBase:
    """What both graph forms share: the session, the graph facts, prefill/decode on ``_run``."""

    load_hint = "run 'edgesdk verify' on the bundle; check 'edgesdk env' for the installed onnxruntime"
    # The oldest onnxruntime that runs this graph form, and the operator feature that sets it.
    min_onnxruntime: tuple[tuple[int, int], str] | None = None
    # The most tokens one pass of a prefill runs: a longer prompt (and in the standard form, hidden_states' ids)
    # runs in passes of this many, each on top of the ones before it in the KV cache (:func:`prefill_passes`), as the
    # tensorrt backend runs one longer than its engine's profile, so an ort-trt profile need only hold this many
    # input ids, not max_context. None: the whole prompt in one pass.
    max_prefill: int | None = None
    # the model's max_position_embeddings its bundle's manifest records (edgesdk.runtime.session.open_backend), which
    # a refusal of a sequence past max_context names as the most a rebuild gives; None: not recorded, or not opened
    # from one
    model_positions: int | None = None
    # the context the bundle was built with where the run holds less (llama.cpp's -c N: Runtime.cap_context sets it
    # as it lowers max_context), which a refusal past max_context names, with raising -c as its fix; None: uncapped
    built_context: int | None = None
    # what held the run there (Runtime.cap_context's ``source``: -c, LLAMA_ARG_CTX_SIZE, load()'s n_ctx), which that
    # refusal names, and whose setting its fix raises
    context_source: str = "-c"

    def __init__(self, model_path: Path, graph: dict, threads: int, providers: list[str] | None = None,
                 spinning: bool = True, provider_options: list[dict] | None = None):
        import onnxruntime as ort

        model_path = Path(model_path)  # a str too: the weights reader takes the file's name and directory from it
        check_onnxruntime_version(ort.__version__, self.min_onnxruntime, graph.get("form", "standard"))
        if graph.get("min_onnxruntime"):  # a feature of this bundle's graph (a sliding window) needs a newer one
            major, minor = graph["min_onnxruntime"][:2]
            check_onnxruntime_version(ort.__version__, ((int(major), int(minor)), str(graph.get(
                "min_onnxruntime_for", "a feature of this graph"))), graph.get("form", "standard"))
        self.providers = providers or ["CPUExecutionProvider"]
        self.name = "ort-cpu" if self.providers == ["CPUExecutionProvider"] else "ort-" + self.providers[0]
        # the graph facts are read before the session opens: one that cannot be read leaves no session held
        self.kv_heads = list(graph["kv_heads"])
        self.head_dim = int(graph["head_dim"])
        self.max_context = int(graph["max_context"])
        self.vocab_size = int(graph["vocab_size"])
        self._position = 0
        self._closed = False
        initializers, dangling_inputs = read_graph_tensors(model_path)
        problems = rotary_problems(initializers, self.max_context)
        if problems:
            raise BundleError(f"bundle {model_path.parent}: the manifest's graph facts do not describe "
                              f"{model_path.name}:\n  - " + "\n  - ".join(problems), REBUILD)
        try:
            self.session = open_session(model_path, make_session_options(threads, spinning), self.providers,
                                        graph.get("weights"), provider_options=provider_options,
                                        graph_tensors=(initializers, dangling_inputs))
        except EdgeSDKError:  # a damaged weights file, no room to inflate it: already named
            raise
        except Exception as exc:  # onnxruntime raises its own exception types per failure
            raise RuntimeBackendError(
                f"ONNX Runtime could not load {model_path} with {self.providers}: {exc}", self.load_hint,
            ) from exc
        try:
            check_providers_started(self.providers, self.session.get_providers())
        except RuntimeBackendError:  # the session goes now, not when the error's traceback (kept at a REPL) lets it go
            self.session = ClosedSession(self.name)
            raise
        self._ort = ort

    @property
    def position(self) -> int:
        """Tokens currently in the KV cache."""
        return self._position

    def close(self) -> None:
        """Give back the ONNX Runtime session (the model's weights, the execution providers' buffers) and the KV
        cache now, as llama-cpp-python's ``Llama.close()`` frees its model, rather than when the last reference to
        this backend goes (a model still referenced while another bundle loads held both sets of weights). Every
        later step, rewind or cache copy is a RuntimeBackendError naming the closed backend; ``reset`` still
        empties the (dropped) cache, and closing again does nothing."""
        self._closed = True
        self._position = 0
        self.session = ClosedSession(self.name)
        self._drop_cache()

    def _drop_cache(self) -> None:
        """Let go of the KV cache and of everything bound to the session (:meth:`close`)."""

    def _check_open(self, call: str) -> None:
        """Refuse ``call`` on a backend :meth:`close` gave back."""
        if self._closed:
            raise closed_error(self.name, call)

    def _check_length(self, total: int, shorten: str = "shorten the prompt or --max-new-tokens") -> None:
        """Refuse a sequence of ``total`` tokens past max_context; ``shorten`` names what the caller can shorten, and
        the fix the --max-context a rebuild takes to hold more, or that none does (edgesdk.bundle.context_fix); in a
        run held below the bundle's context (``built_context``), that context and raising what held it first (-c, or
        its ``context_source``)."""
        if total > self.max_context:
            exceeded = capped_context(self.max_context, self.built_context, self.context_source) or \
                f"the bundle's max_context {self.max_context}"
            raise RuntimeBackendError(
                f"sequence of {total} tokens exceeds {exceeded}",
                context_fix(shorten, self.max_context, self.model_positions, total, built=self.built_context,
                            source=self.context_source),
            )

    def _run(self, ids: np.ndarray, keep: int) -> np.ndarray:
        raise NotImplementedError

    def _check_rewind(self, length: int) -> None:
        """Refuse a ``rewind`` length that is no whole number from 0 to the position (:func:`checked_rewind`)."""
        self._check_open("rewind")
        checked_rewind(length, self._position)

    def _checked_state(self, state: object) -> int:
        """The length of a :meth:`save_cache` ``state`` this backend's cache can take (:func:`checked_cache_state`)."""
        self._check_open("load_cache")
        return checked_cache_state(state, self.kv_heads, self.head_dim, np.dtype(np.float32), self.max_context)

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        """Run ``token_ids`` (T,) after the cache, in passes of at most ``max_prefill`` tokens where that is set; the
        logits of the last ``min(keep_logits, T)`` positions."""
        self._check_open("prefill")
        keep_logits = checked_keep_logits(keep_logits)
        given = np.asarray(token_ids)
        if given.size == 0:  # the graphs cannot run 0 tokens (onnxruntime's Reshape / GroupQueryAttention error)
            raise RuntimeBackendError("prefill of 0 tokens: there is no position whose logits it could return",
                                      "pass at least one token id (the prompt's last token gives the next "
                                      "token's logits)")
        ids = self._checked_ids(token_ids, "prefill")
        keep, total = min(keep_logits, ids.shape[1]), ids.shape[1]
        if self.max_prefill is None or total <= self.max_prefill:
            return self._run(ids, keep)
        self._check_length(self._position + total)  # before the first pass: a prompt refused leaves the cache as it was
        kept = []
        for start, end, rows in prefill_passes(total, keep, self.max_prefill):
            logits = self._run(ids[:, start:end], max(rows, 1))  # (1, end - start) ids -> (rows or 1, vocab)
            if rows:
                kept.append(logits[-rows:])
        return np.concatenate(kept, axis=0)

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; its next-token logits (vocab,). Anything but one id is refused (:func:`checked_decode_id`):
        a (1,) array was fed as (1, 1, 1) ids."""
        if self._closed:
            raise closed_error(self.name, "decode")
        ids = np.array([[token_id]])
        if not (ids.ndim == 2 and ids.dtype.kind in "iu" and 0 <= ids[0, 0] < self.vocab_size):  # the hot path
            ids = checked_decode_id(token_id, self.vocab_size)
        return self._run(ids.astype(np.int64, copy=False), 1)[0]

    def _checked_ids(self, given: object, call: str) -> np.ndarray:
        """``given`` as (1, T) int64 ids of this graph's vocabulary (:func:`checked_token_ids`), taken as the caller
        gave them: a list read by ``np.asarray`` first made [-1, 2**63] a float64 array, refused as "expected whole
        numbers" rather than by its id out of the vocabulary."""
        return checked_token_ids(given, self.vocab_size, call)

    @property
    def gives_hidden_states(self) -> bool:
        """Whether the graph outputs the hidden states (a bundle exported before graphs gave them, or the QDQ form
        TensorRT builds from, does not). On a closed backend, the closed backend's error naming ``hidden_states``,
        the call that asks (embeddings check this first), not the closed session's."""
        self._check_open("hidden_states")
        return HIDDEN_STATES in {value.name for value in self.session.get_outputs()}

    def hidden_states(self, token_ids: np.ndarray) -> np.ndarray:
        """The final-norm hidden states (T, hidden) of ``token_ids`` run as a sequence of their own: what
        embeddings pool. The KV cache is left as it was (the sequence runs beside it, not after it)."""
        self._check_open("hidden_states")
        given = np.asarray(token_ids)
        if given.size == 0:
            raise RuntimeBackendError("hidden states of 0 tokens: there is no position to return",
                                      "pass at least one token id")
        ids = self._checked_ids(token_ids, "hidden states")
        if not self.gives_hidden_states:
            raise RuntimeBackendError(NO_HIDDEN_STATES_OUTPUT, REBUILD_FOR_HIDDEN_STATES)
        # nothing is generated here: the input is what can be shorter
        self._check_length(ids.shape[1], f"embed at most {self.max_context} tokens (truncate the input)")
        return self._run_hidden(ids)[0]  # (1, T, D) -> (T, D)

    def _run_hidden(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class OrtBackend(OrtDecoderBase):
    """Drives the standard decoder graph (export/llama_graph.py interface) with IO binding."""

    def __init__(self, model_path: Path, graph: dict, threads: int, providers: list[str] | None = None,
                 spinning: bool = True, provider_options: list[dict] | None = None):
        super().__init__(model_path, graph, threads, providers, spinning, provider_options)
        self._past_names = [f"past_key_values.{i}.{kind}" for i in range(len(self.kv_heads))
                            for kind in ("key", "value")]
        self._present_names = [name.replace("past_key_values", "present") for name in self._past_names]
        self._previous_binding = None
        with closed_on_error(self):
            self.reset()

    def reset(self) -> None:
        self._position = 0
        self._past = [
            self._ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kv, 0, self.head_dim), np.float32))
            for kv in self.kv_heads for _ in range(2)
        ]

    def rewind(self, length: int) -> None:
        """Keep the first ``length`` tokens of the cache. Each past tensor's shape holds its length, so
        the kept entries are copied into new tensors (B, Hkv, length, hd), never viewed: a view (one KV
        head makes a shorter slice contiguous too) would not keep a :meth:`load_cache` state's arrays
        alive once the store lets go of them. At the whole length nothing changes."""
        self._check_rewind(length)
        length = int(length)
        if length == 0:
            self.reset()
            return
        if length == self._position:
            return
        self._past = [self._ort.OrtValue.ortvalue_from_numpy(value.numpy()[:, :, :length].copy())
                      for value in self._past]
        self._position = length

    def save_cache(self) -> tuple[list[np.ndarray], int]:
        """A host copy of the cache, (B, Hkv, position, hd) per past tensor, and its bytes."""
        self._check_open("save_cache")
        state = [np.array(value.numpy(), copy=True) for value in self._past]
        return state, sum(array.nbytes for array in state)

    def load_cache(self, state: list[np.ndarray]) -> None:
        """Make a :meth:`save_cache` copy the cache (the copy is only read, never written); one that does not fit
        this backend's cache is refused by name, the cache left as it was (:meth:`_checked_state`)."""
        length = self._checked_state(state)
        self._past = [self._ort.OrtValue.ortvalue_from_numpy(array) for array in state]
        self._position = length

    def _drop_cache(self) -> None:
        self._past, self._previous_binding = [], None

    def _run(self, ids: np.ndarray, keep: int) -> np.ndarray:
        self._check_length(self._position + ids.shape[1])
        # A fresh binding per step; the previous one stays alive until this step has run, because
        # with onnxruntime <= 1.23 the OrtValues from get_outputs() live in their binding.
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("num_logits_to_keep", np.array([keep], np.int64))
        for name, value in zip(self._past_names, self._past, strict=False):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", "cpu")
        for name in self._present_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        self._previous_binding = binding
        self._past = list(outputs[1:])  # present -> next past, no copy
        self._position += ids.shape[1]
        return outputs[0].numpy()[0]  # (keep, vocab)

    def _run_hidden(self, ids: np.ndarray) -> np.ndarray:
        """(1, T, D) hidden states of ``ids`` from an empty cache of their own, in passes of at most ``max_prefill``
        tokens where that is set (an ort-trt profile holds no more input ids), each on top of the keys and values of
        the ones before it, as :meth:`prefill` runs a longer prompt; the backend's KV cache is not touched."""
        total = ids.shape[1]
        past = [np.zeros((1, kv, 0, self.head_dim), np.float32) for kv in self.kv_heads for _ in range(2)]
        hidden = []
        for start, end, _ in prefill_passes(total, 1, self.max_prefill or total):
            feeds = {"input_ids": ids[:, start:end], "num_logits_to_keep": np.array([1], np.int64),
                     **dict(zip(self._past_names, past, strict=True))}
            presents = self._present_names if end < total else []  # the last pass's keys and values are not needed
            hidden_pass, *past = self.session.run([HIDDEN_STATES, *presents], feeds)  # (1, end - start, D)
            hidden.append(hidden_pass)
        return np.concatenate(hidden, axis=1)  # (1, T, D)
