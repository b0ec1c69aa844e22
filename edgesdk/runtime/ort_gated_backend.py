"""ONNX Runtime backend for the gated fused graph (export/gated_graph.py, seed 000 on the board).

Each step passes the controller's threshold ``tau``; a layer's FFN whose gate is below it is
skipped inside the graph (an ``If``), so its weights are not read. After the step the graph's
gates and power p_t go to the :class:`TauController`, which sets the next step's ``tau`` so the
realised windowed entropy stays at the target and the executed-FFN fraction within the compute
budget. ``set_compute_budget`` (called by the thermal guard) lowers the budget.

``gating=False`` pins ``tau`` to 0: the same graph with every FFN running (the "gating off"
reference of a benchmark). Prefill always runs at the controller's current ``tau``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.power.controller import ControllerConfig, TauController
from edgesdk.power.distribution import FLOOR, SMOOTH, WINDOW
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend


class OrtGatedBackend(OrtFusedBackend):
    def __init__(self, model_path: Path, graph: dict, threads: int, providers: list[str] | None = None,
                 spinning: bool = True, controller: ControllerConfig | None = None):
        super().__init__(model_path, graph, threads, providers, spinning)
        self.power_settings = graph.get("power") or {}
        self.controller = TauController(controller or self.controller_config())
        self.gating = True
        self.fixed_tau: float | None = None  # a constant threshold instead of the controller (sweeps, eval)
        self.last_gates: np.ndarray | None = None
        self.last_power: np.ndarray | None = None

    def controller_config(self, entropy_target: float | None = None, compute_budget: float | None = None
                          ) -> ControllerConfig:
        """The bundle's controller settings (window, smoothing, target), with optional overrides."""
        power = self.power_settings
        return ControllerConfig(
            entropy_target=float(entropy_target if entropy_target is not None else power.get("entropy_target", 1.5)),
            compute_budget=float(compute_budget if compute_budget is not None else 1.0),
            tau_init=float(power.get("tau_init", 0.5)), window=int(power.get("window", WINDOW)),
            smooth=int(power.get("smooth", SMOOTH)), floor=float(power.get("floor", FLOOR)))

    def configure(self, config: ControllerConfig) -> None:
        """Replace the controller's settings (entropy target, budget ...), keeping the thermal budget."""
        budget = self.controller.budget
        self.controller = TauController(config)
        self.controller.set_compute_budget(min(budget, config.compute_budget))

    def set_compute_budget(self, budget: float) -> None:
        """The thermal guard's lever: lower (or restore) the executed-FFN fraction allowed."""
        self.controller.set_compute_budget(budget)

    def reset(self) -> None:
        super().reset()
        if hasattr(self, "controller"):
            self.controller.reset()

    @property
    def tau(self) -> float:
        if not self.gating:
            return 0.0
        return self.controller.tau if self.fixed_tau is None else self.fixed_tau

    def _run(self, ids: np.ndarray, keep: int) -> np.ndarray:
        total = self._position + ids.shape[1]
        self._check_length(total)
        if total > self._capacity:
            self._allocate(min(self.max_context, max(2 * self._capacity, total)))
        tau = self.tau
        binding = self.session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("seqlens_k", np.array([total - 1], np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(total, np.int32))
        binding.bind_cpu_input("num_logits_to_keep", np.array([keep], np.int64))
        binding.bind_cpu_input("tau", np.array(tau, np.float32))
        binding.bind_output("logits", "cpu")
        binding.bind_output("gates", "cpu")
        binding.bind_output("power", "cpu")
        for (past, present), value in zip(self._names, self._values, strict=True):
            binding.bind_ortvalue_input(past, value)
            binding.bind_ortvalue_output(present, value)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        logits = outputs[0].numpy()[0]  # (keep, vocab)
        gates = outputs[1].numpy()[0]  # (S, L)
        power = outputs[2].numpy()[0]  # (S,)
        self.last_gates, self.last_power = gates, power
        self._position = total
        self.controller.observe(power, gates >= tau) if self.gating else self.controller.observe(
            power, np.ones_like(gates))
        return logits

    def stats(self) -> dict:
        """Realised entropy, FFN blocks skipped, executed fraction, current tau and budget."""
        return self.controller.summary()
