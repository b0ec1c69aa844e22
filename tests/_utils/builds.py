"""Tiny compression builds for tests: a recipe's stages on a random model, through the real pipeline."""

from __future__ import annotations

from pathlib import Path

from tests._utils.tiny import CORPUS, save_tiny_model_dir

QDQ_RECIPE = """name: tiny-qdq
stages:
  - stage: smooth
    config: {calibration_batches: 2, batch_size: 2, sequence_length: 24}
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 2, batch_size: 2,
             sequence_length: 24, observer_batches: 2}
export: {form: standard, weights: int8}
"""

JETSON_RECIPE = """name: tiny-jetson
stages:
  - stage: qat
    config: {weight_bits: 8, granularity: channel, activations: tensor, embedding_bits: null, steps: 2,
             batch_size: 2, sequence_length: 24, observer_batches: 2}
  - stage: sparsify
    config: {density: 0.5, reorder: true, calibration_batches: 2, batch_size: 2, sequence_length: 24}
  - stage: distill
    config: {steps: 2, batch_size: 2, sequence_length: 24}
export: {form: standard, weights: int8, sparse: true}
"""


def build_tiny_bundle(root: Path, recipe_text: str, target: str, model_dir: Path | None = None,
                      generated_sequences: int = 2):
    """Build ``recipe_text`` for ``target`` into ``root/b`` (a tiny model is made when none is given)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig

    if model_dir is None:
        model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
    recipe = root / "recipe.yaml"
    recipe.write_text(recipe_text)
    text = root / "train.txt"
    text.write_text("\n".join(CORPUS * 3))
    data = DataConfig(files=(str(text),), skip_chars=2000, generated_sequences=generated_sequences,
                      generated_tokens=8)
    return build(BuildConfig(target=target, model=str(model_dir), out=root / "b", recipe=str(recipe), data=data,
                             export=ExportConfig(max_context=64), progress=False))


def build_codec_bundles(root: Path, recipe_template: str, target: str) -> dict:
    """The same tiny model built twice for ``target``, its weights file stored plain and zlib-coded: the bundles
    by codec ("none", "zlib"); ``recipe_template`` formats ``{codec}``."""
    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
    built = {}
    for codec in ("none", "zlib"):
        (root / codec).mkdir()
        built[codec] = build_tiny_bundle(root / codec, recipe_template.format(codec=codec), target,
                                         model_dir=model_dir, generated_sequences=0)
    return built


def build_tiny_jetson_bundle(root: Path, target: str = "orin-nx"):
    """qat int8 -> sparsify (density 0.5) -> distill, exported as QDQ plus block-sparse weights and kernels."""
    return build_tiny_bundle(root, JETSON_RECIPE, target, generated_sequences=0)


def build_lively_bundle(root: Path, seed: int, max_context: int = 128):
    """A tiny model with untied embeddings built into a bundle: its greedy answers wander over the vocabulary and
    fall into loops now and then, where the tied tiny model repeats its last token. Its output layer is scaled up
    so that its next-token distributions are peaked (a random one's logits span half a nat), so a draft of another
    seed's bundle is both taken and refused."""
    import torch

    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    model = tiny_llama(seed=seed, tie=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(12.0)
    model_dir = root / "model"
    model.save_pretrained(model_dir, safe_serialization=True)
    tiny_tokenizer(model.config.vocab_size).save_pretrained(model_dir)
    return build(BuildConfig(target="host", model=str(model_dir), out=root / "b",
                             export=ExportConfig(max_context=max_context), progress=False))
