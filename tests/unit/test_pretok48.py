"""Review of GGUF BPE pre-tokenizers (edgesdk/models/loader.py) and GGUF LoRA adapters on a base without
head_count_kv (edgesdk/models/lora.py), round 48: each shown on a crafted GGUF file against what llama.cpp
(src/llama-vocab.cpp) or the model the file was converted from computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import ModelSourceError
from tests.unit.test_loader48 import LAYER_TENSORS, _convert_to_gguf
from tests.unit.test_loader48 import _bpe_gguf as _bpe_gguf_of

gguf = pytest.importorskip("gguf")
torch = pytest.importorskip("torch")

# a byte-level vocabulary (ASCII letters and digits spell themselves) whose merges, applied to one pre-token, make
# "a1" (rank 0) and "1234" (ranks 1 to 3): what llama.cpp's regexes leave together decides which
TOKENS = ["<unk>", "<s>", "</s>", "a", "1", "2", "3", "4", "a1", "12", "123", "1234"]
MERGES = ["a 1", "1 2", "12 3", "123 4"]
IDS = {token: index for index, token in enumerate(TOKENS)}


def _bpe_gguf(path: Path, pre: str) -> Path:
    """A one-layer Llama GGUF with the BPE vocabulary above (tokenizer.ggml.model gpt2) and tokenizer.ggml.pre
    ``pre``, as llama.cpp's converter writes one."""
    return _bpe_gguf_of(path, pre, tokens=list(TOKENS), merges=tuple(MERGES), add_bos=False)


def _load(path: Path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False)


# the pieces llama.cpp's regex_exprs (llm_tokenizer_bpe) make of "a1234", then the merges within each
@pytest.mark.parametrize(("pre", "pieces"), [
    ("gpt-2", ["a", "1234"]),  # GPT-2's regex: letters apart from digits (transformers' fallback, unchanged)
    ("starcoder", ["a", "1", "2", "3", "4"]),  # "\p{N}" first: every digit alone (StarCoder, SmolLM, Command-R ...)
    ("command-r", ["a", "1", "2", "3", "4"]),
    ("falcon", ["a", "123", "4"]),  # GPT-2's, then "[0-9][0-9][0-9]"
    ("stablelm2", ["a", "1", "2", "3", "4"]),  # Qwen2's regex: "\p{N}" one digit per piece
    ("chatglm-bpe", ["a", "123", "4"]),  # Llama 3's regex: "\p{N}{1,3}"
    ("deepseek-coder", ["a", "1", "2", "3", "4"]),
    ("bloom", ["a1", "2", "3", "4"]),  # " ?[^(\s|.,!?...)]+": one piece, so the first merge makes "a1"
    ("viking", ["a", "1", "2", "3", "4"]),  # bloom's, then "\p{N}"
    ("default", ["a", "123", "4"]),  # llama.cpp's DEFAULT: punctuation, GPT-2's, "\p{N}+", "[0-9][0-9][0-9]"
])
def test_a_bpe_gguf_splits_text_with_llama_cpps_regexes_for_its_pre_tokenizer(pre, pieces, tmp_path):
    """transformers' GGUF tokenizer splits the text of a BPE vocabulary whose tokenizer.ggml.pre it does not map
    (StarCoder, Command-R, Falcon, StableLM 2, GLM, DeepSeek Coder, BLOOM, Viking ...) with GPT-2's regex, where
    llama.cpp (and the model's own tokenizer.json) splits with that type's regexes: "a1234" came out as "a" "1234"
    for all of them, other ids than llama.cpp's, in the bundle's tokenizer.json too."""
    from tokenizers import Tokenizer

    tokenizer = _load(_bpe_gguf(tmp_path / "bpe.gguf", pre)).tokenizer
    expected = [IDS[piece] for piece in pieces]
    assert tokenizer("a1234").input_ids == expected
    tokenizer.save_pretrained(tmp_path / "saved")  # what the bundle's tokenizer.json is written from
    assert Tokenizer.from_file(str(tmp_path / "saved" / "tokenizer.json")).encode("a1234").ids == expected


def test_a_smollm_gguf_gets_smollm2s_own_pre_tokenizer_which_the_gguf_export_names_again(tmp_path):
    """The "smollm" split is written as SmolLM2's (and StarCoder's) tokenizer.json writes it, Digits with
    individual_digits then ByteLevel with GPT-2's regex, which edgesdk's GGUF export recognises as "smollm": a
    bundle built from a SmolLM2 GGUF exports to a GGUF llama.cpp splits as the original."""
    import json

    from edgesdk.export.gguf_vocab import _pre_tokenizer_name

    tokenizer = _load(_bpe_gguf(tmp_path / "bpe.gguf", "smollm")).tokenizer
    tokenizer.save_pretrained(tmp_path / "saved")
    pre = json.loads((tmp_path / "saved" / "tokenizer.json").read_text())["pre_tokenizer"]
    assert [(part["type"], part.get("individual_digits"), part.get("use_regex")) for part in pre["pretokenizers"]] \
        == [("Digits", True, None), ("ByteLevel", None, True)]
    assert _pre_tokenizer_name(pre, tmp_path) == "smollm"


@pytest.mark.parametrize(("pre", "why"), [
    ("deepseek-llm", "not one edgesdk can rebuild exactly"),
    ("kimi-k2", "not one edgesdk can rebuild exactly"),
    ("no-such-pre", "llama.cpp does not know it"),
])
def test_a_bpe_gguf_whose_pre_tokenizer_cannot_be_rebuilt_is_refused_by_name(pre, why, tmp_path):
    """A pre-tokenizer edgesdk cannot rebuild exactly (DeepSeek LLM's long literal classes, Kimi K2's custom
    code) or one llama.cpp does not know (it refuses the file: "unknown pre-tokenizer type") tokenized silently
    with GPT-2's regex. It is refused before the weights load, naming the type, with the fix."""
    from edgesdk.models.loader import check_gguf_model

    path = _bpe_gguf(tmp_path / "bpe.gguf", pre)
    with pytest.raises(ModelSourceError) as refused:
        check_gguf_model(path)
    message = str(refused.value)
    assert f"with the pre-tokenizer '{pre}' (tokenizer.ggml.pre)" in message
    assert why in message
    assert "GPT-2's regex" in message
    assert "Hugging Face directory" in refused.value.fix


def test_edgesdks_splits_agree_with_transformers_for_the_types_it_maps():
    """The types transformers' GGUF tokenizer maps itself (Llama 3, Qwen2, tekken, GPT-4o ...) get the same regex
    from edgesdk's table, which follows llama.cpp's: the two do not disagree where both hold a type."""
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    from edgesdk.models.loader import BPE_PRE_TOKENIZER_SPLITS

    for pre, regex in mapping.GGUF_PRE_TOKENIZER_SPLITS.items():
        assert BPE_PRE_TOKENIZER_SPLITS[pre] == (regex,), pre


SMOLLM2 = Path("~/.cache/edgesdk/models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf").expanduser()


@pytest.mark.skipif(not SMOLLM2.exists(), reason="the SmolLM2-135M GGUF is not downloaded")
def test_smollm2s_tokenization_is_llama_cpps():
    """SmolLM2's "smollm" type (llama.cpp: every "\\p{N}" alone, then GPT-2's regex; its tokenizer.json: Digits
    with individual_digits, then ByteLevel): ids of text with ASCII digits are the same as before (its vocabulary
    has no token of a digit with anything else), the ids llama.cpp's tokenizer check gives; a numeral outside
    ASCII after a space is now split from it, as llama.cpp splits it, where GPT-2's regex alone kept " \u0661"
    one piece and merged the space with the numeral's first byte."""
    from transformers import AutoTokenizer

    from edgesdk.models.loader import _set_bpe_pre_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(SMOLLM2.parent), gguf_file=SMOLLM2.name)
    _set_bpe_pre_tokenizer(tokenizer, SMOLLM2)
    for text, ids in {"Hello, we can use": [19556, 28, 392, 416, 722],
                      "Hello world! 123": [19556, 905, 17, 216, 33, 34, 35],
                      "Caf\u00e9 d\u00e9j\u00e0 vu.": [51, 1939, 2756, 32564, 90, 16739, 386, 101, 30],
                      "  multiple   spaces": [216, 2701, 256, 5600]}.items():
        assert tokenizer(text).input_ids == ids, text
    assert tokenizer(" \u0661\u0662").input_ids == [216, *tokenizer("\u0661").input_ids, *tokenizer("\u0662").input_ids]


# ------------------------------------------------------------------------------- GGUF LoRA, base without kv count

def _permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute`` (n_head_kv None: the query count), which
    convert_lora_to_gguf.py applies to lora_b of q_proj / k_proj as to the base weights."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def test_a_gguf_lora_on_a_base_without_head_count_kv_merges_as_the_adapter_computes(tmp_path):
    """convert_lora_to_gguf.py permutes lora_b of q_proj / k_proj with the base's head counts (n_head_kv None:
    the query count), as the base's own rows; edgesdk puts them back with the loaded base's counts, whose
    num_key_value_heads is the query count for a file without head_count_kv (llama.cpp: n_head_kv = n_head), and
    the base's rows are put back by the loader. The merge equals the unmerged adapter's forward."""
    from edgesdk.models.lora import LoraAdapter, merge_adapters
    from tests._utils.tiny import tiny_llama
    from tests.unit._lora_files41 import lora_forward_logits, random_factors, write_gguf_adapter

    original = tiny_llama(heads=4, kv_heads=4)
    # as llama.cpp's converter writes it, without llama.attention.head_count_kv (gguf.md: optional without GQA)
    base = _convert_to_gguf(original, tmp_path / "mha.gguf", head_count_kv=False)
    factors = random_factors(original, targets=("q_proj", "k_proj", "v_proj"), rank=2)
    pairs = {}
    for name, (a, b) in factors.items():
        layer, kind = name.split(".")[2], name.rsplit(".", 1)[-1]
        b = b.numpy()
        if kind in ("q_proj", "k_proj"):
            b = _permute(b, original.config.num_attention_heads, None)
        pairs[f"blk.{layer}.{LAYER_TENSORS[f'self_attn.{kind}']}.weight"] = (a.numpy(), b)
    adapter = write_gguf_adapter(tmp_path / "adapter.gguf", "llama", pairs, alpha=4)
    ids = torch.tensor([[1, 5, 9, 33, 7, 100, 250]])
    expected = lora_forward_logits(original, ids, factors, dict.fromkeys(factors, 4 / 2))
    model = _load(base).model
    merge_adapters(model, [LoraAdapter(str(adapter), 1.0)], "llama")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=1e-4)
