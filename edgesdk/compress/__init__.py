"""The compression stages (seed 004 §2-§4): QAT, structured pruning, attention-aligned distillation."""
