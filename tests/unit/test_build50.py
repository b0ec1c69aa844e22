"""Build pipeline (review 50): the report's weight bytes are what the export writes."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from tests._utils.tiny import CORPUS  # noqa: E402

TINY_QAT = ("{weight_bits: 8, granularity: channel, activations: none, embedding_bits: null, steps: 1, "
            "batch_size: 1, sequence_length: 32, grad_accumulation: 1}")


def _build(tiny_model_dir, tmp_path, name: str, recipe_text: str, overrides: tuple[str, ...] = (),
           skip_chars: int = 0, keep_work: bool = False):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.export.validate import ValidationConfig

    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(recipe_text, encoding="utf-8")
    return build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / name, recipe=str(recipe),
                             overrides=overrides, keep_work=keep_work,
                             data=DataConfig(files=(str(text),), skip_chars=skip_chars, generated_sequences=0),
                             export=ExportConfig(max_context=64),
                             validation=ValidationConfig(prompts=1, decode_steps=1), progress=False))


def _stored_weight_bytes(bundle) -> int:
    """Bytes of the graph's weight initializers: all but the rotary tables and the graph's own small constants
    (shapes, epsilons: ``const_N``), which weight_bytes does not count."""
    from onnx import numpy_helper

    graph = onnx.load(str(bundle.path / "model.onnx")).graph
    return sum(numpy_helper.to_array(t).nbytes for t in graph.initializer
               if not t.name.startswith(("const_", "rotary.")))


@pytest.mark.parametrize("tied", [True, False])
def test_report_weight_bytes_count_the_int8_head_a_standard_export_stores(tiny_model_dir, tmp_path, tied):
    """A standard-form (QDQ) build with export.embedding_bits=8 stores the tied embedding / LM head INT8 per row
    (export/qdq_graph.py; an untied model's head, its embedding staying float32), but its QAT records
    embedding_bits null, and the report counted the table in float32 (SmolLM2's 28 MB table reported as 113 MB):
    the report's last row now equals the bytes the bundle stores, both ways."""
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = tiny_model_dir if tied else save_tiny_model_dir(tmp_path / "untied", tie=False)
    recipe = f"name: qdq\nstages:\n  - stage: qat\n    config: {TINY_QAT}\nexport: {{form: standard, weights: int8}}\n"
    reported, stored = {}, {}
    for bits in (None, 8):
        bundle = _build(model_dir, tmp_path, f"b{bits}", recipe, (f"export.embedding_bits={json.dumps(bits)}",))
        reported[bits] = bundle.manifest["stages"][-1]["metrics"]["weight_bytes"]
        stored[bits] = _stored_weight_bytes(bundle)
    assert reported == stored
    assert reported[None] - reported[8] == 320 * 64 * 3 - 5 * 320  # the 320 x 64 table: 4 -> 1 byte, + scale, zero


def test_report_weight_bytes_of_a_quantized_export_without_qat(tiny_model_dir, tmp_path):
    """A recipe without a qat stage whose export quantizes (post-training: the fused int4 graph rounds the weights
    itself) stores INT4 blocks; the stage's row counted float32, the model having no recorded scheme."""
    recipe = ("name: ptq\nstages:\n  - stage: prune\n    config: {ffn_ratio: 0.25}\n"
              "export: {form: ort-fused, weights: int4, block_size: 32, embedding_bits: 8}\n")
    bundle = _build(tiny_model_dir, tmp_path, "ptq", recipe)
    assert bundle.manifest["stages"][-1]["metrics"]["weight_bytes"] == _stored_weight_bytes(bundle)


def test_weight_bits_and_a_set_of_the_same_setting_to_another_value_are_refused(tiny_model_dir, tmp_path):
    """--weight-bits 4 stands for qat.weight_bits=4 and export.weights=int4 on the int4 recipe; --set of those to 8
    was applied after it and won silently (an INT8 bundle for --weight-bits 4). Refused naming both, before the
    model loads; the same value given twice is taken."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match=r"--weight-bits 4 sets qat.weight_bits=4, and --set qat.weight_bits=8") as no:
        build(BuildConfig(target="host", model=str(tiny_model_dir), out=tmp_path / "b", recipe="int4", weight_bits=4,
                          overrides=("qat.weight_bits=8", "export.weights=int8", "qat.steps=0"), progress=False))
    assert "--weight-bits alone" in no.value.fix
    assert not (tmp_path / "b").exists()
    assert not (tmp_path / "b.build").exists()
    from edgesdk.build.pipeline import check_weight_bits_sets

    check_weight_bits_sets(4, ["qat.weight_bits=4", "export.weights=int4"], ("qat.weight_bits=4", "qat.steps=1"))


def test_set_export_max_context_names_the_max_context_option():
    """The context is ExportConfig's max_context but no recipe key: --set export.max_context=N was refused as an
    unknown key, listing the recipe's export keys only; it now names --max-context (and build_bundle's max_context)."""
    from edgesdk.build.recipes import load_recipe
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match="it is the build's --max-context") as refused:
        load_recipe("int4").with_overrides(["export.max_context=2048"])
    assert "--max-context 2048" in refused.value.fix
    assert "max_context=2048" in refused.value.fix


@pytest.mark.parametrize(("text", "expected"), [("distill.steps=1e3", 1000), ("distill.steps=0o17", 15)])
def test_set_values_in_yaml_1_2_number_forms_pyyaml_reads_as_text(text, expected):
    """--set values are read as YAML 1.2's core schema reads them (yaml.org/spec/1.2.2 10.3.2): 1e3 is the float
    1000 and 0o17 the integer 15. PyYAML (YAML 1.1) reads both as strings, and an integer option refused them
    ("steps='1e3' is not a valid int"); a quoted "1e3" is still text."""
    from edgesdk.build.recipes import _override_value, load_recipe

    stages = dict(load_recipe("int4-prune").with_overrides([text]).validated())
    assert stages["distill"].steps == expected
    assert _override_value('"1e3"') == "1e3"
    assert _override_value("2e-4") == 2e-4


def test_report_perplexity_of_a_standard_export_with_an_int8_head_is_measured_with_that_head(tiny_model_dir, tmp_path):
    """The per-stage held-out perplexity is said to be measured as the exported graph computes; a standard-form
    export with embedding_bits 8 rounds the LM head INT8 per row, which the QAT scheme (embedding_bits null) left in
    float, so the figure was that of a float head. It is now the perplexity of the export's check's reference
    (export/validate.py qdq_reference with the head quantized), over the same held-out windows."""
    from transformers import AutoTokenizer

    from edgesdk.build.checkpoint import load_checkpoint
    from edgesdk.build.registry import BuildContext
    from edgesdk.compress.data import DataConfig
    from edgesdk.compress.measure import heldout_perplexity
    from edgesdk.export.validate import qdq_reference
    from edgesdk.profile import get_profile

    recipe = f"name: qdq\nstages:\n  - stage: qat\n    config: {TINY_QAT}\nexport: {{form: standard, weights: int8}}\n"
    bundle = _build(tiny_model_dir, tmp_path, "b8", recipe, ("export.embedding_bits=8",), skip_chars=1200,
                    keep_work=True)
    reported = bundle.manifest["stages"][-1]["metrics"]["heldout_perplexity"]
    model = load_checkpoint(tmp_path / "b8.build" / "stages" / "00-qat")
    ids = BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=AutoTokenizer.from_pretrained(
        tiny_model_dir), data_config=DataConfig(files=(str(tmp_path / "train.txt"),), skip_chars=1200)).eval_ids()
    with torch.no_grad():
        as_exported = heldout_perplexity(qdq_reference(model, head_quantized=True), ids)
        float_head = heldout_perplexity(qdq_reference(model, head_quantized=False), ids)
    assert as_exported != pytest.approx(float_head, rel=1e-4)  # the head's rounding shows in the figure
    assert reported == pytest.approx(as_exported, rel=1e-6)
