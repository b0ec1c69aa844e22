"""A model's declared sampling settings and pooling (edgesdk/models/generation_defaults.py, edgesdk/models/pooling.py)
on inputs at the edges: integers past any float in generation_config.json, a sentence-transformers ``pooling_mode``
in capitals, a ``sequence`` naming no sampler."""

from __future__ import annotations

import json

import pytest

from edgesdk.models.generation_defaults import (
    applied_line,
    describe,
    from_generation_config,
    read_model_sampling,
    sampling_value_problem,
)
from edgesdk.models.pooling import declared_pooling

HUGE = 10 ** 400  # a JSON integer literal Python reads exactly; no float (nor float32) holds it


@pytest.mark.parametrize(("key", "field"), [("temperature", "temperature"), ("repetition_penalty", "repeat_penalty"),
                                            ("penalty_repeat", "repeat_penalty")])
def test_an_integer_past_any_float_is_a_warning_not_a_crash(key, field, tmp_path):
    """math.isfinite raised OverflowError on it, naming no field, and the build stopped there."""
    (tmp_path / "generation_config.json").write_text(
        json.dumps({key: HUGE, "top_k": 20}), encoding="utf-8")
    sampling = read_model_sampling("hf-dir", tmp_path)
    assert sampling.values == {"top_k": 20}
    (warning,) = sampling.warnings
    assert warning.startswith(f"generation_config.json {key} 1000")
    assert f"{field} must be at most 3.40282e+38 (a float32, as a GGUF file holds it)" in warning
    assert len(warning) < 400  # the 401 digits are cut, not written out twice


def test_a_manifest_value_past_any_float_is_named_by_its_field():
    """bundle.py checks a manifest's generation section with the same function."""
    problem = sampling_value_problem("temperature", HUGE)
    assert problem.startswith("temperature must be at most 3.40282e+38")
    assert sampling_value_problem("temperature", 0.7) is None


def _sentence_transformers_dir(root, config: dict):
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **config}))
    return root


@pytest.mark.parametrize(("mode", "pooling"), [("LastToken", "last"), ("CLS", "cls"), ("Mean", "mean"),
                                               (["LASTTOKEN"], "last")])
def test_a_pooling_mode_in_any_case_is_that_mode(mode, pooling, tmp_path):
    """sentence-transformers' Pooling lowercases pooling_mode before matching it; refused, the model's last-token
    or CLS embeddings were pooled with the runtime's default, mean."""
    path = _sentence_transformers_dir(tmp_path, {"pooling_mode": mode})
    assert declared_pooling("hf-dir", path) == (pooling, None)


def test_a_pooling_mode_sentence_transformers_has_not_is_still_named(tmp_path):
    pooling, why = declared_pooling("hf-dir", _sentence_transformers_dir(tmp_path, {"pooling_mode": "WeightedMean"}))
    assert pooling is None
    assert why == ('its sentence-transformers Pooling sets pooling_mode "WeightedMean", which edgesdk\'s embeddings '
                   "do not compute")


def test_a_sequence_naming_no_sampler_is_shown_as_an_empty_chain():
    """llama.cpp skips each unknown name and runs the chain left, here none; the line said "samplers " and nothing."""
    sampling = from_generation_config({"sequence": "nucleus_x;tempp", "top_k": 20})
    assert sampling.values == {"top_k": 20, "samplers": []}
    assert describe(sampling.values) == "top_k 20, samplers (none)"
    assert applied_line(sampling.values, sampling.source, 0.8) == (
        "sampling: top_k 20, samplers (none) from the model's generation_config.json; --temperature 0 for greedy")
    assert describe({"samplers": ["top_k", "temperature"]}) == "samplers top_k;temperature"


@pytest.mark.parametrize(("text", "why"), [
    ('[{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"', "is not JSON text ("),
    (b"\xff\xfe[]", "is not JSON text ("),
    ('{"0": "sentence_transformers.models.Pooling"}',
     'holds {"0": "sentence_transformers.models.Pooling"}, not a JSON list of the model\'s modules'),
], ids=["truncated", "utf-16", "an-object"])
def test_a_modules_json_that_cannot_be_read_is_named(text, why, tmp_path):
    """It read as a model that declares no pooling, with no note, so a last-token model (Qwen3-Embedding) whose
    modules.json was cut short embedded with mean pooling and the build said nothing."""
    file = tmp_path / "modules.json"
    file.write_bytes(text) if isinstance(text, bytes) else file.write_text(text)
    pooling, note = declared_pooling("hf-dir", tmp_path)
    assert pooling is None
    assert note.startswith("its modules.json ")
    assert why in note


def test_a_directory_without_modules_json_declares_nothing(tmp_path):
    assert declared_pooling("hf-dir", tmp_path) == (None, None)
