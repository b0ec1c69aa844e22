"""Review 58: a PEFT adapter trained for a task head (task_type SEQ_CLS, TOKEN_CLS, QUESTION_ANS) is refused by its
task type, not blamed on the base model; a directory holding a GGUF adapter names the file to pass."""

from __future__ import annotations

import shlex

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("gguf")

from edgesdk.errors import ModelSourceError  # noqa: E402
from edgesdk.models.lora import LoraAdapter, check_adapter, merge_adapters  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402
from tests.unit._lora_files41 import random_factors, write_gguf_adapter, write_peft  # noqa: E402


@pytest.mark.parametrize(("task_type", "head"), [("SEQ_CLS", "score"), ("TOKEN_CLS", "classifier"),
                                                 ("QUESTION_ANS", "qa_outputs")])
def test_an_adapter_trained_with_a_task_head_is_refused_by_its_task_type(tmp_path, task_type, head):
    """A sequence-classification adapter (PEFT saves its head, score, as modules_to_save) was refused as holding
    'a module score the model has not', telling the user to pass another base model; no base model has a
    classification head edgesdk can build, so the refusal names the task type and asks for a CAUSAL_LM adapter."""
    model = tiny_llama(seed=4)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    adapter = write_peft(tmp_path / "classifier", random_factors(model, targets=("q_proj",), rank=4),
                         {"task_type": task_type, "modules_to_save": [head]},
                         extra={f"base_model.model.{head}.weight": torch.randn(2, model.config.hidden_size)})
    with pytest.raises(ModelSourceError) as refused:
        merge_adapters(model, [LoraAdapter(str(adapter), 0.5, option="--lora-scaled")], "llama")
    problem = refused.value.problem
    assert problem.startswith(f"--lora-scaled {adapter} 0.5: ")
    assert f"task_type '{task_type}'" in problem
    assert "the model has not" not in problem
    assert "CAUSAL_LM" in refused.value.fix
    assert "--lora-scaled" in refused.value.fix
    assert "--model" not in refused.value.fix
    assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())


def test_a_causal_lm_adapter_is_still_merged(tmp_path):
    model = tiny_llama(seed=4)
    weight = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    adapter = write_peft(tmp_path / "lm", random_factors(model, targets=("q_proj",), rank=4),
                         {"task_type": "CAUSAL_LM"})
    merge_adapters(model, [LoraAdapter(str(adapter))], "llama")
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, weight)


def test_a_directory_holding_a_gguf_adapter_names_the_file_to_pass(tmp_path):
    """A downloaded GGUF adapter repository given as its directory was told only 'the directory has no
    adapter_config.json' and to pass 'a GGUF LoRA adapter'; the refusal now names the GGUF file it holds and the
    option to pass it with, as llama.cpp's --lora takes the file."""
    directory = tmp_path / "my lora"
    directory.mkdir()
    gguf_file = write_gguf_adapter(directory / "adapter-f16.gguf", "llama",
                                   {"blk.0.attn_v.weight": (np.ones((2, 64)), np.ones((32, 2)))}, 4)
    given = LoraAdapter(str(directory), 0.25, option="--lora-scaled")
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(given)
    assert "adapter-f16.gguf" in refused.value.problem
    assert refused.value.fix.endswith(f"--lora-scaled {shlex.quote(str(gguf_file))} 0.25")
    assert check_adapter(LoraAdapter(str(gguf_file), 0.25, option="--lora-scaled")) == "gguf"


def test_a_directory_without_an_adapter_keeps_its_refusal(tmp_path):
    directory = tmp_path / "empty"
    directory.mkdir()
    with pytest.raises(ModelSourceError) as refused:
        check_adapter(LoraAdapter(str(directory)))
    assert "no adapter_config.json" in refused.value.problem
    assert ".gguf" not in refused.value.fix
