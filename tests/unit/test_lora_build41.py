"""``edgesdk build --lora`` end to end on a tiny model: the adapter is merged before the stages, the bundle computes
the fine-tuned model, the manifest records the adapter beside the source, and --resume with another scale does not
take the checkpoints made with the first."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from tests._utils.tiny import CORPUS, save_tiny_model_dir

torch = pytest.importorskip("torch")

SMOOTH_RECIPE = """name: tiny-smooth
stages:
  - stage: smooth
    config: {calibration_batches: 2, batch_size: 2, sequence_length: 24}
export: {form: ort-fused, weights: fp32}
"""
IDS = [5, 17, 101, 3, 250, 42, 7, 99]


def _build(root, model_dir, *extra):
    return CliRunner().invoke(main, ["build", "--target", "host", "--model", str(model_dir), "--recipe",
                                     str(root / "recipe.yaml"), "--max-context", "64", "--out", str(root / "b"),
                                     "--no-progress", "--data", str(root / "train.txt"), "--generated-sequences", "0",
                                     "--keep-work", *extra], prog_name="edgesdk")


def test_a_build_with_lora_bundles_the_fine_tuned_model_and_resume_with_another_scale_is_refused(tmp_path):
    from edgesdk.models.lora import LoraAdapter, merge_adapters
    from edgesdk.runtime.session import open_runtime
    from tests.unit._lora_files41 import random_factors, write_peft

    model_dir = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2)
    (tmp_path / "recipe.yaml").write_text(SMOOTH_RECIPE)
    (tmp_path / "train.txt").write_text("\n".join(CORPUS * 3))
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    adapter = write_peft(tmp_path / "adapter", random_factors(base, rank=4), {"r": 4, "lora_alpha": 8})
    with torch.no_grad():
        base_logits = base(torch.tensor([IDS])).logits[0].numpy()
    merge_adapters(base, [LoraAdapter(str(adapter), 0.5)], "llama")
    with torch.no_grad():
        expected = base(torch.tensor([IDS])).logits[0].numpy()

    built = _build(tmp_path, model_dir, "--lora-scaled", str(adapter), "0.5")
    assert built.exit_code == 0, built.output
    assert f"merged LoRA adapter {adapter.resolve()} (peft, rank 4, 14 modules, scale 0.5)" in built.stderr
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    record, = manifest["model"]["before"]["adapters"]
    assert record["scale"] == 0.5
    assert record["form"] == "peft"
    assert record["rank"] == 4
    assert record["path"] == str(adapter.resolve())
    assert len(record["sha256"]) == 64
    assert "adapters" not in manifest["model"]["after"]
    report = (tmp_path / "b" / "report.md").read_text()
    assert f"- LoRA adapter merged before the stages: `adapter` (peft, rank 4, scale 0.5, sha256 {record['sha256'][:12]})" \
        in report
    runtime = open_runtime(tmp_path / "b", threads=1)
    logits = runtime.backend.prefill(np.asarray(IDS, np.int64), keep_logits=len(IDS)).reshape(len(IDS), -1)
    assert float(np.abs(expected - base_logits).max()) > 1.0
    assert float(np.abs(logits - expected).max()) < 2e-3

    again = _build(tmp_path, model_dir, "--lora", str(adapter), "--resume")  # scale 1 now
    assert again.exit_code != 0
    assert "belongs to a different build: the LoRA adapters (--lora, --lora-scaled, their scales or their files) changed" in again.stderr
    same = _build(tmp_path, model_dir, "--lora-scaled", str(adapter), "0.5", "--resume")
    assert same.exit_code == 0, same.output
    assert "--resume: reusing" in same.stderr

    # eval --reference scores the model the bundle was made from: the base with the adapter merged again
    scored = CliRunner().invoke(main, ["eval", str(tmp_path / "b"), "--text", str(tmp_path / "train.txt"),
                                       "--context", "32", "--reference", "--json", "--threads", "1"],
                                prog_name="edgesdk")
    assert scored.exit_code == 0, scored.output
    result = json.loads(scored.stdout)
    assert abs(result["relative_difference"]) < 1e-3, result
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")  # another file than the one merged
    refused = CliRunner().invoke(main, ["eval", str(tmp_path / "b"), "--text", str(tmp_path / "train.txt"),
                                        "--context", "32", "--reference", "--threads", "1"], prog_name="edgesdk")
    assert refused.exit_code != 0
    assert f"has the LoRA adapter {adapter.resolve()} merged in" in refused.stderr
    assert "has changed since the build" in refused.stderr
    weights.write_bytes(weights.read_bytes()[:-1])  # the weights merged, back
    config = adapter / "adapter_config.json"
    config.write_text(config.read_text().replace('"lora_alpha": 8', '"lora_alpha": 16'))  # another merge
    refused = CliRunner().invoke(main, ["eval", str(tmp_path / "b"), "--text", str(tmp_path / "train.txt"),
                                        "--context", "32", "--reference", "--threads", "1"], prog_name="edgesdk")
    assert refused.exit_code != 0
    assert f"the adapter's configuration {config} has changed since the build" in refused.stderr


def test_the_default_bundle_of_a_build_with_adapters_is_named_after_them_too(tmp_path):
    """Without --out, a fine-tuned build went to bundles/<model>-<target>, where it replaced the base model's
    bundle (and a build with another adapter replaced it in turn)."""
    from pathlib import Path

    from edgesdk.build.pipeline import default_out
    from edgesdk.models.lora import LoraAdapter

    (tmp_path / "chat-lora").mkdir()
    adapters = (LoraAdapter(str(tmp_path / "chat-lora")), LoraAdapter(str(tmp_path / "style.gguf"), 0.5))
    assert default_out("smollm2-135m", "rpi5") == Path("bundles") / "smollm2-135m-rpi5"
    assert default_out("smollm2-135m", "rpi5", adapters) == Path("bundles") / "smollm2-135m+chat-lora+style-rpi5"
