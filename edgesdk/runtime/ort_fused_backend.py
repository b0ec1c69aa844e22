"""ONNX Runtime backend for the fused graph form (export/fused_graph.py).

The KV cache is one preallocated buffer per layer and kind, owned here as numpy arrays and bound
as both the past input and the present output of GroupQueryAttention, which writes the new
keys and values in place: a decode step copies nothing. The buffers grow by doubling (one copy
per doubling) up to the bundle's max_context.

Single-token decode steps reuse one IO binding: the token, the lengths and every output live in
numpy arrays bound once, and a step only writes three numbers before ``run_with_iobinding``.
Binding 60 cache buffers and creating the small input tensors anew each step made SmolLM2-135M's
decode 8-13 % slower (tests/benchmarks/test_decode_binding.py, three alternating runs). Prompts
(more than one token) bind afresh, since their shapes vary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.runtime.backend import HIDDEN_STATES
from edgesdk.runtime.ort_backend import OrtDecoderBase, closed_on_error

INITIAL_CAPACITY = 256


class OrtFusedBackend(OrtDecoderBase):
    min_onnxruntime = ((1, 20), "GroupQueryAttention with a shared KV buffer")
    output_names: tuple[str, ...] = ("logits",)  # bound outputs, in the order _consume receives them

    def __init__(self, model_path: Path, graph: dict, threads: int, providers: list[str] | None = None,
                 spinning: bool = True, provider_options: list[dict] | None = None):
        super().__init__(model_path, graph, threads, providers, spinning, provider_options)
        self._names = [(f"past_key_values.{i}.{kind}", f"present.{i}.{kind}")
                       for i in range(len(self.kv_heads)) for kind in ("key", "value")]
        # Inputs of graph variants, fed their neutral value (the power-gated graph's threshold tau = 0: every FFN
        # runs, with the adapters' channel and head scales acting: the gated model the build validates the graph
        # against, not the loaded model, which OrtGatedBackend's gating-off tau computes).
        self._neutral_inputs = {name: 0.0 for name in ("tau",) if name in graph.get("inputs", {})}
        self._capacity = 0
        self._buffers: list[np.ndarray] = []
        self._values: list = []
        self._decode_step: _DecodeStep | None = None
        with closed_on_error(self):
            self._allocate(min(INITIAL_CAPACITY, self.max_context))
        self.reset()

    def reset(self) -> None:
        self._position = 0  # stale cache entries beyond the position are never read

    def rewind(self, length: int) -> None:
        """Keep the first ``length`` tokens of the cache: the buffers stay, later entries are overwritten."""
        self._check_rewind(length)
        self._position = int(length)

    def save_cache(self) -> tuple[list[np.ndarray], int]:
        """A host copy of the cache's first ``position`` entries, (B, Hkv, position, hd) per buffer, and its bytes."""
        self._check_open("save_cache")
        state = [buffer[:, :, : self._position].copy() for buffer in self._buffers]
        return state, sum(array.nbytes for array in state)

    def load_cache(self, state: list[np.ndarray]) -> None:
        """Copy a :meth:`save_cache` state into the buffers (grown to hold it); one that does not fit this backend's
        cache is refused by name, the cache left as it was (:meth:`_checked_state`)."""
        length = self._checked_state(state)
        self._position = 0  # nothing of the old cache is kept through a reallocation
        if length > self._capacity:
            self._allocate(min(self.max_context, max(2 * self._capacity, length)))
        for buffer, saved in zip(self._buffers, state, strict=True):
            buffer[:, :, :length] = saved
        self._position = length

    def _allocate(self, capacity: int) -> None:
        """(Re)allocate the shared KV buffers, keeping the first ``position`` entries."""
        kept = self._position
        buffers = []
        for index, kv in enumerate(kv for kv in self.kv_heads for _ in range(2)):
            buffer = np.zeros((1, kv, capacity, self.head_dim), np.float32)  # (B, Hkv, cap, hd)
            if self._buffers and kept:
                buffer[:, :, :kept] = self._buffers[index][:, :, :kept]
            buffers.append(buffer)
        self._buffers = buffers
        self._values = [self._ort.OrtValue.ortvalue_from_numpy(b) for b in buffers]  # views, no copy
        self._capacity = capacity
        self._decode_step = None  # bound to the old buffers

    def _drop_cache(self) -> None:
        self._buffers, self._values, self._capacity, self._decode_step = [], [], 0, None

    def _step_inputs(self) -> dict[str, float]:
        """Scalar float inputs of this step besides the token and lengths (graph variants)."""
        return self._neutral_inputs

    def _consume(self, outputs: list[np.ndarray]) -> np.ndarray:
        """The step's bound outputs (``output_names`` order) -> logits (keep, vocab)."""
        return outputs[0][0]

    def _run(self, ids: np.ndarray, keep: int) -> np.ndarray:
        total = self._position + ids.shape[1]
        self._check_length(total)
        if total > self._capacity:
            self._allocate(min(self.max_context, max(2 * self._capacity, total)))
        step = self._decode_step
        if ids.shape[1] == 1 and keep == 1 and step is not None and step.session is self.session:
            outputs = step.run(int(ids[0, 0]), total, self._step_inputs())
        else:
            outputs = self._run_fresh(ids, keep, total)
            if ids.shape[1] == 1 and keep == 1:  # the first decode step: its outputs give shapes and types
                self._decode_step = _DecodeStep(self, outputs)
        self._position = total
        return self._consume(outputs)

    def _run_hidden(self, ids: np.ndarray) -> np.ndarray:
        """(1, T, D) hidden states of ``ids`` as a sequence of their own, with the graph variants' inputs at their
        neutral value (the gated graph's tau 0 here: every FFN runs, with the adapters' scales). Their keys and
        values go to scratch buffers of T entries, so the KV cache (and the decode step bound to it) is left as it
        was."""
        total = ids.shape[1]
        scratch = [self._ort.OrtValue.ortvalue_from_numpy(np.zeros((1, kv, total, self.head_dim), np.float32))
                   for kv in self.kv_heads for _ in range(2)]  # (B, Hkv, T, hd) per layer and kind
        return self._run_fresh(ids, 1, total, (HIDDEN_STATES,), self._neutral_inputs, scratch)[0]

    def _run_fresh(self, ids: np.ndarray, keep: int, total: int, output_names: tuple[str, ...] | None = None,
                   step_inputs: dict[str, float] | None = None, buffers: list | None = None) -> list[np.ndarray]:
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        binding.bind_cpu_input("num_logits_to_keep", np.array([keep], np.int64))
        for name, value in (self._step_inputs() if step_inputs is None else step_inputs).items():
            binding.bind_cpu_input(name, np.array(value, np.float32))
        output_names = self.output_names if output_names is None else output_names
        for name in output_names:  # bound first: get_outputs() lists them first, in order
            binding.bind_output(name, "cpu")
        for (past, present), value in zip(self._names, self._values if buffers is None else buffers, strict=True):
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)  # same buffer: updated in place
        self.session.run_with_iobinding(binding)
        return [value.numpy() for value in binding.get_outputs()[: len(output_names)]]


class _DecodeStep:
    """One IO binding for every single-token step over the current KV buffers.

    Inputs and outputs are numpy arrays wrapped (not copied) as OrtValues, so writing the token
    and lengths into them is all a step needs; the outputs are copied out, as the next step
    overwrites them.
    """

    def __init__(self, backend: OrtFusedBackend, first_outputs: list[np.ndarray]):
        ort = backend._ort
        self.session = backend.session
        self.token = np.zeros((1, 1), np.int64)  # (B, S)
        self.seqlens = np.zeros((1,), np.int32)  # (B,): total - 1
        self.total = np.zeros((), np.int32)
        self.extra = {name: np.zeros((), np.float32) for name in backend._step_inputs()}
        self.outputs = [np.empty_like(output) for output in first_outputs]
        binding = self.session.io_binding()
        fixed = {"input_ids": self.token, "seqlens_k": self.seqlens, "total_sequence_length": self.total,
                 "num_logits_to_keep": np.ones((1,), np.int64), **self.extra}
        self._keep_alive = fixed  # the bound OrtValues point into these arrays (num_logits_to_keep's too)
        for name, array in fixed.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array))
        for name, array in zip(backend.output_names, self.outputs, strict=True):
            binding.bind_ortvalue_output(name, ort.OrtValue.ortvalue_from_numpy(array))
        for (past, present), value in zip(backend._names, backend._values, strict=True):
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self.binding = binding

    def run(self, token: int, total: int, extra: dict[str, float]) -> list[np.ndarray]:
        self.token[0, 0] = token
        self.seqlens[0] = total - 1
        self.total[()] = total
        for name, value in extra.items():
            self.extra[name][()] = value
        self.session.run_with_iobinding(self.binding)
        return [output.copy() for output in self.outputs]
