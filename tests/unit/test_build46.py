"""Build checkpoints, resume and recipes: a refused --resume names the part of the build that changed, and a
recipe whose stages cannot follow each other is refused before any stage trains."""

from __future__ import annotations

import pytest

from edgesdk.build.checkpoint import KEY_PARTS, WorkDir
from edgesdk.build.recipes import Recipe
from edgesdk.errors import BuildError


def _key(**changes) -> dict:
    """A build key shaped as the pipeline's (edgesdk/build/pipeline.py build())."""
    key = {"model": {"path": "/m", "files": {"model.safetensors": [10, 1]}}, "target": {"name": "host"},
           "recipe": {"name": "default"}, "export": {"max_context": 64}, "data": None, "edgesdk": "1.0"}
    key.update(changes)
    return {name: value for name, value in key.items() if value is not None or name == "data"}


@pytest.mark.parametrize(("killed", "resumed"), [
    ({"adapters": [{"path": "/a", "files": {}, "scale": 1.0}]}, {}),  # the killed build merged --lora, this one not
    ({}, {"adapters": [{"path": "/a", "files": {}, "scale": 1.0}]}),  # and the other way round
])
def test_a_resume_that_drops_or_adds_the_lora_adapters_names_them_as_what_changed(tmp_path, killed, resumed):
    """The work directory records one digest per part of the build key; a part only the killed build had (its
    --lora adapters) is what changed, and the refusal names it rather than listing every other part as a
    candidate (none of which changed)."""
    work = WorkDir(tmp_path / "b.build", _key(**killed), resume=False)
    work.mark_done("baseline", {"parameters": 1})
    work.release()
    with pytest.raises(BuildError, match="belongs to a different build: ") as refused:
        WorkDir(tmp_path / "b.build", _key(**resumed), resume=True)
    changed = refused.value.problem.split("belongs to a different build: ", 1)[1]
    assert changed == f"{KEY_PARTS['adapters']} changed since it was written"
    assert "drop --resume" in refused.value.fix
    # the work directory is left as it was, unlocked: the same build still resumes from it
    again = WorkDir(tmp_path / "b.build", _key(**killed), resume=True)
    assert again.done("baseline") == {"parameters": 1}
    again.release()


def _recipe(*stages: dict) -> Recipe:
    return Recipe.model_validate({"name": "mixed", "stages": list(stages),
                                  "export": {"form": "ort-fused", "weights": "fp32"}})


def test_sparsify_reorder_after_the_power_stage_is_refused_before_any_stage_runs():
    """sparsify.reorder permutes the hidden channels, which the power adapters read in their own order: the
    sparsify stage refuses a model with power adapters (edgesdk/compress/sparsify.py reorder_channels), but only
    after the power stage has trained (some 15 minutes on SmolLM2-135M). The recipe refuses it up front."""
    power, reorder = {"stage": "power"}, {"stage": "sparsify", "config": {"reorder": True}}
    with pytest.raises(BuildError, match="sparsify.reorder cannot follow the power stage") as refused:
        _recipe(power, reorder).validated()
    assert "--set sparsify.reorder=false" in refused.value.fix
    assert "sparsify before power" in refused.value.fix
    # what the fix offers is taken: no reorder, or sparsify first
    assert [name for name, _ in _recipe(power, {"stage": "sparsify"}).validated()] == ["power", "sparsify"]
    assert [name for name, _ in _recipe(reorder, power).validated()] == ["sparsify", "power"]


@pytest.mark.parametrize("names", [["qat", "smooth", "qat"], ["distill", "qat", "prune", "distill"]])
def test_a_stage_listed_twice_is_named_as_such_not_as_an_order_problem(names):
    """The recipe's problem is the stage listed twice; told instead that the first one "must come after" a stage
    between the two, the user moves that stage and is then told of the duplicate."""
    from edgesdk.build.registry import check_order

    with pytest.raises(BuildError, match=f"stage '{names[0]}' appears twice in the recipe") as refused:
        check_order(names)
    assert refused.value.fix == "list each stage once"


@pytest.mark.parametrize("suffix", [".YAML", ".Yml"])
def test_a_recipe_file_whose_suffix_is_upper_case_is_read_as_one(tmp_path, suffix):
    """``--recipe r.YAML`` was taken for a recipe name (the check was case-sensitive) and refused as a file that
    "does not end in .yaml or .yml", with the fix to rename it r.YAML.yaml."""
    from edgesdk.build.recipes import load_recipe

    path = tmp_path / f"mine{suffix}"
    path.write_text("name: mine\nstages:\n  - stage: qat\n    config: {steps: 3}\n")
    recipe = load_recipe(str(path))
    assert recipe.name == "mine"
    assert recipe.stages[0].config == {"steps": 3}


def test_the_report_states_the_held_out_token_count_as_a_bound_not_as_what_every_build_scored():
    """The per-stage perplexity scores the whole windows of 256 among at most 8,192 held-out tokens; a build whose
    --data-skip-chars slice is shorter scores fewer, and the report said "the first 8,192 tokens" for every one."""
    from edgesdk.build.report import markdown

    rows = [{"stage": "loaded", "parameters": 10, "weight_bytes": 40, "heldout_perplexity": 12.5}]
    text = "\n".join(markdown(rows, None))
    assert "at most the first 8,192 tokens" in text
    assert "whole windows of 256" in text
    assert "a shorter slice is scored up to its last whole window" in text


def _bpe_model_dir(path):
    """A tiny model whose tokenizer is a BPE vocabulary as vocab.json and merges.txt (no tokenizer.json), one of
    the tokenizer forms the loader takes (edgesdk/models/loader.py TOKENIZER_FILES)."""
    import json

    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    model = tiny_llama()
    model.save_pretrained(path, safe_serialization=True)
    bpe = json.loads(tiny_tokenizer(model.config.vocab_size).backend_tokenizer.to_str())["model"]
    (path / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in bpe["merges"]]
    (path / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>", "add_prefix_space": False}))
    return merges


def test_a_resume_after_the_models_merges_txt_changed_is_refused(tmp_path, monkeypatch):
    """merges.txt is part of the model as the loader reads it (another one tokenizes the training text otherwise),
    but the build key fingerprinted only the model directory's .json, weights and .model files: a resumed build
    took the stage checkpoints made with the old tokenizer and bundled them with the new one."""
    pytest.importorskip("torch")
    from edgesdk.build import checkpoint
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.compress.data import DataConfig
    from edgesdk.export.onnx_export import ExportConfig
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    model_dir = tmp_path / "model"
    merges = _bpe_model_dir(model_dir)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\nstages:\n  - stage: qat\n    config: {steps: 0, activations: none, granularity: channel, "
                      "embedding_bits: null}\nexport: {form: standard, weights: int8}\n")

    def run(resume=False):
        return build(BuildConfig(target="host", model=str(model_dir), out=tmp_path / "b", recipe=str(recipe),
                                 data=DataConfig(generated_sequences=0), export=ExportConfig(max_context=64),
                                 resume=resume, progress=False))

    mark_done = checkpoint.WorkDir.mark_done

    def killed_after_qat(self, step, record):
        result = mark_done(self, step, record)
        if step == "stage:qat":
            raise KeyboardInterrupt("killed after the qat stage")
        return result

    monkeypatch.setattr(checkpoint.WorkDir, "mark_done", killed_after_qat)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.undo()

    def tokens():
        loaded = load_model(resolve_model(str(model_dir)), progress=False)
        return loaded.tokenizer("The quick brown fox jumps", add_special_tokens=False)["input_ids"]

    before = tokens()
    (model_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges[: len(merges) // 4]) + "\n")
    assert tokens() != before  # the tokenizer the build would load now is another one
    with pytest.raises(BuildError, match="belongs to a different build: ") as refused:
        run(resume=True)
    assert refused.value.problem.endswith(f"{KEY_PARTS['model']} changed since it was written")
