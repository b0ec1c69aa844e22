"""Review tests of depth pruning and of the GGUF export of pruned layers (deci)."""

from __future__ import annotations

import numpy as np
import pytest

from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")

PROMPT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models."


def _llama_cpp_logits(path, ids):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    model = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    model.eval(ids)
    return np.array(model.scores[:len(ids)])


def test_a_llama_bundle_with_narrower_attention_in_every_layer_runs_in_llama_cpp(tmp_path):
    """Removing one of two GQA groups from each layer leaves uniform layers whose query heads span less than
    the model width; llama.cpp's llama loader sizes the query projection as the width and refused the file
    ('attn_q.weight has wrong shape'). It is written as deci, which sizes it by the heads. (A Qwen2 model's query
    bias stays the width in every loader, so such a Qwen2 bundle is refused: tests/unit/test_export51.py.)"""
    pytest.importorskip("gguf")
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, intermediate=128, layers=2,
                                    model_type="llama")
    recipe = ("name: narrow\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.0, kv_group_ratio: 0.5, "
              "calibration_batches: 2, batch_size: 2, sequence_length: 24}\n"
              "export: {form: ort-fused, weights: fp32}\n")
    bundle = build_tiny_bundle(tmp_path, recipe, "host", model_dir=model_dir)
    assert bundle.manifest["model"]["after"]["attention_heads"] == 2  # 2 x 16 = 32 of the width 64, every layer
    report = export_gguf(bundle.path, tmp_path / "narrow.gguf")
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(PROMPT, add_special_tokens=False)
    expected = bundle_scorer(runtime)(np.array(ids))
    got = _llama_cpp_logits(report.path, ids)
    assert report.architecture == "deci"
    assert float(np.abs(got - expected).max()) < 1e-3


QDQ_DEPTH = """name: qdq-depth
stages:
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 2, batch_size: 2,
             sequence_length: 24, observer_batches: 2}
  - stage: prune
    config: {layers_removed: 1, ffn_ratio: 0.0, layer_calibration_batches: 2, batch_size: 2, sequence_length: 24}
export: {form: standard, weights: int8}
"""


def test_a_depth_pruned_qdq_build_exports_with_each_layers_own_activation_scales(tmp_path):
    """QAT records a static activation scale per linear under its name (``model.layers.{i}.…``); removing a
    layer renumbers the ones after it, so their scales must be renamed with them: left as they were, the last
    layer's scales named a linear the model no longer has and the export refused the build after every stage,
    and each layer after the removed one would have read its predecessor's."""
    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2, layers=3)
    bundle = build_tiny_bundle(tmp_path, QDQ_DEPTH, "host", model_dir=model_dir)
    assert bundle.manifest["model"]["after"]["layers"] == 2
    assert bundle.manifest["graph"]["dtype"] == "int8-qdq"
    assert bundle.manifest["export_validation"]["max_abs_diff"]["qdq/decode"] < 1e-3


def test_removing_layers_renames_the_per_linear_quantization_settings_with_them():
    from edgesdk.compress import fake_quant
    from edgesdk.compress.structure import keep_layers
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(layers=4)
    names = {i: f"model.layers.{i}.mlp.down_proj" for i in range(4)}
    scheme = fake_quant.QuantScheme(weight_bits=4, activation_scales={names[i]: 0.1 * (i + 1) for i in range(4)},
                                    eight_bit_linears=(names[1], names[3]))
    setattr(model.config, fake_quant.CONFIG_KEY, scheme.to_json())
    keep_layers(model, [0, 2, 3])
    kept = fake_quant.QuantScheme.of(model)
    assert kept.activation_scales == {names[0]: 0.1, names[1]: 0.1 * 3, names[2]: 0.1 * 4}
    assert kept.eight_bit_linears == (names[2],)  # old layer 3; old layer 1 is gone
    fake_quant.attach(model, kept)
    assert model.model.layers[2].mlp.down_proj.bits == 8
    assert model.model.layers[1].mlp.down_proj.bits == 4


@pytest.mark.parametrize("qat", [
    {"weight_bits": 8, "granularity": "channel", "activations": "tensor", "embedding_bits": None, "observer_batches": 2},
    {"weight_bits": 4, "eight_bit_fraction": 0.4, "fisher_batches": 2},
], ids=["activation-scales", "eight-bit-linears"])
def test_the_prune_stage_keeps_each_layers_quantization_settings_when_it_removes_layers(tmp_path, qat):
    """The prune stage scores layers with the fake quantization attached; the linears it then renumbers must
    leave it under their new names, with the scale or bits QAT gave them and nothing under an old name."""
    import copy

    from edgesdk.build.registry import BuildContext, make_config, stage_spec
    from edgesdk.compress import fake_quant
    from edgesdk.compress.data import DataConfig
    from edgesdk.compress.structure import teacher_layers
    from edgesdk.profile import get_profile
    from tests._utils.tiny import CORPUS, tiny_llama, tiny_tokenizer

    torch.manual_seed(0)
    teacher = tiny_llama(layers=4)
    model = copy.deepcopy(teacher)
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    ctx = BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                       progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))
    short = {"batch_size": 2, "sequence_length": 16}
    model = stage_spec("qat").run(model, make_config("qat", {"steps": 1, **short, **qat}), ctx)
    before = fake_quant.QuantScheme.of(model)
    assert before.activation_scales or before.eight_bit_linears
    prune = {"layers_removed": 2, "ffn_ratio": 0.25, "ffn_multiple": 8, "calibration_batches": 1,
             "layer_calibration_batches": 1, **short}
    model = stage_spec("prune").run(model, make_config("prune", prune), ctx)
    after = fake_quant.QuantScheme.of(model)
    teacher_index = teacher_layers(model)
    assert len(teacher_index) == 2

    def old(name: str) -> str:
        index, _, module = name.removeprefix("model.layers.").partition(".")
        return f"model.layers.{teacher_index[int(index)]}.{module}"

    assert after.activation_scales == {name: before.activation_scales[old(name)]
                                       for name in fake_quant.decoder_linears(model)
                                       if old(name) in before.activation_scales}
    assert set(after.eight_bit_linears) == {name for name in fake_quant.decoder_linears(model)
                                            if old(name) in before.eight_bit_linears}


def test_the_reports_per_layer_table_numbers_layers_as_the_plot_does_and_names_the_removed_ones():
    """The plot beside it draws layer i of the model as loaded at i (a removed one at 0); the table numbered
    the kept layers 0, 1, 2, so a removed layer's number showed the next layer's heads and channels."""
    from edgesdk.build.report import markdown

    def row(stage, layers):
        return {"stage": stage, "parameters": 1000, "weight_bytes": 4000,
                "layers": [{"layer": i, "heads": 4, "kv_heads": 2, "ffn": ffn} for i, ffn in layers]}

    rows = [row("loaded", [(0, 128), (1, 128), (2, 128), (3, 128)]), row("prune", [(0, 96), (2, 64), (3, 128)])]
    lines = markdown(rows, None)
    table = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert table == ["| 0 | 4 | 2 | 96 |", "| 2 | 4 | 2 | 64 |", "| 3 | 4 | 2 | 128 |"]
    assert "Removed by depth pruning: layer 1 of the model as loaded." in lines
    old = [{"heads": 4, "kv_heads": 2, "ffn": 96}, {"heads": 4, "kv_heads": 2, "ffn": 64}]  # no "layer": positions
    lines = markdown([{"stage": "prune", "parameters": 1, "weight_bytes": 1, "layers": old}], None)
    assert [line for line in lines if line.startswith("| ") and line[2].isdigit()] == [
        "| 0 | 4 | 2 | 96 |", "| 1 | 4 | 2 | 64 |"]
    assert not any("Removed" in line for line in lines)


def test_removing_every_layer_is_a_build_error_naming_the_option_not_a_traceback(tmp_path):
    """A ValueError from inside the stage reached the command line as a traceback (the CLI prints EdgeSDKError
    only), after the stages before it had trained."""
    from edgesdk.compress.prune import PruneConfig, prune_stage
    from edgesdk.errors import BuildError
    from tests._utils.tiny import tiny_llama

    model = tiny_llama(layers=2)
    with pytest.raises(BuildError, match="layers_removed is 2, but the model has 2 decoder layers") as refused:
        prune_stage(model, PruneConfig(layers_removed=2), ctx=None)
    assert "--prune-layers 1" in refused.value.fix
    assert len(model.model.layers) == 2
