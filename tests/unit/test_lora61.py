"""Review 61: what an adapter's adapter_config.json or GGUF header sets that edgesdk does not merge (DoRA, an
adapter.type other than lora) is refused before the base model is fetched or loaded; a rank_pattern key that is no
regular expression is refused by name; a Hub id given with --lora is told how to fetch it; and a PEFT adapter with
per-module ranks and rsLoRA merges as the reference W + scale * alpha / sqrt(r) * B @ A."""

from __future__ import annotations

import math
import shlex

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
gguf = pytest.importorskip("gguf")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, check_adapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import random_factors, write_gguf_adapter, write_peft  # noqa: E402


def test_a_peft_reference_merge_with_rank_pattern_and_rslora(tmp_path):
    """The merged model's logits equal those of the base whose weights are set to W + scale * alpha / sqrt(r) * B @ A
    (rsLoRA, r from rank_pattern where a key matches, alpha from alpha_pattern), each computed here."""
    base = tiny_llama(seed=7)
    factors = random_factors(base, targets=("q_proj", "v_proj", "down_proj"), rank=4, ranks={"v_proj": 2})
    config = {"r": 4, "lora_alpha": 8, "use_rslora": True, "rank_pattern": {"v_proj": 2},
              "alpha_pattern": {"layers\\.1\\.mlp\\.down_proj": 3}}
    adapter = write_peft(tmp_path / "adapter", factors, config)
    reference = tiny_llama(seed=7)
    modules = dict(reference.named_modules())
    with torch.no_grad():
        for name, (a, b) in factors.items():
            rank = 2 if name.endswith("v_proj") else 4
            alpha = 3 if name == "model.layers.1.mlp.down_proj" else 8
            modules[name].weight += 0.5 * alpha / math.sqrt(rank) * (b @ a)
    merged = tiny_llama(seed=7)
    (record,) = merge_adapters(merged, [LoraAdapter(str(adapter), 0.5, option="--lora-scaled")], "llama")
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        expected, got, before = reference(ids).logits, merged(ids).logits, base(ids).logits
    assert record["modules"] == len(factors)
    assert (expected - before).abs().max() > 0.05  # the adapter moves the logits
    assert torch.allclose(got, expected, atol=1e-5)


def test_a_dora_adapter_is_refused_before_the_model_is_loaded(tmp_path):
    """check_adapter, which the build and build_bundle() run before the base model is fetched or loaded, returned
    'peft' for a DoRA adapter: its use_dora was refused only by the merge, after the model had been downloaded and
    loaded. It now refuses it there, naming the field and its value."""
    model = tiny_llama(seed=4)
    adapter = write_peft(tmp_path / "dora", random_factors(model, targets=("q_proj",)), {"use_dora": True})
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(adapter), 0.5, option="--lora-scaled"))
    assert refused.value.problem.startswith(f"--lora-scaled {adapter} 0.5: the adapter sets use_dora: true")
    plain = write_peft(tmp_path / "plain", random_factors(model, targets=("q_proj",)))
    assert check_adapter(LoraAdapter(str(plain))) == "peft"


def _gguf_of_type(path, adapter_type: str):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, adapter_type)
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 4.0)
    writer.add_tensor("blk.0.attn_v.weight.lora_a", np.ones((2, 64), np.float32))
    writer.add_tensor("blk.0.attn_v.weight.lora_b", np.ones((32, 2), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_adapter_that_is_no_lora_is_refused_before_the_model_is_loaded(tmp_path):
    """A GGUF adapter whose adapter.type is not lora, or whose alpha is negative, passed check_adapter and was
    refused only after the base model loaded; both are now refused by check_adapter, naming the key and value."""
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(_gguf_of_type(tmp_path / "cvec.gguf", "ia3"))))
    assert "adapter.type is 'ia3', expected 'lora'" in refused.value.problem
    negative = write_gguf_adapter(tmp_path / "negative.gguf", "llama",
                                  {"blk.0.attn_v.weight": (np.ones((2, 64)), np.ones((32, 2)))}, -4)
    with pytest.raises(ModelSourceError, match=r"adapter\.lora\.alpha is -4\.0"):
        check_adapter(LoraAdapter(str(negative)))
    fine = write_gguf_adapter(tmp_path / "fine.gguf", "llama",
                              {"blk.0.attn_v.weight": (np.ones((2, 64)), np.ones((32, 2)))}, 4)
    assert check_adapter(LoraAdapter(str(fine))) == "gguf"
    model = tiny_llama(seed=4)
    weight = model.model.layers[0].self_attn.v_proj.weight.detach().clone()
    merge_adapters(model, [LoraAdapter(str(fine))], "llama")
    assert torch.allclose(model.model.layers[0].self_attn.v_proj.weight, weight + 4 / 2 * 2)  # alpha / r * (B @ A)


@pytest.mark.parametrize("option", ["rank_pattern", "alpha_pattern"])
def test_a_pattern_key_that_is_no_regular_expression_is_refused_by_name(tmp_path, option):
    """PEFT matches each rank_pattern / alpha_pattern key as a regular expression; a key that does not compile
    ("q_proj(") stopped the merge with a bare re.error traceback naming neither the adapter nor the key."""
    model = tiny_llama(seed=4)
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    adapter = write_peft(tmp_path / "bad", random_factors(model, targets=("q_proj",)), {option: {"q_proj(": 4}})
    for call in (lambda: check_adapter(LoraAdapter(str(adapter))),
                 lambda: merge_adapters(model, [LoraAdapter(str(adapter))], "llama")):
        with pytest.raises(ModelSourceError) as refused:
            call()
        assert refused.value.problem.startswith(f"--lora {adapter}: adapter_config.json gives the {option} key "
                                                '"q_proj(", which is not a regular expression')
        assert "adapter_config.json" in refused.value.fix
    assert torch.equal(model.model.layers[0].self_attn.q_proj.weight, before)


def test_a_hub_id_given_with_lora_is_told_how_to_fetch_it(tmp_path, monkeypatch):
    """--model tells a Hub id it does not download to download it or pass its cached copy; --lora said only 'no such
    file or directory' and to pass an adapter directory. It now gives the download command, or the cached
    snapshot with the option and scale it was given with."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter("someone/my-lora"))
    assert refused.value.problem == "--lora someone/my-lora: no such file or directory"
    assert "hf download someone/my-lora --local-dir my-lora" in refused.value.fix
    assert refused.value.fix.endswith("--lora my-lora")

    snapshot = tmp_path / "hub" / "models--someone--my-lora" / "snapshots" / "abc123"
    write_peft(snapshot, random_factors(tiny_llama(seed=4), targets=("q_proj",)))
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter("someone/my-lora", 0.5, option="--lora-scaled"))
    assert refused.value.fix.endswith(f"pass its cached copy, --lora-scaled {shlex.quote(str(snapshot))} 0.5")
    assert check_adapter(LoraAdapter(str(snapshot), 0.5, option="--lora-scaled")) == "peft"

    with pytest.raises(ModelSourceError) as refused:  # a path that cannot be a Hub id keeps the plain fix
        check_adapter(LoraAdapter("./missing"))
    assert refused.value.fix == "pass a PEFT adapter directory or a GGUF LoRA adapter file"
