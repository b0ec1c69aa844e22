"""The seed's optional tricks, measured on SmolLM2-135M: QAT with and without the gradient-scaling
schedule (seed 004 §2.3), distillation with and without the frozen teacher soft prompt (§4.2).

Each pair starts from the same model and sees the same batches; the figure is held-out perplexity
on the first 8,192 tokens of WikiText-2 valid (never trained on). Training text: WikiText-2 valid
beyond its first 200,000 characters.

    python -m pytest tests/benchmarks/test_stage_options.py -m benchmark -s
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytestmark = pytest.mark.benchmark
torch = pytest.importorskip("torch")

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
WIKITEXT = DATA / "wikitext-2-raw" / "wiki.valid.raw"
STEPS = 16


@pytest.fixture(scope="module")
def setup():
    if not WIKITEXT.is_file():
        pytest.skip("WikiText-2 validation text not found beside the checkout")
    from edgesdk.build.registry import BuildContext
    from edgesdk.compress.data import DataConfig
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from edgesdk.profile import get_profile

    loaded = load_model(resolve_model("smollm2-135m"))

    def context():
        return BuildContext(profile=get_profile("rpi5"), work_dir=Path("."), tokenizer=loaded.tokenizer,
                            teacher=loaded.model, progress=False,
                            data_config=DataConfig(files=(str(WIKITEXT),), skip_chars=200_000, generated_sequences=0))

    return loaded, context


def _run(stage: str, model, values: dict, context):
    from edgesdk.build.registry import make_config, stage_spec

    ctx = context()
    out = stage_spec(stage).run(model, make_config(stage, values), ctx)
    return out, ctx.metrics["heldout_perplexity"]


def test_gradient_scaling_schedule_under_adam(setup):
    loaded, context = setup
    results = {}
    for scaling in (False, True):
        _, ppl = _run("qat", copy.deepcopy(loaded.model), {"weight_bits": 4, "steps": STEPS, "grad_scaling": scaling},
                      context)
        results[scaling] = ppl
    print(f"\nQAT int4, {STEPS} batches: held-out perplexity without gradient scaling {results[False]:.3f}, "
          f"with {results[True]:.3f}")


def test_teacher_soft_prompt(setup):
    loaded, context = setup
    start, _ = _run("qat", copy.deepcopy(loaded.model), {"weight_bits": 4, "steps": 0}, context)
    start, _ = _run("prune", start, {"ffn_ratio": 0.25, "calibration_batches": 8}, context)
    results = {}
    for tokens in (0, 64):
        _, ppl = _run("distill", copy.deepcopy(start), {"steps": STEPS, "soft_prompt_tokens": tokens}, context)
        results[tokens] = ppl
    print(f"\ndistill after int4 + FFN -25 %, {STEPS} batches: held-out perplexity without soft prompt "
          f"{results[0]:.3f}, with a 64-token frozen prefix {results[64]:.3f}")
