"""Review of GGUF rotary scaling (Llama 3's rope_freqs, linear scaling) both ways: faults found and fixed, each
shown on real files, and where llama-cpp-python is installed, against llama.cpp itself."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import llama_cpp_logits, rewrite_gguf
from tests._utils.tiny import save_tiny_model_dir

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

FUSED_FP32 = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"
TEXT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models all day long."
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
F32, STRING = gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING


def _export(root, **model):
    from edgesdk.export.gguf_export import export_gguf

    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=2, kv_heads=1, intermediate=128, **model)
    bundle = build_tiny_bundle(root, FUSED_FP32, "host", model_dir=model_dir)
    return export_gguf(bundle.path, root / "model.gguf").path


@pytest.fixture(scope="module")
def plain_llama(tmp_path_factory):
    """A tiny Llama's float32 GGUF (head size 32, plain RoPE at 10,000)."""
    return _export(tmp_path_factory.mktemp("plain-llama"))


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


def _llama3_divisors(head_dim: int = 32, base: float = 10_000.0) -> np.ndarray:
    from edgesdk.models.loader import llama3_divisors

    return llama3_divisors(LLAMA3_ROPE, 2 * np.pi * base ** (np.arange(0, head_dim, 2) / head_dim))


def test_a_linear_factor_without_a_type_scales_the_rotary_as_in_llama_cpp(plain_llama, tmp_path):
    """llama.cpp takes a missing rope.scaling.type as linear and the factor from rope.scaling.factor, else from
    the older rope.scale_linear (``llama-model.cpp``, load_hparams), so a file with only a factor is linearly
    scaled there; it loaded with plain RoPE. A file with rope_freqs and a linear factor is scaled by both in
    llama.cpp, and loaded with the rope_freqs alone."""
    only_factor = rewrite_gguf(plain_llama, tmp_path / "factor.gguf", fields={"llama.rope.scaling.factor": (4.0, F32)})
    old_key = rewrite_gguf(plain_llama, tmp_path / "old.gguf", fields={"llama.rope.scale_linear": (4.0, F32)})
    linear = {"rope_type": "linear", "rope_theta": 10_000.0, "factor": 4.0}
    for path in (only_factor, old_key):
        assert _load(path).model.config.rope_parameters == linear
    none = rewrite_gguf(plain_llama, tmp_path / "none.gguf", fields={"llama.rope.scaling.type": ("none", STRING),
                                                                "llama.rope.scaling.factor": (4.0, F32)})
    assert _load(none).model.config.rope_parameters["rope_type"] == "default"  # type none: llama.cpp never scales
    both = rewrite_gguf(plain_llama, tmp_path / "both.gguf", fields={"llama.rope.scaling.factor": (4.0, F32)},
                    tensors={"rope_freqs.weight": _llama3_divisors()})
    with pytest.raises(ModelSourceError, match="a rope_freqs.weight tensor and a linear scaling factor of 4"):
        _load(both)

    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    loaded = _load(only_factor)
    ids = loaded.tokenizer(TEXT)["input_ids"]
    with torch.no_grad():
        expected = loaded.model(torch.tensor([ids])).logits[0].numpy()
    plain = llama_cpp_logits(plain_llama, ids)
    for path in (only_factor, old_key):
        got = llama_cpp_logits(path, ids)
        diff = float(np.abs(got - expected).max())
        print(f"{path.name} in llama.cpp: max abs logit difference {diff:.2e} (from plain RoPE "
              f"{float(np.abs(got - plain).max()):.2e})")
        assert diff < 1e-3
        assert float(np.abs(got - plain).max()) > 5 * diff  # llama.cpp does scale it
    with_freqs = rewrite_gguf(plain_llama, tmp_path / "freqs.gguf", tensors={"rope_freqs.weight": _llama3_divisors()})
    scaled_too = float(np.abs(llama_cpp_logits(both, ids) - llama_cpp_logits(with_freqs,
                                                                                          ids)).max())
    print(f"rope_freqs and a linear factor in llama.cpp: {scaled_too:.2e} from rope_freqs alone")
    assert scaled_too > 1e-3  # llama.cpp applies both


def test_rope_freqs_is_refused_where_llama_cpp_reads_none_or_the_rotary_spans_part_of_the_head(plain_llama, tmp_path):
    """llama.cpp reads rope_freqs.weight for llama (and deci) only: a Qwen2 file with one is refused there, and
    loaded as Llama 3's scaling. A rotary dimension count below the head size (partial rotary, which llama.cpp's
    llama refuses) had its factors fitted over the rotary dimensions and applied by transformers over the whole
    head, which divides other frequencies."""
    qwen2 = _export(tmp_path / "qwen2", model_type="qwen2")
    scaled = rewrite_gguf(qwen2, tmp_path / "qwen2-freqs.gguf", tensors={"rope_freqs.weight": _llama3_divisors()})
    with pytest.raises(ModelSourceError, match="llama.cpp's qwen2 architecture does not read"):
        _load(scaled)
    partial = rewrite_gguf(plain_llama, tmp_path / "partial.gguf",
                       fields={"llama.rope.dimension_count": (16, gguf.GGUFValueType.UINT32)},
                       tensors={"rope_freqs.weight": _llama3_divisors(head_dim=16)})
    with pytest.raises(ModelSourceError, match=r"rotates 16 of each head's 32 dimensions") as refused:
        _load(partial)
    assert "(32)" in refused.value.fix

    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    for path in (scaled, partial):  # the premise: llama.cpp loads neither
        with pytest.raises(ValueError, match="Failed to load model"):
            llama_cpp.Llama(str(path), n_ctx=128, n_threads=1, verbose=False)


def test_a_rope_freqs_of_the_wrong_length_or_with_nan_is_named_as_such(plain_llama, tmp_path):
    """Both were refused as factors "no Llama 3 rope scaling gives" (with a range of "nan to nan" for a NaN),
    which sends the user after the scaling instead of the damaged tensor."""
    divisors = _llama3_divisors()
    short = rewrite_gguf(plain_llama, tmp_path / "short.gguf", tensors={"rope_freqs.weight": divisors[:8]})
    with pytest.raises(ModelSourceError, match=r"rope_freqs.weight tensor of 8 values, where its 32 rotary "
                                               r"dimensions \(llama.rope.dimension_count\) take 16"):
        _load(short)
    nan = rewrite_gguf(plain_llama, tmp_path / "nan.gguf",
                   tensors={"rope_freqs.weight": np.where(np.arange(16) == 12, np.nan, divisors)})
    with pytest.raises(ModelSourceError, match=r"16 values, 1 of them not finite \(NaN or infinity\)") as refused:
        _load(nan)
    assert "convert the model again" in refused.value.fix


@pytest.mark.parametrize("context", [48, 100])
def test_llama3_tables_whose_band_between_starts_at_the_second_or_third_frequency_export(context, tmp_path):
    """theta was fitted from at least three leading frequencies besides the first, so a Llama 3 scaling whose
    band between starts at the second or third (an original context short against theta: 48 and 100 at a
    head size of 32 and theta 10,000) was refused as 'neither plain RoPE nor plain RoPE with slower low
    frequencies (Llama 3's scaling)', which it is."""
    from edgesdk.export.bundle_weights import fit_rope
    from edgesdk.models.loader import llama3_divisors, llama3_rope_parameters

    head_dim, positions = 32, 256
    exponents = np.arange(0, head_dim, 2) / head_dim
    rope = {**LLAMA3_ROPE, "original_max_position_embeddings": context}
    divisors = llama3_divisors(rope, 2 * np.pi * 10_000.0 ** exponents)
    first = 2 if context == 48 else 3  # the first slowed frequency
    assert divisors[first - 1] == 1
    assert divisors[first] > 1
    angles = torch.arange(positions, dtype=torch.float32)[:, None] * torch.tensor(10_000.0 ** -exponents / divisors,
                                                                                   dtype=torch.float32)
    fit = fit_rope(angles.cos().numpy(), angles.sin().numpy(), head_dim, tmp_path)
    assert fit.theta == 10_000.0
    assert np.allclose(fit.factors, divisors, rtol=1e-5)
    assert llama3_rope_parameters(fit.factors.astype(np.float64), fit.theta, head_dim) == rope


def test_a_rope_freqs_tensor_of_ones_is_plain_rope_at_the_files_base(plain_llama, tmp_path):
    """llama.cpp divides each frequency by its factor, so factors all 1 are plain RoPE (its converter writes them
    for a llama3 rope setting of factor 1). The empty rope parameters fitted to them replaced the config's, rope
    type and base with them, and the load failed with KeyError 'rope_type', blamed on a damaged file."""
    freq_base = rewrite_gguf(plain_llama, tmp_path / "base.gguf", fields={"llama.rope.freq_base": (500_000.0, F32)})
    ones = rewrite_gguf(freq_base, tmp_path / "ones.gguf", tensors={"rope_freqs.weight": np.ones(16, np.float32)})
    plain, loaded = _load(freq_base).model, _load(ones).model
    assert loaded.config.rope_parameters == plain.config.rope_parameters
    assert loaded.config.rope_parameters["rope_theta"] == 500_000.0
    torch.testing.assert_close(loaded.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq)
