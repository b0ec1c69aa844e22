"""Speculative decoding with a draft bundle (edgesdk/runtime/speculative.py, generate()'s drafts, run's --draft)
against decoding without one, on real ONNX Runtime sessions of tiny bundles: the answers, what the step hook is
told, the draft model's cache and the CLI's checks."""

from __future__ import annotations

import re

import pytest

from edgesdk.runtime.generate import SamplingConfig, generate
from edgesdk.runtime.speculative import DraftConfig, DraftModel

PROMPT = [5, 17, 120, 33, 250, 9, 64, 199]


class DraftWatchingHook:
    """A StepHook that notes, at each call, how far the draft model has got (its drafted count and cache)."""

    def __init__(self, model: DraftModel):
        self.model, self.calls = model, []

    def _note(self, *call):
        self.calls.append((*call, self.model.drafted, list(self.model.cached)))

    def begin(self, prompt_tokens, max_new_tokens):
        self._note("begin")

    def before_step(self, kind):
        self._note("before", kind)
        return 0.0

    def after_step(self, kind, tokens, compute_s):
        self._note("after", kind, tokens, compute_s)

    def end(self, stats):
        self._note("end")


def test_a_draft_model_s_work_is_inside_the_step_the_hook_is_told_of(target, same_model):
    """The draft model decoded its draft before the hook's before_step: the thermal guard paced and paused only the
    checking pass, and the compute seconds it (and a simulated board's heat) was told left the draft's decodes
    out. Each draft is made between the step's before_step and after_step now."""
    model = DraftModel(same_model.backend, DraftConfig(max_draft=3, p_min=0.0), target.backend.vocab_size)
    hook = DraftWatchingHook(model)
    answer, stats = generate(target.backend, PROMPT, SamplingConfig(max_new_tokens=24), stop_ids=set(), hook=hook,
                             lookup=model)
    assert answer == generate(target.backend, PROMPT, SamplingConfig(max_new_tokens=24), stop_ids=set())[0]
    assert stats.draft_tokens > 0
    steps = [call for call in hook.calls if call[0] in ("before", "after")]
    assert [call[0] for call in steps] == ["before", "after"] * (len(steps) // 2)
    drafted_in_steps = 0
    for before, after in zip(steps[::2], steps[1::2], strict=True):
        drafted_in_steps += after[-2] - before[-2]
    for after, before in zip(steps[1::2], steps[2::2], strict=False):
        assert before[-2:] == after[-2:], "the draft model ran between one step's after_step and the next before_step"
    assert drafted_in_steps == stats.draft_tokens


def _copy_with_runtime(bundle, out, runtime: dict):
    """A copy of ``bundle`` whose manifest asks for other backends (the manifest's digest rewritten to match)."""
    import hashlib
    import json
    import shutil

    from edgesdk.bundle import read_manifest

    shutil.copytree(bundle, out)
    manifest = read_manifest(out)
    manifest["runtime"].update(runtime)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    (out / "manifest.json").write_text(text, encoding="utf-8")
    (out / "manifest.sha256").write_text(hashlib.sha256(text.encode()).hexdigest() + "\n")
    return out


def test_the_draft_runs_on_the_bundle_s_backend_not_its_own_first_one(tiny_bundle, tmp_path):
    """A Jetson draft bundle's first backend is tensorrt, which cannot rewind: with the bundle run on another
    backend (--backend ort-cuda), the draft was opened on tensorrt all the same and refused, and no option picks
    its backend. It runs on the bundle's backend; here a draft bundle whose only backend this host lacks runs on
    the bundle's ort-cpu."""
    from tests.unit.test_cli import assert_ok, invoke

    draft = _copy_with_runtime(tiny_bundle.path, tmp_path / "draft", {"backend": "tensorrt", "fallbacks": []})
    args = ("run", tiny_bundle.path, "--prompt", "The quick brown fox", "--raw", "-n", 16, "--ignore-eos",
            "--threads", 1, "--stats")
    plain = invoke(*args)
    drafted = invoke(*args, "--draft", draft, "--draft-max", 3)
    assert_ok(plain)
    assert_ok(drafted)
    assert drafted.stdout == plain.stdout
    assert re.search(r"drafts [1-9]\d*/\d+ taken", drafted.stderr), drafted.stderr


@pytest.mark.parametrize("command", ["run", "serve"])
def test_draft_settings_without_a_draft_bundle_are_named_as_unused(tiny_bundle, command):
    """--draft-max and --draft-p-min without --draft did nothing without a word, where run names every other
    option that does nothing in its setting (--top-p without a temperature, --ambient without --simulate-thermal)."""
    from tests.unit.test_cli import assert_ok, invoke

    if command == "run":
        result = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--threads", 1, "--draft-max", 4,
                        "--draft-p-min", 0.5)
        assert_ok(result)
    else:  # stopped at once by an address it cannot listen on, after the draft options are looked at
        result = invoke("serve", tiny_bundle.path, "--threads", 1, "--draft-max", 4, "--draft-p-min", 0.5,
                        "--port", 1, "--host", "256.0.0.1")
    assert "--draft-max is not used: it works with --draft BUNDLE" in result.stderr
    assert "--draft-p-min is not used: it works with --draft BUNDLE" in result.stderr
    quiet = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--threads", 1)
    assert "is not used" not in quiet.stderr


def test_a_draft_bundle_with_another_tokenizer_is_refused_with_what_to_pass(tiny_bundle, tmp_path):
    """The refusal named the two tokenizers but not what to do."""
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir
    from tests.unit.test_cli import invoke

    # another vocabulary (Gemma's pieces), which llama.cpp's common_speculative_are_compatible refuses too
    model_dir = save_tiny_model_dir(tmp_path / "model", tokenizer="gemma", vocab_size=384, hidden=64, heads=4,
                                    kv_heads=2)
    other = build_tiny_bundle(tmp_path, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                              model_dir=model_dir)
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--threads", 1, "--draft", other.path)
    assert result.exit_code == 2, result.stderr
    message = " ".join(result.stderr.split())
    assert "has another tokenizer than the bundle (384 tokens against 320" in message
    assert "pass a draft bundle built from a model with this bundle's tokenizer" in message


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """Another random model with the tiny bundle's tokenizer, in a bundle that holds 64 tokens (the target 256)."""
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("short")
    model_dir = save_tiny_model_dir(root / "model", seed=7, hidden=64, heads=4, kv_heads=2)
    bundle = build_tiny_bundle(root, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=model_dir)
    return open_runtime(bundle.path, threads=1)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(max_new_tokens=60, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
    SamplingConfig(max_new_tokens=60, temperature=0.9, top_k=20, seed=3, logit_bias=((5, 5.0), (17, -100.0))),
], ids=["penalties", "sampled-biased"])
@pytest.mark.parametrize("prompt_length", [8, 60, 250], ids=["short", "past-the-draft-s-context", "near-full"])
@pytest.mark.parametrize("drafts_from", ["same_model", "short_model"])
def test_the_answer_is_the_target_s_own_to_a_full_context(target, drafts_from, sampling, prompt_length, request):
    """Penalties and a logit bias the draft model knows nothing of, a text that outgrows the draft's context (64
    tokens) and one that fills the target's (256): the answer and why it stopped are the target's own."""
    draft = request.getfixturevalue(drafts_from)
    prompt = [3 + (7 * index * index + 11 * index) % 317 for index in range(prompt_length)]
    plain, plain_stats = generate(target.backend, prompt, sampling, stop_ids={2})
    model = DraftModel(draft.backend, DraftConfig(max_draft=6, p_min=0.0), target.backend.vocab_size)
    drafted, stats = generate(target.backend, prompt, sampling, stop_ids={2}, lookup=model)
    assert drafted == plain
    assert stats.stop_reason == plain_stats.stop_reason
    assert target.backend.position <= target.backend.max_context
    assert draft.backend.position <= draft.backend.max_context


def test_an_answer_stopped_mid_draft_leaves_both_caches_to_the_next(target, same_model):
    """Ctrl-C (or a client gone) while drafted tokens wait in the target's cache: they leave it, the prompt cache
    and the draft model's bookkeeping stay true, and the next answer is the target's own."""
    from edgesdk.runtime.prompt_cache import PromptCache

    cache = PromptCache(target.backend)
    model = DraftModel(same_model.backend, DraftConfig(max_draft=4, p_min=0.0), target.backend.vocab_size)
    seen = []

    def stop_at_seventh(token):
        seen.append(token)
        if len(seen) == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        generate(target.backend, PROMPT, SamplingConfig(max_new_tokens=40), stop_ids=set(), cache=cache, lookup=model,
                 on_token=stop_at_seventh)
    assert target.backend.position == len(PROMPT) + 6  # the seventh token was never fed
    assert len(model.cached) == same_model.backend.position
    following = PROMPT + seen + [7, 8]
    answer, stats = generate(target.backend, following, SamplingConfig(max_new_tokens=12), stop_ids=set(),
                             cache=cache, lookup=model)
    assert stats.cached_tokens == len(PROMPT) + 6
    assert answer == generate(target.backend, following, SamplingConfig(max_new_tokens=12), stop_ids=set())[0]


def test_a_draft_model_with_a_longer_context_never_pushes_the_bundle_past_its_own(target, short_model):
    """The draft bundle holds 256 tokens, the bundle 64: drafts near the end of the bundle's context are cut to
    what its cache holds, and the answer stops at max_context as without drafts."""
    prompt = [3 + (7 * index * index + 11 * index) % 317 for index in range(50)]
    sampling = SamplingConfig(max_new_tokens=40)
    plain, plain_stats = generate(short_model.backend, prompt, sampling, stop_ids=set())
    model = DraftModel(target.backend, DraftConfig(max_draft=8, p_min=0.0), short_model.backend.vocab_size)
    drafted, stats = generate(short_model.backend, prompt, sampling, stop_ids=set(), lookup=model)
    assert drafted == plain
    assert stats.stop_reason == plain_stats.stop_reason == "max_context"
    assert stats.draft_tokens > 0


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A bundle whose model has 400 embedding rows over the tiny tokenizer's 320 tokens (a vocabulary padded wider,
    as some families pad their larger models' and not their smaller ones')."""
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import tiny_llama, tiny_tokenizer

    root = tmp_path_factory.mktemp("wide")
    tiny_llama(seed=3, vocab_size=400).save_pretrained(root / "model", safe_serialization=True)
    tiny_tokenizer(320).save_pretrained(root / "model")
    bundle = build_tiny_bundle(root, "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n", "host",
                               model_dir=root / "model")
    return open_runtime(bundle.path, threads=1)


@pytest.mark.parametrize(("prompt", "bias"), [
    (PROMPT, ((350, 100.0),)),  # the bundle takes an id past the draft's rows as it answers
    ([*PROMPT, 350], ()),  # the prompt holds one
])
def test_a_text_with_an_id_past_the_draft_model_s_rows_is_not_drafted_for(wide_model, target, prompt, bias):
    """The bundle's 400 rows against the draft's 320: an id past 319 in the text failed the draft model's prefill
    (ONNX Runtime's Gather: 'indices element out of data bounds'), and with it the answer, which the bundle alone
    gives. The draft model does not draft for a text it cannot read; the answer is the bundle's own."""
    sampling = SamplingConfig(max_new_tokens=12, logit_bias=bias)
    plain, _ = generate(wide_model.backend, prompt, sampling, stop_ids=set())
    assert max(plain + prompt) >= 320
    model = DraftModel(target.backend, DraftConfig(max_draft=4, p_min=0.0), wide_model.backend.vocab_size)
    drafted, stats = generate(wide_model.backend, prompt, sampling, stop_ids=set(), lookup=model)
    assert drafted == plain
    assert generate(wide_model.backend, PROMPT, SamplingConfig(max_new_tokens=12), stop_ids=set(),
                    lookup=model)[1].draft_tokens > 0  # a text it can read is drafted for again
