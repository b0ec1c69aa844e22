"""Review fixes: a Gemma 3 GGUF file with linear rope scaling loads as llama.cpp computes it, a generation_config.json
transformers falls back from is not blamed, a width refusal beside depth pruning names the layers removed, and the
kernels' power-of-two check reads whole floats and suggests a power of two that fits."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import save_tiny_model_dir, tiny_llama  # noqa: E402

GEMMA3_LAYERS = 7
TEXT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models a b c d e f g"


def _scaled_gemma3_dir(tmp_path):
    """A tiny Gemma 3 laid out as llama.cpp fixes it, its global layer (the sixth) linearly scaled by 8 at base
    1,000,000 and its sliding layers plain at base 10,000, as Gemma 3 4B and up."""
    ropes = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
             "full_attention": {"rope_type": "linear", "rope_theta": 1_000_000.0, "factor": 8.0}}
    layer_types = ["full_attention" if i % 6 == 5 else "sliding_attention" for i in range(GEMMA3_LAYERS)]
    return save_tiny_model_dir(tmp_path / "model", model_type="gemma3_text", hidden=64, heads=4, kv_heads=2,
                               head_dim=32, layers=GEMMA3_LAYERS, intermediate=128, vocab_size=384, tokenizer="gemma",
                               config_overrides={"sliding_window": 4, "query_pre_attn_scalar": 32,
                                                 "layer_types": layer_types, "rope_parameters": ropes})


def test_a_gemma3_gguf_with_linear_rope_scaling_loads_back_as_the_scaled_source_model(tmp_path):
    """edgesdk exports Gemma 3 4B and up with gemma3.rope.scaling.type linear and its factor (the global layers
    only, as llama.cpp applies it); its own loader refused that file, saying the graphs do not compute it. Read
    back it is the source model: the global layers scaled by 8, the sliding ones plain, the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.builds import build_tiny_bundle

    model_dir = _scaled_gemma3_dir(tmp_path)
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")

    loaded = load_model(resolve_model(str(report.path)), progress=False)
    ropes = loaded.model.config.rope_parameters
    assert ropes["full_attention"]["rope_type"] == "linear"
    assert ropes["full_attention"]["factor"] == pytest.approx(8.0)
    assert ropes["full_attention"]["rope_theta"] == pytest.approx(1e6, rel=1e-6)
    assert ropes["sliding_attention"]["rope_type"] == "default"
    assert ropes["sliding_attention"]["rope_theta"] == pytest.approx(1e4)

    source = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = torch.tensor([AutoTokenizer.from_pretrained(str(model_dir))(TEXT)["input_ids"]])
    unscaled_config = copy.deepcopy(source.config)
    unscaled_config.rope_parameters["full_attention"] = {"rope_type": "default", "rope_theta": 1_000_000.0}
    unscaled = type(source)(unscaled_config).eval()
    unscaled.load_state_dict(source.state_dict())
    with torch.no_grad():
        want = source(ids).logits
        assert (unscaled(ids).logits - want).abs().max().item() > 1e-3  # the scaling shows in these logits
        assert (loaded.model(ids).logits - want).abs().max().item() < 1e-4


def test_a_gemma3_gguf_with_a_rope_scaling_other_than_linear_is_still_refused(tmp_path):
    import gguf

    from edgesdk.errors import ModelSourceError
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.gguf_files import rewrite_gguf

    model_dir = _scaled_gemma3_dir(tmp_path)
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    report = export_gguf(bundle.path, tmp_path / "model.gguf")
    yarn = rewrite_gguf(report.path, tmp_path / "yarn.gguf",
                        fields={"gemma3.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING)})
    with pytest.raises(ModelSourceError, match=r"gemma3\.rope\.scaling\.type = 'yarn' \(factor 8\)") as refused:
        load_model(resolve_model(str(yarn)), progress=False)
    assert "Hugging Face directory" in refused.value.fix


def test_a_generation_config_transformers_falls_back_from_is_not_blamed_for_another_failure(tmp_path):
    """A generation_config.json that is no valid JSON makes GenerationConfig.from_pretrained raise OSError, which
    transformers' from_pretrained catches, building the generation defaults from config.json: the model loads.
    The explanation of a load failure blamed that file for any other failure ("the weights are not at fault")."""
    from edgesdk.models.loader import _explain_generation_config_failure, load_model
    from edgesdk.models.sources import resolve_model

    directory = save_tiny_model_dir(tmp_path / "tiny")
    (directory / "generation_config.json").write_text('{"max_new_tokens": 5,', encoding="utf-8")
    assert load_model(resolve_model(str(directory)), progress=False).model is not None
    _explain_generation_config_failure(directory, RuntimeError("size mismatch for model.layers.0.mlp"))


def test_a_width_refusal_beside_depth_pruning_names_the_layers_removed():
    """The counts in the refusal are the shortened model's (3 layers of 2 groups: 6 groups); it now says so."""
    from edgesdk.compress import prune

    model = tiny_llama(layers=4, heads=4, kv_heads=2, hidden=64, intermediate=128)
    config = prune.PruneConfig(layers_removed=1, kv_group_ratio=0.75, ffn_multiple=8)
    with pytest.raises(BuildError) as refused:
        prune.check_width_ratios_after_depth(model, config)
    assert refused.value.problem.startswith("after prune.layers_removed=1 (3 of 4 layers kept): "
                                            "prune.kv_group_ratio is 0.75")
    assert "6 GQA groups (KV heads) in 3 layers" in refused.value.problem
    assert "prune.kv_group_ratio" in refused.value.fix
    assert len(model.model.layers) == 4


@pytest.mark.parametrize(("value", "instead"), [
    (80.0, "pass 128"), (80.5, "pass 128"), (24, "pass 32"), (0, "pass a positive power of two"),
    (-4, "pass a positive power of two"), (True, "pass a positive power of two"),
])
def test_the_power_of_two_check_suggests_a_power_of_two_that_fits(value, instead):
    """80.0 was told "pass 1" (any float was), as were 0 and -4."""
    from edgesdk.kernels.aot import default_variants
    from edgesdk.kernels.tuning import tuning_for

    with pytest.raises(ValueError, match=rf"head_dims entry \(BLOCK_D\) {value!r} is not a power of two.*{instead} "):
        default_variants(tuning_for(87), head_dims=(value,))


def test_whole_floats_are_taken_as_the_powers_of_two_they_are():
    from edgesdk.kernels.aot import default_variants
    from edgesdk.kernels.tuning import tuning_for

    names = [v.name for v in default_variants(tuning_for(87), head_dims=(64.0,), group_blocks=(2.0,))]
    assert "gqa_decode_d64_g2_fp16" in names
    decode = next(v for v in default_variants(tuning_for(87), head_dims=(64.0,), group_blocks=(2.0,))
                  if v.kernel == "gqa_decode")
    assert type(decode.constexprs["BLOCK_D"]) is int


def test_a_width_refusal_of_a_model_already_shortened_names_the_layers_removed():
    """_prune_width checks the model depth pruning already shortened (layers of several shapes are checked there,
    after the depth plan): its refusal quoted the shortened model's counts as the model's."""
    import pytest

    pytest.importorskip("torch")
    from edgesdk.compress import prune
    from edgesdk.errors import BuildError
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(layers=3, heads=4, kv_heads=2)  # what 4 layers less one leave
    config = prune.PruneConfig(layers_removed=1, kv_group_ratio=0.75)
    with pytest.raises(BuildError, match=r"after prune\.layers_removed=1 \(3 of 4 layers kept\)"):
        prune._prune_width(model, config, None, None)
