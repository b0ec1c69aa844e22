"""Review 65 of building a fine-tuned Hugging Face directory with a PEFT adapter: a directory without tokenizer
files (transformers' AutoTokenizer then makes an empty tokenizer, no error) and a tokenizer far smaller than the
model's vocabulary are refused; a config.json's auto_map (the model's own code, which edgesdk does not run) is named
in the refusal of its architecture and noted where a built-in class loads the model; a target_modules kind without
factors is warned of (PEFT: "Found missing adapter keys"); an adapter that unties a tied LM head is logged and the
manifest's model.before keeps the source tied; 'edgesdk inspect' shows the merged adapters and the EOS ids. Real
tiny models, a real build and a real 'edgesdk inspect'."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.errors import ModelSourceError
from tests._utils.tiny import CORPUS, save_tiny_model_dir

torch = pytest.importorskip("torch")

TOKENIZER_NAMES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
ALL_LINEAR = (*ATTENTION, "gate_proj", "up_proj", "down_proj")


def _load(directory: Path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(directory), fetch=False), progress=False)


def _set_config(directory: Path, **values) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(values)
    path.write_text(json.dumps(config))


def test_a_directory_without_tokenizer_files_is_refused_not_built_with_an_empty_tokenizer(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "qwen", model_type="qwen2")
    for name in TOKENIZER_NAMES:
        (model_dir / name).unlink(missing_ok=True)
    with pytest.raises(ModelSourceError) as caught:
        _load(model_dir)
    assert f"cannot load the tokenizer of {model_dir}: it has no tokenizer file (tokenizer.json" in caught.value.problem
    assert "tokenizer.json with tokenizer_config.json" in caught.value.fix


@pytest.mark.parametrize("tokens", [["<unk>"], ["<unk>", "a", "b"]], ids=["one-token", "three-tokens"])
def test_a_tokenizer_far_smaller_than_the_embedding_is_refused_naming_both_sizes(tmp_path, tokens):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model_dir = save_tiny_model_dir(tmp_path / "model")
    for name in TOKENIZER_NAMES:
        (model_dir / name).unlink(missing_ok=True)
    backend = Tokenizer(models.WordLevel({token: index for index, token in enumerate(tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>").save_pretrained(model_dir)
    with pytest.raises(ModelSourceError) as caught:
        _load(model_dir)
    assert f"has {len(tokens)} token(s), but the model's embedding has 320 rows" in caught.value.problem
    assert "tokenizer.json" in caught.value.fix


def test_an_auto_map_architecture_is_refused_naming_the_model_s_own_code(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "remote", model_type="qwen2")
    _set_config(model_dir, model_type="myqwen", architectures=["MyQwenForCausalLM"],
                auto_map={"AutoConfig": "configuration_myqwen.MyQwenConfig",
                          "AutoModelForCausalLM": "modeling_myqwen.MyQwenForCausalLM"})
    with pytest.raises(ModelSourceError) as caught:
        _load(model_dir)
    problem = caught.value.problem
    assert "architecture 'myqwen', which edgesdk cannot build from" in problem
    assert "auto_map loads it with the model's own code (configuration_myqwen.py, modeling_myqwen.py" in problem
    assert "edgesdk does not run a model's own code" in problem
    assert "set model_type in config.json" in caught.value.fix
    assert "remove auto_map" in caught.value.fix


def test_an_auto_map_beside_a_built_in_architecture_is_noted_naming_the_class_used(tmp_path):
    model_dir = save_tiny_model_dir(tmp_path / "remote", model_type="qwen2")
    _set_config(model_dir, auto_map={"AutoModelForCausalLM": "modeling_myqwen.MyQwenForCausalLM"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = _load(model_dir)
    notes = [str(w.message) for w in caught if "auto_map" in str(w.message)]
    assert len(notes) == 1, [str(w.message) for w in caught]
    assert "modeling_myqwen.py" in notes[0]
    assert "does not run" in notes[0]
    assert f"built-in {type(loaded.model).__name__} for model_type 'qwen2'" in notes[0]

    plain = save_tiny_model_dir(tmp_path / "plain", model_type="qwen2")  # no auto_map: no note
    _set_config(plain, auto_map={"AutoTokenizer": ["tokenization_x.XTokenizer", None]})  # a tokenizer's code only
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _load(plain)
    assert not [w for w in caught if "auto_map" in str(w.message)]


def test_target_modules_kinds_without_factors_are_warned_of(tmp_path):
    from transformers import AutoModelForCausalLM

    from edgesdk.models.lora import LoraAdapter, merge_adapters
    from tests.unit._lora_files41 import random_factors, write_peft

    model_dir = save_tiny_model_dir(tmp_path / "model")
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    partial = write_peft(tmp_path / "partial", random_factors(base, ATTENTION), {"target_modules": list(ALL_LINEAR)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        merge_adapters(base, [LoraAdapter(str(partial))], "llama")
    named = [str(w.message) for w in caught if "target_modules names" in str(w.message)]
    assert len(named) == 1, [str(w.message) for w in caught]
    assert "target_modules names gate_proj, up_proj, down_proj, but adapter_model.safetensors holds no LoRA " \
        "factors of them (only of k_proj, o_proj, q_proj, v_proj)" in named[0]

    whole = write_peft(tmp_path / "whole", random_factors(base, ALL_LINEAR))  # every kind it names has factors
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        merge_adapters(base, [LoraAdapter(str(whole))], "llama")
    assert not [w for w in caught if "target_modules names" in str(w.message)]


def test_a_build_whose_adapter_unties_the_head_says_so_and_inspect_shows_the_adapter_and_eos_ids(tmp_path):
    """One real build: an adapter on lm_head of a tied model (and target_modules naming gate_proj it has no factors
    of) merged into a directory whose config.json has an auto_map for its built-in architecture."""
    from transformers import AutoModelForCausalLM

    from tests.unit._lora_files41 import random_factors, write_peft

    model_dir = save_tiny_model_dir(tmp_path / "model")
    _set_config(model_dir, auto_map={"AutoModelForCausalLM": "modeling_mine.MineForCausalLM"})
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight
    source_parameters = sum(p.numel() for p in base.parameters())
    head = base.get_output_embeddings().weight
    factors = random_factors(base, ("q_proj", "v_proj"))
    generator = torch.Generator().manual_seed(3)
    factors["lm_head"] = (torch.randn(4, head.shape[1], generator=generator) * 0.1,
                          torch.randn(head.shape[0], 4, generator=generator) * 0.1)
    adapter = write_peft(tmp_path / "adapter", factors,
                         {"target_modules": ["q_proj", "v_proj", "gate_proj", "lm_head"], "lora_alpha": 16})
    (tmp_path / "recipe.yaml").write_text("name: plain\nstages: []\nexport: {form: ort-fused, weights: fp32}\n")
    (tmp_path / "train.txt").write_text("\n".join(CORPUS))
    out = tmp_path / "b"
    built = CliRunner().invoke(main, ["build", "--target", "host", "--model", str(model_dir), "--recipe",
                                      str(tmp_path / "recipe.yaml"), "--max-context", "64", "--out", str(out),
                                      "--no-progress", "--lora", str(adapter)], prog_name="edgesdk")
    assert built.exit_code == 0, built.output
    added = head.numel()
    assert f"untied the LM head from the embedding (+{added:,} parameters)" in built.stderr
    assert "warning: --lora " in built.stderr
    assert "target_modules names gate_proj, but" in built.stderr
    assert "note: " in built.stderr
    assert "auto_map names the model's own code (modeling_mine.py)" in built.stderr
    assert "built-in LlamaForCausalLM" in built.stderr

    manifest = json.loads((out / "manifest.json").read_text())
    before, after = manifest["model"]["before"], manifest["model"]["after"]
    assert before["tie_word_embeddings"] is True  # the source, as --reference-model finds it
    assert before["parameters"] == source_parameters
    assert after["tie_word_embeddings"] is False  # the bundle's own head
    assert after["parameters"] == source_parameters + added
    record, = before["adapters"]
    assert record["untied_parameters"] == added

    inspected = CliRunner().invoke(main, ["inspect", str(out)], prog_name="edgesdk")
    assert inspected.exit_code == 0, inspected.output
    lines = inspected.stdout.splitlines()
    adapter_line = next((line for line in lines if line.startswith("adapter ")), None)
    assert adapter_line == (f"adapter    {adapter.resolve()} (peft, rank 4, alpha 16, scale 1, sha256 "
                            f"{record['sha256'][:12]}); untied the LM head from the embedding (+{added:,} parameters)")
    ids = manifest["tokenizer"]["eos_token_ids"]
    assert ids
    eos_line = next((line for line in lines if line.startswith("eos ")), None)
    assert eos_line is not None, inspected.stdout
    assert eos_line.startswith(f"eos        ids {', '.join(map(str, ids))} (eos token "), inspected.stdout
    assert "lacks" not in inspected.stdout
