"""Review pass 35 of the export and GGUF code: faults found and fixed, each shown on real files."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.builds import build_tiny_bundle
from tests._utils.gguf_files import rewrite_gguf
from tests._utils.tiny import save_tiny_model_dir

pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

FUSED_FP32 = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"
PROMPT = "The quick brown fox jumps over the lazy dog. Edge boards run small language models."


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    """A tiny Llama bundle's float32 GGUF export (plain RoPE)."""
    from edgesdk.export.gguf_export import export_gguf

    root = tmp_path_factory.mktemp("llama")
    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, intermediate=128)
    bundle = build_tiny_bundle(root, FUSED_FP32, "host", model_dir=model_dir)
    return export_gguf(bundle.path, root / "model.gguf").path


def _llama3_factors(head_dim: int = 16) -> np.ndarray:
    """A ``rope_freqs.weight`` as llama.cpp's converter writes it for Llama 3.1 / 3.2 (rope_type llama3): the
    divisor of each rotary frequency, all but the fastest divided by 8 (a tiny model's few positions turn only
    the fast ones far enough to change its logits)."""
    return np.where(np.arange(head_dim // 2) < 1, 1.0, 8.0).astype(np.float32)


def test_a_gguf_whose_rotary_frequencies_llama_cpp_rescales_is_refused_at_load(llama_gguf, tmp_path):
    """Llama 3.x GGUF files carry their rope scaling as a rope_freqs tensor; others (linear, YaRN) as
    {arch}.rope.scaling.* keys. transformers' GGUF reader drops both and loads plain RoPE, so the bundle would
    compute something else than the file (as llama.cpp runs it) without a word."""
    import gguf

    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    freqs = rewrite_gguf(llama_gguf, tmp_path / "freqs.gguf", tensors={"rope_freqs.weight": _llama3_factors()})
    with pytest.raises(ModelSourceError, match="rope_freqs.weight") as refused:
        load_model(resolve_model(str(freqs)), progress=False)
    assert "Hugging Face directory" in refused.value.fix

    linear = rewrite_gguf(llama_gguf, tmp_path / "linear.gguf",
                   fields={"llama.rope.scaling.type": ("linear", gguf.GGUFValueType.STRING),
                           "llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)})
    loaded = load_model(resolve_model(str(linear)), progress=False)  # linear scaling loads as itself
    assert loaded.model.config.rope_parameters["rope_type"] == "linear"
    yarn = rewrite_gguf(llama_gguf, tmp_path / "yarn.gguf",
                 fields={"llama.rope.scaling.type": ("yarn", gguf.GGUFValueType.STRING),
                         "llama.rope.scaling.factor": (4.0, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(ModelSourceError, match=r"llama.rope.scaling.type = 'yarn'"):
        load_model(resolve_model(str(yarn)), progress=False)

    # a file that says its rotary is not scaled loads as before
    plain = rewrite_gguf(llama_gguf, tmp_path / "plain.gguf",
                  fields={"llama.rope.scaling.type": ("none", gguf.GGUFValueType.STRING)})
    assert load_model(resolve_model(str(plain)), progress=False).model.config.model_type == "llama"


def test_llama_cpp_computes_a_rope_freqs_file_differently_from_plain_rope(llama_gguf, tmp_path):
    """The premise of the refusal: llama.cpp divides the rotary frequencies by rope_freqs, so the same weights
    give other logits than the file without it (which is what transformers loads)."""
    llama_cpp = pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)

    files = [llama_gguf, rewrite_gguf(llama_gguf, tmp_path / "ones.gguf", tensors={"rope_freqs.weight": np.ones(8)}),
             rewrite_gguf(llama_gguf, tmp_path / "freqs.gguf", tensors={"rope_freqs.weight": _llama3_factors()})]
    scores = []
    for path in files:
        model = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, n_threads=1, verbose=False)
        ids = model.tokenize(PROMPT.encode(), add_bos=False)
        model.eval(ids)
        scores.append(np.array(model.scores[:len(ids)]))
    assert float(np.abs(scores[1] - scores[0]).max()) < 1e-5  # factors of 1: plain RoPE
    assert float(np.abs(scores[2] - scores[0]).max()) > 1e-3  # measured 4e-3 over these 20 positions
