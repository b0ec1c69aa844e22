"""Training text: teacher continuations end at their first EOS, with no padding between them."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress.data import DataConfig, cut_after_eos, eos_ids, generate_text  # noqa: E402
from tests._utils.tiny import tiny_llama, tiny_tokenizer  # noqa: E402

EOS = 2  # <|im_end|> in the tiny tokenizer and config


def test_cut_keeps_the_prompt_and_the_continuation_up_to_its_first_eos():
    row = torch.tensor([5, EOS, 7, 8, 9, EOS, EOS, EOS])  # an EOS inside the prompt does not count
    assert cut_after_eos(row, 2, {EOS}).tolist() == [5, EOS, 7, 8, 9, EOS]
    assert cut_after_eos(row, 2, {EOS, 8}).tolist() == [5, EOS, 7, 8]
    unfinished = torch.tensor([5, 6, 7, 8])
    assert cut_after_eos(unfinished, 1, {EOS}).tolist() == [5, 6, 7, 8]


def test_teacher_text_holds_no_runs_of_eos_padding():
    """A model that often stops early: batched sampling pads the short continuations with EOS;
    the teacher text keeps one EOS per finished continuation and drops the padding."""
    model, tokenizer = tiny_llama(seed=3), tiny_tokenizer()
    model.lm_head.register_forward_hook(lambda module, args, out: out + 6.0 * (torch.arange(out.shape[-1]) == EOS))
    assert eos_ids(model, tokenizer) == {EOS}
    config = DataConfig(generated_sequences=8, generated_tokens=24, seed=1)
    text = generate_text(model, tokenizer, config, progress=False, batch=8)
    finished = int((text == EOS).sum())
    assert 0 < finished <= config.generated_sequences  # some stopped early, each keeps one EOS
    assert not bool(((text[1:] == EOS) & (text[:-1] == EOS)).any())  # no padding run survived
    longest = config.generated_sequences * (24 + 8)  # prompts are a few tokens; padded length bound
    assert text.numel() < longest


def test_teacher_text_key_covers_every_weight_not_only_the_embedding():
    """A fine-tune that leaves the embedding untouched (a merged LoRA) samples other text: it must not reuse
    the base model's cached teacher text. The key is stable for the same weights."""
    from edgesdk.compress.data import teacher_key

    base, tuned = tiny_llama(seed=0), tiny_llama(seed=0)
    config = DataConfig()
    assert teacher_key(base, config) == teacher_key(tuned, config)
    with torch.no_grad():
        tuned.model.layers[1].mlp.down_proj.weight[3, 5] += 0.01  # one weight of one layer
    assert teacher_key(base, config) != teacher_key(tuned, config)
    with torch.no_grad():
        tuned.model.layers[1].mlp.down_proj.weight[3, 5] -= 0.01
        tuned.model.norm.weight[7] = 1.5  # a norm weight too
    assert teacher_key(base, config) != teacher_key(tuned, config)


def test_teacher_text_key_does_not_depend_on_the_thread_count():
    """Floating-point sums change with torch's thread count; the key hashes bytes, so another machine
    (or OMP_NUM_THREADS) sharing the cache finds the same teacher text."""
    from edgesdk.compress.data import teacher_key

    model = tiny_llama(seed=0, hidden=256, vocab_size=8192)
    threads = torch.get_num_threads()
    try:
        keys = set()
        for count in (1, 2):
            torch.set_num_threads(count)
            keys.add(teacher_key(model, DataConfig()))
    finally:
        torch.set_num_threads(threads)
    assert len(keys) == 1


@pytest.mark.parametrize(("make", "fragment"), [
    (lambda tmp: tmp / "missing.txt", "does not exist"),
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: Path("/dev/null"), "is not a regular file"),
], ids=["missing", "directory", "device"])
def test_a_data_path_that_is_not_a_text_file_says_what_it_is(tmp_path, make, fragment):
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match=fragment) as error:
        DataConfig(files=(str(make(tmp_path)),)).check_files()
    assert "--data" in error.value.fix


def test_no_training_text_at_all_names_both_options():
    from edgesdk.compress.data import TokenData
    from edgesdk.errors import BuildError

    with pytest.raises(BuildError, match="no training text") as error:
        TokenData.load(DataConfig(generated_sequences=0), tiny_tokenizer())
    assert "--data FILE" in error.value.fix
    assert "--generated-sequences N" in error.value.fix
