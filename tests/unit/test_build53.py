"""Build (review 53): a bundle past the target's memory_budget_mb is named when the build writes it, not first by
deploy; a profile that lists 2:4 sparsity without an sm_80+ GPU is refused; the learning-rate warmup of a short
training run is a ramp, not one update at the full rate."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from edgesdk.errors import ProfileError
from edgesdk.profile import parse_profile


def _profile_text(name: str, pattern: str, replacement: str) -> str:
    text = (resources.files("edgesdk.targets") / f"{name}.yaml").read_text(encoding="utf-8")
    changed, count = re.subn(pattern, replacement, text, count=1)
    assert count == 1
    return changed


def test_a_bundle_past_the_targets_memory_budget_is_named_by_the_build(tmp_path, capsys):
    """The build wrote a 2 MB bundle for a board whose memory_budget_mb is 1 without a word; edgesdk deploy refused
    it afterwards. The build names both sizes, the target and a fix; the figure is deploy's own."""
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.deploy.probe import MB, memory_bytes
    from edgesdk.deploy.transfer import bundle_files
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import save_tiny_model_dir

    model = save_tiny_model_dir(tmp_path / "tiny-llama", hidden=128, intermediate=512)
    small = tmp_path / "small-board.yaml"
    small.write_text(_profile_text("host", r"memory_budget_mb: \d+", "memory_budget_mb: 1"), encoding="utf-8")
    bundle = build(BuildConfig(target=str(small), model=str(model), out=tmp_path / "out",
                               export=ExportConfig(max_context=256), progress=False))
    needed = memory_bytes(bundle.manifest, bundle_files(bundle))
    assert needed > MB  # the bundle is past the budget, as deploy counts it
    err = capsys.readouterr().err
    assert (f"warning: the bundle takes {needed / MB:.0f} MB in memory, more than target '{bundle.target}''s "
            "memory_budget_mb (1 MB): edgesdk deploy will refuse it on that board; build a smaller bundle") in err


def test_a_bundle_within_the_budget_gets_no_warning(tiny_bundle):
    from edgesdk.build.pipeline import memory_budget_warning
    from edgesdk.profile import get_profile

    assert memory_budget_warning(tiny_bundle, get_profile("host")) is None


@pytest.mark.parametrize(("name", "pattern", "replacement", "has"), [
    ("rpi5", r"sparsity: \[block\]", 'sparsity: [block, "2:4"]', "has no gpu"),
    ("xavier-nx", r"sparsity: \[block\]", 'sparsity: [block, "2:4"]', "has gpu.sm 72"),
    ("orin-nx-16gb", r"sm: 87", "sm: 75", "has gpu.sm 75"),
], ids=["pi-cpu", "volta", "turing"])
def test_2_4_sparsity_without_an_sm_80_gpu_is_refused(name, pattern, replacement, has):
    """A profile that lists 2:4 sparsity for a board without sparse tensor cores loaded, and TensorRT was asked for
    sparse kernels (SPARSE_WEIGHTS) there. It is refused naming the profile, the pattern, what it has and the fix."""
    with pytest.raises(ProfileError) as refused:
        parse_profile(_profile_text(name, pattern, replacement), "board.yaml")
    problem = refused.value.problem
    assert "target profile board.yaml does not match the schema" in problem
    assert "lists sparsity '2:4', but 2:4 structured sparsity needs the sparse tensor cores of an sm_80+ GPU" in problem
    assert has in problem
    assert "remove '2:4' from sparsity" in problem


def test_2_4_sparsity_on_ampere_and_in_a_bundle_copy_is_taken():
    from edgesdk.profile import BUNDLE_COPY, TargetProfile, get_profile

    assert "2:4" in get_profile("orin-nx-16gb").sparsity  # sm_87
    old = {**get_profile("rpi5").summary(), "sparsity": ["block", "2:4"]}  # a bundle built before the check
    assert "2:4" in TargetProfile.model_validate(old, context={BUNDLE_COPY: True}).sparsity


def _learning_rates(updates: int) -> list[float]:
    """The learning rate of each optimizer step of a QAT / distillation training loop of ``updates`` updates (one
    batch each), read as the optimizer steps."""
    torch = pytest.importorskip("torch")
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from edgesdk.compress.train import LoopSettings, run_training

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    seen: list[float] = []
    hook = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(optimizer.param_groups[0]["lr"]))
    try:
        run_training(model, lambda batch, _: (model(batch).square().mean(), {}), [torch.randn(2, 4)] * updates,
                     LoopSettings(lr=1e-3), desc="test", progress=False)
    finally:
        hook.remove()
    assert len(seen) == updates
    return seen


@pytest.mark.parametrize("updates", [16, 32])
def test_a_short_run_warms_the_learning_rate_up(updates):
    """QAT's default 16 updates and distillation's 32: 5 % of them rounded down to one update of warmup, whose one
    update ran at the full rate, so these runs had no warmup at all. They ramp over two updates now."""
    rates = _learning_rates(updates)
    assert rates[0] == pytest.approx(0.5e-3)
    assert rates[1] == pytest.approx(1e-3)
    assert rates[-1] < rates[2]  # the cosine decay after the ramp


def test_the_default_recipes_warmup_is_unchanged():
    """default.yaml's QAT (448 batches, 112 updates) ramps over 5 updates, as it did."""
    rates = _learning_rates(112)
    assert rates[:6] == pytest.approx([0.2e-3, 0.4e-3, 0.6e-3, 0.8e-3, 1e-3, 1e-3])
