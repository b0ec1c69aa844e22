"""How the parity tests report a comparison: the largest absolute difference, recorded on the test (junit XML's
``max_abs_diff`` property), printed with its bound, and asserted under it."""

from __future__ import annotations


def report_max_abs_diff(label: str, diff: float, bound: float, record_property) -> None:
    """Records ``diff`` as the test's ``max_abs_diff``, prints it beside ``bound`` and asserts ``diff <= bound``."""
    record_property("max_abs_diff", diff)
    print(f"\n[max abs diff] {label}: {diff:.3e} (bound {bound:.1e})")
    assert diff <= bound, f"{label}: max abs diff {diff} > {bound}"


def penalised_greedy_tokens(model, prompt: list[int], count: int = 24) -> list[int]:
    """transformers' greedy ``generate`` of exactly ``count`` tokens after ``prompt`` with a repetition penalty of 10,
    which makes each step pick a new token, so every step's logits count in a comparison."""
    import torch

    with torch.no_grad():
        return model.generate(torch.tensor([prompt]), max_new_tokens=count, do_sample=False, min_new_tokens=count,
                              pad_token_id=0, repetition_penalty=10.0)[0, len(prompt):].tolist()
