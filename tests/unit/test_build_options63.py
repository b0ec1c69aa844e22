"""Build (review 63): a recipe whose stages read training text, given none, is refused before the model loads; a
--resume with other stage settings names what changed and the training in flight it discards; --generated-sequences
on a recipe without training stages is warned of as unused; --max-context 0 is the model's own context."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.pipeline import BuildConfig, build  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.export.onnx_export import ExportConfig  # noqa: E402
from tests._utils.tiny import save_tiny_model_dir  # noqa: E402

RECIPE = ("name: r\nstages:\n  - stage: qat\n    config: {steps: 0, activations: none, granularity: channel, "
          "embedding_bits: null}\nexport: {form: standard, weights: int8}\n")


def test_no_training_text_is_refused_before_the_model_loads(tmp_path, capsys):
    """int8-qdq's stages (smooth, qat) read training text: with no data and no teacher text the build stopped only
    after loading the model and measuring its baseline; it is refused before, naming the stages, with no work
    directory left."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")  # loading this would fail: the refusal comes first
    for terms, fix in (("cli", "pass --data FILE (plain text), or --generated-sequences N with N > 0"),
                       ("python", "pass data='FILE' (plain text), or generated_sequences=N with N > 0")):
        with pytest.raises(BuildError) as error:
            build(BuildConfig(target="host", model=str(model), out=tmp_path / terms, recipe="int8-qdq",
                              data=DataConfig(generated_sequences=0), progress=False, terms=terms))
        data, generated = ("--data", "--generated-sequences 0") if terms == "cli" else \
            ("data", "generated_sequences=0")
        assert error.value.problem == (f"the compression stages have no training text: recipe 'int8-qdq' has stages "
                                       f"that read it (smooth, qat), and there is no {data} and {generated}")
        assert error.value.fix.startswith(fix)
        assert not (tmp_path / f"{terms}.build").exists()
    assert "loading" not in capsys.readouterr().err


def test_a_recipe_whose_stages_read_no_text_builds_without_any(tmp_path):
    """QAT without steps or static scales reads no text: no data and no teacher text is no refusal."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    bundle = build(BuildConfig(target="host", model=str(save_tiny_model_dir(tmp_path / "model")),
                               out=tmp_path / "b", recipe=str(recipe), data=DataConfig(generated_sequences=0),
                               export=ExportConfig(max_context=32), progress=False))
    assert bundle.manifest["graph"]["max_context"] == 32


def test_a_resume_with_other_stage_settings_names_them_and_the_training_discarded(tmp_path, capsys):
    """A --resume with another qat.seed said only that "the settings of the qat stage" changed, and trained the
    stage from its first batch, its training in flight gone without a word. The setting, its two values and the
    training discarded are named."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    model = save_tiny_model_dir(tmp_path / "model")

    def run(**changes):
        return build(BuildConfig(target="host", model=str(model), out=tmp_path / "b", recipe=str(recipe),
                                 data=DataConfig(generated_sequences=0), export=ExportConfig(max_context=32),
                                 keep_work=True, progress=False, **changes))

    run()
    work = tmp_path / "b.build"
    state = json.loads((work / "state.json").read_text(encoding="utf-8"))
    del state["done"]["stage:qat"], state["done"]["export"]  # a build stopped while qat trained
    (work / "state.json").write_text(json.dumps(state), encoding="utf-8")
    kept = work / "stages" / "00-qat.training.pt"
    torch.save({"batch": 20, "total": 48, "unit": "batch"}, kept)
    capsys.readouterr()
    run(resume=True, overrides=("qat.seed=1",))
    err = capsys.readouterr().err
    assert "the steps that depend on what changed are made again, the others taken (qat.seed: 0 then, 1 now); " \
           "qat's training at batch 20 of 48 is discarded: it was made under the earlier settings" in err, err
    assert not kept.exists()


def test_generated_sequences_unused_by_a_recipe_without_training_stages_is_warned_of(tmp_path, capsys):
    """host's default recipe (fp32-fused) has no training stages: --data was warned of as unused,
    --generated-sequences 5 ignored without a word."""
    model = save_tiny_model_dir(tmp_path / "model")
    build(BuildConfig(target="host", model=str(model), out=tmp_path / "b", data=DataConfig(generated_sequences=5),
                      export=ExportConfig(max_context=32), progress=False))
    err = capsys.readouterr().err
    assert "warning: --generated-sequences 5 is not used: recipe 'fp32-fused' has no training stages (pass a " \
           "recipe with stages, e.g. --recipe default, to train on teacher-generated text)" in err, err
    build(BuildConfig(target="host", model=str(model), out=tmp_path / "c", export=ExportConfig(max_context=32),
                      progress=False))  # the default: nothing to warn of
    assert "is not used" not in capsys.readouterr().err


def test_max_context_0_is_the_models_own_context(tmp_path, capsys):
    """--max-context 0 was refused as shorter than 16 tokens, where edgesdk run and eval's -c 0 (as llama.cpp's)
    is the model's own context: it is the model's max_position_embeddings, with a note."""
    model = save_tiny_model_dir(tmp_path / "model", max_positions=48)
    for terms, said in (("cli", "--max-context 0"), ("python", "max_context=0")):
        bundle = build(BuildConfig(target="host", model=str(model), out=tmp_path / terms,
                                   export=ExportConfig(max_context=0), progress=False, terms=terms))
        assert bundle.manifest["graph"]["max_context"] == 48
        assert f"{said}: the bundle's context is 48 tokens, the model's max_position_embeddings" in \
            capsys.readouterr().err
    with pytest.raises(BuildError) as error:
        build(BuildConfig(target="host", model=str(model), out=tmp_path / "d", export=ExportConfig(max_context=8),
                          progress=False))
    assert error.value.fix == ("pass --max-context 16 or more (the default is 4096), or --max-context 0 for the "
                               "model's own context (its max_position_embeddings)")
