"""A tiny Jetson bundle with block-sparse weights and AOT kernels (qat int8 -> sparsify -> distill)."""

from __future__ import annotations

from pathlib import Path

from tests._utils.tiny import CORPUS, save_tiny_model_dir

RECIPE = """name: tiny-jetson
stages:
  - stage: qat
    config: {weight_bits: 8, granularity: channel, activations: tensor, embedding_bits: null, steps: 2,
             batch_size: 2, sequence_length: 24, observer_batches: 2}
  - stage: sparsify
    config: {density: 0.5, calibration_batches: 2, batch_size: 2, sequence_length: 24}
  - stage: distill
    config: {steps: 2, batch_size: 2, sequence_length: 24}
export: {form: standard, weights: int8, sparse: true}
"""


def build_tiny_jetson_bundle(root: Path, target: str = "orin-nx"):
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
    recipe = root / "tiny-jetson.yaml"
    recipe.write_text(RECIPE)
    text = root / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    data = DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=0)
    return build(BuildConfig(target=target, model=str(model_dir), out=root / "bundle", recipe=str(recipe),
                             data=data, export=ExportConfig(max_context=64), progress=False))
