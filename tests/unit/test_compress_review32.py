"""Compression stages, review 32: teacher text sampled with its own settings whatever the model's
generation config asks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.data import DataConfig, generate_text  # noqa: E402
from tests._utils.tiny import tiny_llama, tiny_tokenizer  # noqa: E402


def flat_teacher():
    """A tiny teacher whose next-token distributions are spread out, so sampling settings show in its text."""
    model = tiny_llama(seed=0)
    with torch.no_grad():
        model.model.embed_tokens.weight.div_(8.0)
    return model


def test_teacher_text_ignores_the_sampling_settings_of_the_models_generation_config():
    """transformers fills every generation setting a call leaves out from the model's generation config, so
    Qwen3's top_k 20 (Gemma 3's 64, any repetition penalty) shaped the teacher text, which the docstring gives
    as temperature 1 and top-p 0.95, and the cache (keyed by config and weights) took either text for the other.
    Here top_k 1 made every continuation the greedy one."""
    tokenizer = tiny_tokenizer()
    config = DataConfig(generated_sequences=8, generated_tokens=12, seed=0)
    expected = generate_text(flat_teacher(), tokenizer, config, progress=False)
    teacher = flat_teacher()
    teacher.generation_config.do_sample = True
    teacher.generation_config.top_k = 1
    teacher.generation_config.repetition_penalty = 1.5
    assert torch.equal(generate_text(teacher, tokenizer, config, progress=False), expected)
    assert teacher.generation_config.top_k == 1  # the model's own config is given back
    assert teacher.generation_config.repetition_penalty == 1.5


def test_teacher_text_that_cannot_be_cached_is_a_warning_and_the_build_goes_on(tmp_path, monkeypatch, capsys):
    """The cache only saves time, but a cache directory that could not be made (here a file stands where it
    goes; a read-only home or a full disk do the same) ended the stage with a traceback after the minutes
    of sampling, and a resumed build sampled and failed again."""
    from edgesdk.compress.data import TokenData

    (tmp_path / "blocker").write_text("a file, not a directory")
    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "blocker" / "cache"))
    tokenizer, config = tiny_tokenizer(), DataConfig(generated_sequences=2, generated_tokens=4, seed=1)
    data = TokenData.load(config, tokenizer, flat_teacher())
    assert torch.equal(data.ids, generate_text(flat_teacher(), tokenizer, config, progress=False))
    warning = capsys.readouterr().err
    assert "could not be kept in the cache" in warning
    assert "EDGESDK_CACHE" in warning  # the fix


@pytest.mark.parametrize("damage", [b"", b"not a tensor file", "truncated", "wrong tensor"])
def test_a_damaged_cached_teacher_text_is_sampled_again(tmp_path, monkeypatch, capsys, damage):
    """A cached file cut short or overwritten was handed to torch.load unchecked: a traceback (EOFError,
    RuntimeError, KeyError ...) at every build of that model until the user found and deleted the file."""
    from edgesdk.compress.data import TokenData, teacher_key
    from edgesdk.models.sources import cache_dir

    monkeypatch.setenv("EDGESDK_CACHE", str(tmp_path / "cache"))
    tokenizer, config, teacher = tiny_tokenizer(), DataConfig(generated_sequences=2, generated_tokens=4), flat_teacher()
    expected = TokenData.load(config, tokenizer, teacher).ids  # sampled and cached
    path = cache_dir() / "teacher-text" / f"{teacher_key(teacher, config, tokenizer)}.pt"
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "wrong tensor":
        torch.save(torch.zeros(3, 4), path)
    else:
        path.write_bytes(damage)
    assert torch.equal(TokenData.load(config, tokenizer, teacher).ids, expected)
    assert "is damaged" in capsys.readouterr().err
    assert torch.equal(torch.load(path), expected)  # the cache holds the text again


@pytest.mark.parametrize(("options", "match"), [
    ({"sequence_length": 1}, "sequence_length must be >= 2, got 1"),
    ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ({"steps": -3}, "steps must be >= 0, got -3"),
])
def test_a_bad_qat_count_is_refused_naming_the_option_and_its_value(options, match):
    """QAT said 'steps >= 0, batch_size >= 1 and sequence_length >= 2 are required' for any of the three, leaving
    the user to find which one of a recipe's settings was wrong (distill and prune name theirs)."""
    from edgesdk.build.registry import make_config
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match=match):
        make_config("qat", options)


@pytest.mark.parametrize("stage", ["smooth", "qat", "prune"])
def test_training_text_shorter_than_a_block_names_the_stage_setting_to_change(tmp_path, stage):
    """The refusal said 'a shorter sequence_length' without the stage whose setting it was (every stage has
    one, 256 by default) or how to give it."""
    import copy

    from edgesdk.build.registry import BuildContext, make_config, stage_spec
    from edgesdk.errors import BuildError
    from edgesdk.profile import get_profile

    text = tmp_path / "short.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.")
    tokenizer = tiny_tokenizer()
    tokens = len(tokenizer(text.read_text())["input_ids"])
    teacher = tiny_llama(seed=0)
    ctx = BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tokenizer, teacher=teacher,
                       progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))
    options = {"sequence_length": 64, **({"steps": 1} if stage == "qat" else {}),
               **({"ffn_ratio": 0.25} if stage == "prune" else {})}
    refusal = rf"{tokens} tokens, fewer than one block of 64 \({stage}.sequence_length\)"
    with pytest.raises(BuildError, match=refusal) as error:
        stage_spec(stage).run(copy.deepcopy(teacher), make_config(stage, options), ctx)
    assert f"--set {stage}.sequence_length={tokens}" in error.value.fix
