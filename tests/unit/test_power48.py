"""Power and compression losses / structure, review 48."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import structure  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _pruned(model) -> None:
    """Drop FFN channels of layer 0 and record it, as the prune stage does."""
    records = structure.layer_records(model)
    structure.keep_ffn_channels(model.model.layers[0], [0, 3, 5])
    records[0]["ffn"] = [0, 3, 5]
    setattr(model.config, structure.LAYERS_KEY, records)


@pytest.mark.parametrize("pruned", [False, True])
def test_a_pruned_checkpoint_keeps_its_generation_config(tmp_path, pruned):
    """from_pretrained reads generation_config.json; load_pruned rebuilt a pruned checkpoint with from_config,
    which derives it from config.json alone, so the EOS ids only generation_config.json lists (Gemma 3's
    [1, 106], Qwen2.5-Instruct's [151645, 151643]) and its sampling settings were lost on --resume after prune."""
    model = tiny_llama()
    model.generation_config.eos_token_id = [2, 5]
    model.generation_config.do_sample, model.generation_config.temperature = True, 0.6
    if pruned:
        _pruned(model)
    model.save_pretrained(tmp_path)
    loaded = structure.load_pruned(tmp_path)
    assert loaded.generation_config.eos_token_id == [2, 5]
    assert loaded.generation_config.do_sample is True
    assert loaded.generation_config.temperature == 0.6
    assert loaded.model.layers[0].mlp.gate_proj.out_features == (3 if pruned else model.config.intermediate_size)


def test_a_pruned_checkpoint_without_a_generation_config_loads(tmp_path):
    model = tiny_llama()
    _pruned(model)
    model.save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink(missing_ok=True)
    loaded = structure.load_pruned(tmp_path)
    assert loaded.generation_config.eos_token_id == model.config.eos_token_id
