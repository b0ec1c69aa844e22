"""GGUF sizes a third-party converter may write otherwise than llama.cpp's (edgesdk/models/loader.py), round 63:
head counts or an FFN width given one per layer, a context length of 0, an RMS epsilon given as an integer and a
special token id given as text or a float are refused naming the key, its value and what llama.cpp reads, where
they failed in transformers' config validation reported as a damaged download, or (a context of 0) loaded; the
fixes the refusals give, run, make files that load."""

from __future__ import annotations

import shlex
import sys

import pytest

from edgesdk.errors import ModelSourceError
from tests._utils.gguf_files import rewrite_gguf

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

T = gguf.GGUFValueType
# gguf-py's command-line tools as modules of the installed package (the commands the fixes name)
TOOLS = {"gguf-set-metadata": "gguf.scripts.gguf_set_metadata", "gguf-new-metadata": "gguf.scripts.gguf_new_metadata"}


def _load(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


def _refusal(path) -> ModelSourceError:
    with pytest.raises(ModelSourceError) as refused:
        _load(path)
    assert "download" not in str(refused.value)
    return refused.value


def _run_fix(fix: str, folder) -> None:
    """The gguf-py command in ``fix`` (after its ": "), run in ``folder`` with this interpreter's gguf package."""
    import subprocess

    words = shlex.split(fix.split(": ", 1)[1].split(", and pass")[0].split(", or build")[0])
    subprocess.run([sys.executable, "-m", TOOLS[words[0]], *words[1:]], cwd=folder, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory):
    """A tiny GQA Llama (2 layers, 4 heads sharing 2 key-value heads, FFN 128) written as llama.cpp's converter
    writes it."""
    from tests._utils.tiny import tiny_llama
    from tests.unit.test_gguf_meta62 import _llama_gguf

    model = tiny_llama(heads=4, kv_heads=2, hidden=64, intermediate=128, vocab_size=256)
    return _llama_gguf(model, tmp_path_factory.mktemp("gguf") / "llama.gguf")


@pytest.mark.parametrize(("architecture", "key", "values"), [
    ("llama", "attention.head_count", [4, 4]),
    ("llama", "attention.head_count_kv", [2, 2]),
    ("qwen2", "feed_forward_length", [128, 128]),
    ("qwen2", "attention.head_count", [4, 4]),
])
def test_sizes_given_one_per_layer_all_the_same_are_refused_naming_the_key(llama_gguf, architecture, key, values,
                                                                           tmp_path):
    """llama.cpp reads these keys as one value or one per layer (get_key_or_arr); transformers' GGUF reader put
    the list in its config, whose validation refused it ("expected int, got list"), reported as a damaged file."""
    path = rewrite_gguf(llama_gguf, tmp_path / "per_layer.gguf", architecture=architecture,
                        arrays={f"{architecture}.{key}": values})

    refused = _refusal(path)

    assert f"gives {architecture}.{key} as one value per layer ({values!r}), all the same" in str(refused)
    assert "per-layer sizes are not supported" in str(refused)
    assert "convert_hf_to_gguf.py" in refused.fix


@pytest.mark.parametrize(("key", "values"), [("attention.head_count_kv", [2, 1]),
                                             ("feed_forward_length", [128, 64])])
def test_sizes_that_differ_per_layer_are_refused_as_not_supported(llama_gguf, key, values, tmp_path):
    path = rewrite_gguf(llama_gguf, tmp_path / "per_layer.gguf", arrays={f"llama.{key}": values})

    refused = _refusal(path)

    assert f"gives a different llama.{key} per layer ({values!r})" in str(refused)
    assert "per-layer sizes (as OpenELM's files give them) are not supported" in str(refused)


@pytest.mark.parametrize(("context", "kind"), [(0, T.UINT32), (-1, T.INT32)])
def test_a_context_length_that_is_not_positive_is_refused_and_the_fix_loads(llama_gguf, context, kind, tmp_path):
    """A context of 0 loaded as max_position_embeddings 0 (the build then failed naming that, not the file's key);
    llama.cpp makes no context of it unless one is given. The fix's gguf-set-metadata makes a file that loads."""
    path = rewrite_gguf(llama_gguf, tmp_path / "context.gguf", fields={"llama.context_length": (context, kind)})

    refused = _refusal(path)

    assert f"gives llama.context_length {context}, where it is the number of positions" in str(refused)
    assert "gguf-set-metadata --force" in refused.fix
    _run_fix(refused.fix, tmp_path)
    assert _load(path).model.config.max_position_embeddings == 4096


@pytest.mark.parametrize(("key", "value"), [("llama.attention.layer_norm_rms_epsilon", 0),
                                            ("llama.rope.freq_base", 10000)])
def test_a_float_size_given_as_an_integer_is_refused_naming_its_type(llama_gguf, key, value, tmp_path):
    """llama.cpp reads these as float32 and refuses an integer ("wrong type u32 but expected type f32"); an integer
    epsilon failed transformers' config validation ("expected float, got int"), reported as a damaged download."""
    path = rewrite_gguf(llama_gguf, tmp_path / "integer.gguf", fields={key: (value, T.UINT32)})

    refused = _refusal(path)

    assert f"gives {key} as int {value}, where llama.cpp reads a float32 number" in str(refused)
    assert "wrong type" in str(refused)


@pytest.mark.parametrize(("value", "kind"), [("1", T.STRING), (1.0, T.FLOAT32)])
def test_a_special_token_id_that_is_no_whole_number_is_refused_and_the_fix_loads(llama_gguf, value, kind, tmp_path):
    """transformers' config validation refused "expected int, got str", reported as a damaged download; llama.cpp
    refuses the key's type. The fix's gguf-new-metadata writes the id as a number, and that file loads."""
    path = rewrite_gguf(llama_gguf, tmp_path / "bos.gguf", fields={"tokenizer.ggml.bos_token_id": (value, kind)})

    refused = _refusal(path)

    assert f"gives tokenizer.ggml.bos_token_id as {type(value).__name__} {value!r}" in str(refused)
    assert "--special-token-by-id bos 1 " in refused.fix
    _run_fix(refused.fix, tmp_path)
    assert _load(tmp_path / "fixed.gguf").model.config.bos_token_id == 1
