"""Power distillation (seed 000): per-token compute gates trained on-policy, and the controller
that turns them into faster decoding on the board.

Modules that import torch (adapter, vector, losses, profiler, train, stage) are host-only; the
board runtime imports ``distribution`` and ``controller``, which need numpy only.
"""
