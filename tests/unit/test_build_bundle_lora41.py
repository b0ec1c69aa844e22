"""edgesdk.build_bundle(lora=...): the adapters merge at build time in the order given, with the scales given, as
``edgesdk build --lora`` / ``--lora-scaled`` merge them; forms it cannot take are refused naming ``lora``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import edgesdk
from edgesdk.errors import EdgeSDKError, ModelSourceError
from tests._utils.tiny import save_tiny_model_dir

torch = pytest.importorskip("torch")
IDS = [5, 17, 101, 3, 250, 42, 7, 99]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model directory and two PEFT adapters for it (different ranks, alphas and modules)."""
    from transformers import AutoModelForCausalLM

    from tests.unit._lora_files41 import random_factors, write_peft

    root = tmp_path_factory.mktemp("api-lora")
    model_dir = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    first = write_peft(root / "first", random_factors(base, rank=4, seed=1), {"r": 4, "lora_alpha": 8})
    second = write_peft(root / "second", random_factors(base, ("q_proj", "v_proj"), rank=2, seed=2),
                        {"r": 2, "lora_alpha": 2})
    return root, model_dir, first, second


def test_build_bundle_merges_the_adapters_in_the_order_and_with_the_scales_given(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    from edgesdk.models.lora import LoraAdapter, merge_adapters
    from edgesdk.runtime.session import open_runtime

    _, model_dir, first, second = tiny
    out = edgesdk.build_bundle("host", str(model_dir), out=tmp_path / "b", recipe="fp32-standard", max_context=64,
                               progress=False, lora=[Path(second), (str(first), 0.5)])
    manifest = json.loads((out / "manifest.json").read_text())
    records = manifest["model"]["before"]["adapters"]
    assert [(record["path"], record["scale"], record["rank"]) for record in records] == \
        [(str(second.resolve()), 1.0, 2), (str(first.resolve()), 0.5, 4)]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    merge_adapters(model, [LoraAdapter(str(second)), LoraAdapter(str(first), 0.5)], "llama")
    with torch.no_grad():
        expected = model(torch.tensor([IDS])).logits[0].numpy()
    runtime = open_runtime(out, threads=1)
    logits = runtime.backend.prefill(np.asarray(IDS, np.int64), keep_logits=len(IDS)).reshape(len(IDS), -1)
    assert float(np.abs(logits - expected).max()) < 2e-3


def test_a_mapping_and_a_single_pair_are_taken_in_their_order(tiny, tmp_path):
    from edgesdk.api import _lora_adapters
    from edgesdk.models.lora import LoraAdapter

    _, _, first, second = tiny
    assert _lora_adapters({str(first): 2, second: 0.25}) == (LoraAdapter(str(first), 2.0),
                                                             LoraAdapter(str(second), 0.25))
    assert _lora_adapters((first, -1)) == (LoraAdapter(str(first), -1.0),)
    assert _lora_adapters(str(second)) == (LoraAdapter(str(second), 1.0),)
    assert _lora_adapters([first, [str(second), np.float32(0.5)]]) == (LoraAdapter(str(first), 1.0),
                                                                       LoraAdapter(str(second), 0.5))
    assert _lora_adapters(None) == ()
    assert _lora_adapters([]) == ()


@pytest.mark.parametrize(("lora", "message"), [
    (3, "lora is 3; expected a path (a str or a pathlib.Path) to a PEFT adapter directory or a GGUF LoRA adapter, "
        "a (path, scale) pair"),
    (b"adapter", "lora is b'adapter'; expected a path"),
    ([("{first}",)], "lora[0] is ('{first}',); expected a path or a (path, scale) pair, not 1 items"),
    ([("{first}", "0.5")], "lora[0][1] is '0.5'; expected a finite number"),
    (("{first}", "0.5"), "lora[1] is '0.5'; expected a finite number"),  # one pair, its scale given as text
    ({"{first}": math.nan}, "lora['{first}'] is nan; expected a finite number"),
    ([("{first}", True)], "lora[0][1] is True; expected a finite number"),
    (["{first}", ""], "lora[1] is ''; expected a path (a non-empty str or a pathlib.Path)"),
    ([None], "lora[0] is None; expected a path"),
    ({3: 1.0}, "lora key 3 is 3; expected a path"),
])
def test_a_form_build_bundle_cannot_take_is_refused_naming_lora_before_anything_is_built(tiny, tmp_path, lora,
                                                                                        message):
    _, model_dir, first, _ = tiny

    def filled(value):
        if isinstance(value, str):
            return value.format(first=first)
        if isinstance(value, (list, tuple)):
            return type(value)(filled(item) for item in value)
        if isinstance(value, dict):
            return {filled(key): item for key, item in value.items()}
        return value

    with pytest.raises(EdgeSDKError) as caught:
        edgesdk.build_bundle("host", str(model_dir), out=tmp_path / "b", progress=False, lora=filled(lora))
    assert caught.value.problem.startswith("build_bundle(): ")
    assert message.format(first=first) in caught.value.problem
    assert "pass lora as" in caught.value.fix or "pass e.g. lora=" in caught.value.fix
    assert not (tmp_path / "b").exists()
    assert not (tmp_path / "b.build").exists()


def test_an_adapter_path_refused_by_the_adapter_checks_is_named_as_lora(tiny, tmp_path):
    _, model_dir, _, _ = tiny
    with pytest.raises(ModelSourceError, match=r"^build_bundle\(\): lora '.*nosuch': no such file or directory"):
        edgesdk.build_bundle("host", str(model_dir), out=tmp_path / "b", progress=False, lora=tmp_path / "nosuch")
    with pytest.raises(ModelSourceError) as caught:
        edgesdk.build_bundle("host", str(model_dir), out=tmp_path / "b", progress=False, lora=[(model_dir, 0.5)])
    assert caught.value.problem.startswith(f"build_bundle(): lora '{model_dir}': {model_dir} is a whole model")
    assert caught.value.fix.startswith("pass it as model, or pass the adapter directory (with adapter_config.json) "
                                       "in lora")
    assert not (tmp_path / "b.build").exists()
