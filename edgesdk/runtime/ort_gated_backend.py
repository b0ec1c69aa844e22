"""ONNX Runtime backend for the gated fused graph (export/gated_graph.py, seed 000 on the board).

Each step passes the controller's threshold ``tau``; a layer's FFN whose gate is below it is
skipped inside the graph (an ``If``), so its weights are not read. After the step the graph's
gates and power p_t go to the :class:`TauController`, which sets the next step's ``tau`` so the
realised windowed entropy stays at the target and the executed-FFN fraction within the compute
budget. ``set_compute_budget`` (called by the thermal guard) lowers the budget.

``gating=False`` (the default, as on the command line) pins ``tau`` to ``ADAPTERS_OFF_TAU``: every
FFN runs and no adapter scale acts, so the graph computes the loaded model (the "gating off"
reference of a benchmark); the controller then only measures, as it does while ``fixed_tau`` holds
the threshold.
Prefill always runs at the effective ``tau``. A prompt's FFN runs for every token unless all of
them are below ``tau`` (tokens below it only have its output zeroed), so the block counts in
:meth:`stats` are those of decode steps, where a skipped block is never read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgesdk.errors import RuntimeBackendError
from edgesdk.power.controller import ADAPTERS_OFF_TAU, ControllerConfig, TauController
from edgesdk.power.distribution import FLOOR, SMOOTH, WINDOW
from edgesdk.runtime.ort_fused_backend import OrtFusedBackend


class OrtGatedBackend(OrtFusedBackend):
    output_names = ("logits", "gates", "power")
    min_onnxruntime = ((1, 23), "GroupQueryAttention's qk_output, read for the attention peak a_t")

    def __init__(self, model_path: Path, graph: dict, threads: int, providers: list[str] | None = None,
                 spinning: bool = True, provider_options: list[dict] | None = None,
                 controller: ControllerConfig | None = None):
        super().__init__(model_path, graph, threads, providers, spinning, provider_options)
        self.power_settings = graph.get("power") or {}
        try:
            self.controller = TauController(controller or self.controller_config())
        except (TypeError, ValueError) as exc:  # settings the controller cannot use, recorded in the bundle's graph
            # spec; a TypeError is one that is no number (null, a list), which float() and int() refuse. The session
            # and the KV cache go now, not when the error's traceback (kept at a REPL, in a log) lets them go.
            self.close()
            given = ", ".join(f"{k}={self.power_settings.get(k)!r}" for k in ("entropy_target", "window", "smooth",
                                                                            "floor", "tau_init"))
            raise RuntimeBackendError(f"the bundle's power settings ({given}) are unusable: {exc}",
                                      "rebuild the bundle with edgesdk build (the power stage writes window 8, "
                                      "smooth 2, floor 0.01, tau_init in (0, 1)) and a target profile whose "
                                      "power.entropy_target lies between the least entropy its floor lets a window hold "
                                      "(0.366 nats for window 8, floor 0.01) and ln 8 = 2.079") from exc
        self._decoding = False
        self.gating = False  # skip FFN blocks only when asked (run --gating, benchmarks, eval's gated points)
        self.fixed_tau: float | None = None  # a constant threshold instead of the controller (sweeps, eval)
        self.last_gates: np.ndarray | None = None
        self.last_power: np.ndarray | None = None
        # Hidden states (embeddings) of the function the bundle generates with by default, gating off: the loaded
        # model. The fused backend's neutral tau 0 would keep the adapters' channel and head scales acting.
        self._neutral_inputs = {"tau": ADAPTERS_OFF_TAU}

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
        limit = self.controller.limit  # not .budget: that also holds the old configured budget
        self.controller = TauController(config)
        self.controller.set_compute_budget(limit)

    def set_compute_budget(self, budget: float) -> None:
        """The thermal guard's lever: lower (or restore) the executed-FFN fraction allowed."""
        self.controller.set_compute_budget(budget)

    def reset(self) -> None:
        super().reset()
        if hasattr(self, "controller"):
            self.controller.reset()

    def rewind(self, length: int) -> None:
        """Keep the first ``length`` cached tokens; the controller starts over, as for a new sequence."""
        super().rewind(length)
        self.controller.reset()

    def load_cache(self, state: list[np.ndarray]) -> None:
        """Put a saved cache back; the controller starts over, as for a new sequence."""
        super().load_cache(state)
        self.controller.reset()

    @property
    def executed_fraction(self) -> float | None:
        """The mean fraction of FFN blocks the last decode steps ran (the controller's window, the one its budget
        floor steers on), None before a decode step of this sequence: what the gate runs now, at any budget (at 1.0
        the entropy loop still skips blocks), for the thermal guard's power model."""
        executed = self.controller.executed
        return float(np.mean(executed)) if executed else None

    @property
    def tau(self) -> float:
        if not self.gating:
            return ADAPTERS_OFF_TAU
        return self.controller.tau if self.fixed_tau is None else self.fixed_tau

    def _step_inputs(self) -> dict[str, float]:
        return {"tau": self.tau}

    def _consume(self, outputs: list[np.ndarray]) -> np.ndarray:
        logits, gates, power = (output[0] for output in outputs)  # (keep, vocab), (S, L), (S,)
        self.last_gates, self.last_power = gates, power
        # The controller steers only while its tau is the one in use: steering through a fixed threshold's steps
        # wound its budget floor up (to tau_max where the fixed tau ran more blocks than the budget), so the
        # controller, handed the gate back, skipped every FFN for tens of steps.
        self.controller.observe(power, gates >= self.tau, steer=self.gating and self.fixed_tau is None,
                                count=self._decoding)
        return logits

    def prefill(self, token_ids: np.ndarray, keep_logits: int = 1) -> np.ndarray:
        self._decoding = False  # a prompt's FFNs run for all its tokens: not counted, even a one-token prompt
        return super().prefill(token_ids, keep_logits)

    def decode(self, token_id: int) -> np.ndarray:
        self._decoding = True
        return super().decode(token_id)

    def stats(self) -> dict:
        """Realised entropy, FFN blocks skipped in decode, executed fraction, the tau in use and the budget."""
        return {**self.controller.summary(), "tau": round(self.tau, 4), "gating": self.gating}
