"""Training and calibration blocks start with BOS where the tokenizer adds one (Gemma, Llama 2 / TinyLlama),
as llama.cpp's imatrix and perplexity tools put it at the start of every chunk
(``tokens[batch_start] = llama_vocab_bos(vocab)`` when the vocab adds BOS) and as the runtime always decodes;
a tokenizer that adds none (SmolLM2's) gets exactly the blocks it got before."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext  # noqa: E402
from edgesdk.compress.data import DataConfig, TokenData  # noqa: E402
from tests._utils.tiny import (  # noqa: E402
    CORPUS,
    tiny_gemma_tokenizer,
    tiny_llama,
    tiny_llama2_tokenizer,
    tiny_tokenizer,
)

TEXT = " ".join(CORPUS * 2)


def drawn_slices(ids: torch.Tensor, count: int, batch_size: int, length: int, seed: int) -> list[torch.Tensor]:
    """The blocks as ``TokenData.batches`` cut them before BOS went first: plain slices at the drawn starts."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - length + 1, (count, batch_size), generator=generator)
    return [torch.stack([ids[s: s + length] for s in row.tolist()]) for row in starts]


def load(tokenizer, tmp_path, files: int = 1) -> TokenData:
    paths = []
    for index in range(files):
        path = tmp_path / f"text{index}.txt"
        path.write_text(TEXT, encoding="utf-8")
        paths.append(str(path))
    return TokenData.load(DataConfig(files=tuple(paths), generated_sequences=0), tokenizer)


@pytest.mark.parametrize("make", [tiny_gemma_tokenizer, tiny_llama2_tokenizer], ids=["gemma", "llama2"])
def test_every_block_starts_with_bos_for_a_tokenizer_that_adds_one(make, tmp_path):
    """The blocks were random slices of the token stream, whose only BOS is at each file's start: none of
    32 blocks began with BOS, so SmoothQuant's peaks, the static scales, the Fisher batches and the teacher KL
    never saw the position-0 BOS the runtime always has."""
    tokenizer = make()
    bos = tokenizer.bos_token_id
    data = load(tokenizer, tmp_path, files=2)
    pool = data.ids.clone()
    blocks = data.batches(8, 4, 32, seed=5, stage="qat")
    expected = drawn_slices(pool, 8, 4, 32, seed=5)
    for block, slices in zip(blocks, expected, strict=True):
        assert block.shape == (4, 32)
        assert (block[:, 0] == bos).all()
        # replaced, not prepended: the starts, the length and every target (position 1 on) are as drawn
        assert torch.equal(block[:, 1:], slices[:, 1:])
    assert torch.equal(data.ids, pool)  # the pool itself keeps its tokens


def test_a_block_at_a_files_own_bos_is_unchanged(tmp_path):
    """The whole pool as one block: it starts with the file's BOS, which stays the only one up front."""
    tokenizer = tiny_llama2_tokenizer()
    data = load(tokenizer, tmp_path)
    assert int(data.ids[0]) == tokenizer.bos_token_id
    (block,) = data.batches(1, 1, data.ids.numel(), seed=0)
    assert torch.equal(block[0], data.ids)


def test_a_one_token_block_keeps_its_token(tmp_path):
    data = load(tiny_gemma_tokenizer(), tmp_path)
    (block,) = data.batches(1, 16, 1, seed=1)
    assert torch.equal(block, drawn_slices(data.ids, 1, 16, 1, seed=1)[0])


@pytest.mark.parametrize("length", [1, 2, 32])
def test_blocks_of_a_tokenizer_without_bos_are_as_before(length, tmp_path):
    """SmolLM2's tokenizer adds no BOS: its blocks (and so every build of it) are byte-for-byte the old ones."""
    data = load(tiny_tokenizer(), tmp_path)
    assert getattr(data, "bos_id", None) is None
    for seed in (0, 1, 2):
        blocks = data.batches(4, 3, length, seed=seed)
        for block, expected in zip(blocks, drawn_slices(data.ids, 4, 3, length, seed), strict=True):
            assert torch.equal(block, expected)
    plain = TokenData(data.ids, 0)  # built by hand, as the benchmarks do: no BOS
    assert all(torch.equal(a, b) for a, b in zip(plain.batches(4, 3, length, seed=7),
                                                 drawn_slices(data.ids, 4, 3, length, seed=7), strict=True))


def test_the_stages_feed_the_models_bos_led_blocks(tmp_path):
    """Through the build's own context: smooth's calibration, QAT's observers, Fisher batches and teacher KL,
    and distillation all run the model (and the teacher) on blocks that start with BOS."""
    from edgesdk.compress.distill import DistillConfig, distill_stage
    from edgesdk.compress.qat import QATConfig, qat_stage
    from edgesdk.compress.smooth import SmoothConfig, smooth_stage

    tokenizer = tiny_llama2_tokenizer()
    bos = tokenizer.bos_token_id
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    teacher = tiny_llama(vocab_size=len(tokenizer))
    model = copy.deepcopy(teacher)
    ctx = BuildContext(profile=None, work_dir=tmp_path, tokenizer=tokenizer, teacher=teacher, progress=False,
                       data_config=DataConfig(files=(str(path),), generated_sequences=0))
    seen: list[torch.Tensor] = []

    def record(_module, args, kwargs):
        ids = args[0] if args else kwargs.get("input")
        seen.append(ids.detach().clone())

    for m in (teacher, model):
        m.model.embed_tokens.register_forward_pre_hook(record, with_kwargs=True)
    model = smooth_stage(model, SmoothConfig(calibration_batches=2, batch_size=2, sequence_length=16), ctx)
    model = qat_stage(model, QATConfig(weight_bits=4, block_size=32, eight_bit_fraction=0.5, fisher_batches=1,
                                       steps=2, batch_size=2, sequence_length=16, grad_accumulation=1), ctx)
    model = distill_stage(model, DistillConfig(steps=1, batch_size=2, sequence_length=16, grad_accumulation=1), ctx)
    assert len(seen) >= 2 + 1 + 2 * 2 + 2  # smooth, Fisher, QAT student + teacher, distill student + teacher
    for ids in seen:
        assert ids.shape[-1] == 16
        assert (ids[:, 0] == bos).all()


def test_the_power_stage_feeds_the_model_bos_led_text(tmp_path):
    """The power stage's calibration rows, its rollout prompts and its sweep's teacher-forced text all start
    with BOS where the tokenizer puts one first: every forward that starts a sequence (no cache, or an empty
    one) reads BOS at position 0. The cost profiler's export traces the model on its own inputs, left out."""
    from edgesdk.power.stage import PowerConfig, power_stage

    tokenizer = tiny_llama2_tokenizer()
    bos = tokenizer.bos_token_id
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    model = tiny_llama(vocab_size=len(tokenizer))
    ctx = BuildContext(profile=None, work_dir=tmp_path, tokenizer=tokenizer, teacher=None, progress=False,
                       data_config=DataConfig(files=(str(path),), generated_sequences=0))
    starts: list[torch.Tensor] = []

    def record(_module, args, kwargs):
        if torch.onnx.is_in_onnx_export() or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return
        ids = args[0] if args else kwargs.get("input_ids")
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        if ids is not None and (cache is None or cache.get_seq_length() == 0):
            starts.append(ids[:, 0].detach().clone())

    model.register_forward_pre_hook(record, with_kwargs=True)
    config = PowerConfig(rounds=1, rollout=2, micro_batch=2, prompt_tokens=8, new_tokens=8, sweep_tokens=12,
                         sweep=((0.5, 0.5, 0.0),), profile_up_to=128, profile_buckets=3, entropy_target=1.5)
    power_stage(model, config, ctx)
    assert len(starts) >= 3  # calibration, a rollout's prompts, the sweep's decode (and training, evaluation)
    for first in starts:
        assert (first == bos).all(), first
