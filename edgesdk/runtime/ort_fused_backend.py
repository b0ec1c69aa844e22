"""ONNX Runtime backend for the fused graph form (export/fused_graph.py).

The KV cache is one preallocated buffer per layer and kind, owned here as numpy arrays and bound
as both the past input and the present output of GroupQueryAttention, which writes the new
keys and values in place: a decode step copies nothing. The buffers grow by doubling (one copy
per doubling) up to the bundle's max_context.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.runtime.ort_backend import OrtDecoderBase

INITIAL_CAPACITY = 256


class OrtFusedBackend(OrtDecoderBase):
    load_hint = "run 'edgesdk verify' on the bundle; the fused form needs onnxruntime >= 1.20 (see 'edgesdk env')"

    def __init__(self, model_path: Path, graph: dict, threads: int, providers: list[str] | None = None,
                 spinning: bool = True):
        super().__init__(model_path, graph, threads, providers, spinning)
        self._names = [(f"past_key_values.{i}.{kind}", f"present.{i}.{kind}")
                       for i in range(len(self.kv_heads)) for kind in ("key", "value")]
        # Inputs of graph variants, fed their neutral value (the power-gated graph's threshold
        # tau = 0: every FFN runs, the plain decoder's function).
        self._neutral_inputs = {name: np.array(0.0, np.float32) for name in ("tau",)
                                if name in graph.get("inputs", {})}
        self._capacity = 0
        self._buffers: list[np.ndarray] = []
        self._values: list = []
        self._allocate(min(INITIAL_CAPACITY, self.max_context))
        self.reset()

    def reset(self) -> None:
        self._position = 0  # stale cache entries beyond the position are never read

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

    def _run(self, ids: np.ndarray, keep: int) -> np.ndarray:
        total = self._position + ids.shape[1]
        self._check_length(total)
        if total > self._capacity:
            self._allocate(min(self.max_context, max(2 * self._capacity, total)))
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        binding.bind_cpu_input("num_logits_to_keep", np.array([keep], np.int64))
        for name, value in self._neutral_inputs.items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("logits", "cpu")  # first bound output: get_outputs()[0]
        for (past, present), value in zip(self._names, self._values, strict=True):
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)  # same buffer: updated in place
        self.session.run_with_iobinding(binding)
        logits = binding.get_outputs()[0].numpy()[0]  # (keep, vocab)
        self._position = total
        return logits
