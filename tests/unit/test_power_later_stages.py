"""Stages after the power stage train the backbone only: the gates stay as the power stage left them."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext, make_config, stage_spec  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.power.adapter import install_adapters  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import CORPUS, tiny_llama, tiny_tokenizer  # noqa: E402


@pytest.mark.parametrize("stage", ["qat", "distill"])
def test_qat_and_distillation_leave_the_power_adapters_as_they_were(tmp_path, stage):
    """Both stages trained every parameter but the embedding, so a recipe with power before them moved the
    adapters on the KL loss alone, away from the gates the power stage trained and calibrated."""
    torch.manual_seed(0)
    teacher = tiny_llama()
    model = copy.deepcopy(teacher)
    install_adapters(model, rank=2)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if ".power_adapter." in n}
    backbone = {n: p.detach().clone() for n, p in model.named_parameters()
                if ".power_adapter." not in n and "embed_tokens" not in n}
    assert adapters
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    ctx = BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                       progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))
    settings = {"steps": 2, "batch_size": 2, "sequence_length": 16, "lr": 1e-2}
    if stage == "qat":
        settings["weight_bits"] = 8
    stage_spec(stage).run(model, make_config(stage, settings), ctx)
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], before) for n, before in adapters.items())
    assert any(not torch.equal(after[n], before) for n, before in backbone.items())  # the stage did train
