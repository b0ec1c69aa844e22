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
    which makes each step pick a new token, so every step's logits count in a comparison. No token ends it (the
    runtime side decodes with no stop ids): ``min_new_tokens`` would instead ban the end-of-text token outright."""
    import torch

    with torch.no_grad():
        tokens = model.generate(torch.tensor([prompt]), max_new_tokens=count, do_sample=False, eos_token_id=None,
                                pad_token_id=0, repetition_penalty=10.0)[0, len(prompt):].tolist()
    assert len(tokens) == count, f"transformers stopped after {len(tokens)} of {count} tokens"
    return tokens


def bundle_follows_transformers(bundle_path, model, prompt: list[int], label: str, record_property,
                                count: int = 24) -> None:
    """``count`` penalised greedy tokens after ``prompt`` through the bundle's own runtime equal transformers'
    :func:`penalised_greedy_tokens` of ``model``, and the bundle's logits over the prompt and those tokens are
    ``model``'s within 1e-4 of their scale (reported as ``label``)."""
    import numpy as np
    import torch

    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(bundle_path, threads=1)
    sampling = SamplingConfig(max_new_tokens=count, repeat_penalty=10.0, repeat_last_n=-1)
    tokens, _ = generate(runtime.backend, prompt, sampling, stop_ids=set())
    assert tokens == penalised_greedy_tokens(model, prompt, count)
    assert len(set(tokens)) > count // 2  # the penalty made the steps differ
    ids = prompt + tokens
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()  # [len(ids), vocab]
    runtime.backend.reset()
    got = bundle_scorer(runtime)(np.array(ids))
    scale = float(np.abs(expected).max())
    report_max_abs_diff(f"{label}, logit scale {scale:.2f}", float(np.abs(got - expected).max()),
                        1e-4 * max(scale, 1.0), record_property)
