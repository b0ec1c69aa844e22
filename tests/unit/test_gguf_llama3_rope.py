"""Llama 3's rope scaling through GGUF, both ways: a bundle whose rotary tables slow the low frequencies
(transformers' rope_type llama3, Llama 3.1 / 3.2) is written with llama.cpp's ``rope_freqs.weight``, and a
GGUF file carrying one (or linear scaling) loads as the model llama.cpp computes.

The tiny Llama has a head size of 32 and an original context of 512, so at rotary base 10,000 its 16
frequencies fall in all three of Llama 3's bands (six at full speed, two between, eight slowed by 8) and a
text of 40 tokens turns the slowed ones far enough to change the logits.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ExportError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import llama_cpp_logits
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
TINY = {"hidden": 64, "heads": 2, "kv_heads": 1, "intermediate": 128,
        "config_overrides": {"rope_parameters": LLAMA3_ROPE}}
TEXT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models all day long."
LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from edgesdk.export.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("llama3-rope")
    model_dir = save_tiny_model_dir(root / "model", **TINY)
    bundle = build_tiny_bundle(root, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    return root, bundle, export_gguf(bundle.path, root / "model.gguf")


def _source(root):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(root / "model"), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(root / "model"))


def test_meta_s_llama3_settings_are_recovered_from_the_divisors():
    from edgesdk.models.loader import llama3_divisors, llama3_rope_parameters

    base, dims = 500_000.0, 64  # Llama 3.2 1B / 3B
    wavelength = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)
    meta = {"rope_type": "llama3", "rope_theta": base, "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    divisors = llama3_divisors(meta, wavelength).astype(np.float32).astype(np.float64)
    assert llama3_rope_parameters(divisors, base, dims) == meta
    assert llama3_rope_parameters(np.ones(dims // 2), base, dims) == {}  # plain RoPE
    step = np.where(np.arange(dims // 2) < 8, 1.0, 8.0)  # no band between: no Llama 3 scaling gives it
    assert llama3_rope_parameters(step, base, dims) is None
    assert llama3_rope_parameters(divisors[::-1].copy(), base, dims) is None


def test_a_llama3_rope_bundle_exports_its_factors_and_loads_back_as_the_source_model(exported):
    import gguf

    from edgesdk.models.loader import llama3_divisors, load_model
    from edgesdk.models.sources import resolve_model

    root, _, report = exported
    reader = gguf.GGUFReader(str(report.path))
    factors = next(np.asarray(t.data, np.float64) for t in reader.tensors if t.name == "rope_freqs.weight")
    wavelength = 2 * np.pi * 10_000.0 ** (np.arange(0, 32, 2) / 32)
    expected = llama3_divisors(LLAMA3_ROPE, wavelength)
    assert np.allclose(factors, expected, rtol=1e-4)
    assert 1 < factors[6] < 8  # all three bands are in the file
    assert factors[5] == 1
    assert factors[8] == 8
    assert reader.fields["llama.rope.freq_base"].contents() == pytest.approx(10_000.0, rel=1e-5)

    loaded = load_model(resolve_model(str(report.path)), progress=False)
    assert loaded.model.config.rope_parameters == LLAMA3_ROPE
    source, tokenizer = _source(root)
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    with torch.no_grad():
        assert (loaded.model(ids).logits - source(ids).logits).abs().max().item() < 1e-4


def test_a_bundle_built_from_the_llama3_rope_gguf_scores_as_the_one_built_from_the_model(exported, tmp_path):
    """`edgesdk build` from the GGUF file: its bundle gives the logits of the bundle built from the Hugging
    Face directory, which plain RoPE would not (the slowed frequencies turn within the text)."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.runtime.session import open_runtime

    _, bundle, report = exported
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n")
    rebuilt = build(BuildConfig(target="host", model=str(report.path), out=tmp_path / "from-gguf", recipe=str(recipe),
                                data=DataConfig(files=(), generated_sequences=0), export=ExportConfig(max_context=64),
                                progress=False))
    runtime = open_runtime(bundle.path, threads=1)
    ids = np.array(runtime.tokenizer.encode(TEXT, add_special_tokens=False))
    expected = bundle_scorer(runtime)(ids)
    got = bundle_scorer(open_runtime(rebuilt.path, threads=1))(ids)
    assert float(np.abs(got - expected).max()) < 1e-4


def test_llama_cpp_computes_the_exported_llama3_rope_bundle_as_the_bundle_does(exported):
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from edgesdk.evaluate import bundle_scorer
    from edgesdk.runtime.session import open_runtime

    _, bundle, report = exported
    runtime = open_runtime(bundle.path, threads=1)
    ids = runtime.tokenizer.encode(TEXT, add_special_tokens=False)
    assert len(ids) >= 40
    expected = bundle_scorer(runtime)(np.array(ids))
    diff = float(np.abs(llama_cpp_logits(report.path, ids) - expected).max())
    print(f"llama3 rope in llama.cpp: max abs logit difference {diff:.2e} over {len(ids)} positions")
    assert diff < 1e-3


def test_a_linear_scaled_gguf_loads_with_its_scaling(exported, tmp_path):
    """llama.cpp's linear scaling (rope.scaling.type linear, factor f) divides every frequency by f, as
    transformers' rope_type linear does; the file loads with it."""
    import gguf

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model
    from tests._utils.gguf_files import rewrite_gguf

    root, _, _ = exported
    plain = save_tiny_model_dir(tmp_path / "plain", hidden=64, heads=2, kv_heads=1, intermediate=128)
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=plain)
    from edgesdk.export.gguf_export import export_gguf

    report = export_gguf(bundle.path, tmp_path / "plain.gguf")
    linear = rewrite_gguf(report.path, tmp_path / "linear.gguf",
                   fields={"llama.rope.scaling.type": ("linear", gguf.GGUFValueType.STRING),
                           "llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)})
    loaded = load_model(resolve_model(str(linear)), progress=False)
    assert loaded.model.config.rope_parameters == {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    ids = loaded.tokenizer(TEXT)["input_ids"]
    with torch.no_grad():
        expected = loaded.model(torch.tensor([ids])).logits[0].numpy()
    diff = float(np.abs(llama_cpp_logits(linear, ids) - expected).max())
    print(f"linear rope in llama.cpp: max abs logit difference {diff:.2e} over {len(ids)} positions")
    assert diff < 1e-3


def test_scaled_frequencies_are_refused_where_llama_cpp_s_architecture_reads_no_factors(tmp_path):
    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(tmp_path / "model", model_type="qwen2", **TINY)
    bundle = build_tiny_bundle(tmp_path, "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    with pytest.raises(ExportError, match="llama.cpp's qwen2 architecture does not read"):
        export_gguf(bundle.path, tmp_path / "model.gguf")
