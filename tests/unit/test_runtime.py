"""Runtime: the IO-bound KV-cache loop, generation against PyTorch, sampling, streaming text."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError, RuntimeBackendError
from edgesdk.runtime.generate import GenerationStats, Sampler, SamplingConfig, generate
from edgesdk.runtime.session import open_runtime
from edgesdk.runtime.text import StreamDecoder


@pytest.fixture(scope="module")
def runtime(tiny_bundle):
    return open_runtime(tiny_bundle.path)


def test_open_runtime_reports_backend_choice(runtime):
    assert runtime.backend.name == "ort-cpu"
    assert any(note == "ort-cpu: used" for note in runtime.notes)


def test_an_onnxruntime_that_cannot_be_imported_is_noted_for_each_backend(runtime, monkeypatch):
    """A GPU wheel for another JetPack fails at import (a CUDA library missing): that ImportError ended
    the chain in a traceback; now each ONNX Runtime backend notes it and the error says what to install."""
    import sys

    from edgesdk.runtime.session import open_backend

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what Python does for a module that cannot load
    with pytest.raises(RuntimeBackendError, match="no backend could run bundle") as info:
        open_backend(runtime.bundle, ["ort-cuda", "ort-cpu"], threads=1)
    assert info.value.problem.count("onnxruntime cannot be imported by Python") == 2
    assert "ort-cuda: onnxruntime cannot be imported" in info.value.problem
    assert "ort-cpu: pip install onnxruntime" in info.value.fix


def test_greedy_generation_matches_pytorch_generate(runtime, tiny_model_dir):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompt = runtime.tokenizer.encode("The quick brown fox")
    ours, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=24), stop_ids=set())
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == ref
    assert stats.new_tokens == 24
    assert stats.stop_reason == "max_new_tokens"
    assert len(stats.token_latencies_s) == 23  # the first token comes from prefill


def test_decode_logits_equal_prefill_logits(runtime):
    ids = runtime.tokenizer.encode("Edge boards run small language models")
    backend = runtime.backend
    backend.reset()
    full = backend.prefill(np.asarray(ids), keep_logits=len(ids))
    backend.reset()
    backend.prefill(np.asarray(ids[:3]))
    stepped = [backend.decode(token) for token in ids[3:]]
    np.testing.assert_allclose(np.stack(stepped), full[3:], atol=1e-4)
    assert backend.position == len(ids)


def test_raw_text_and_chat_turns_both_stop(runtime):
    """The bundle stops at the tokenizer's end of text as well as the chat format's end of turn."""
    vocab = runtime.tokenizer.tokenizer.get_vocab()
    assert runtime.tokenizer.eos_token_ids == {vocab["<|endoftext|>"], vocab["<|im_end|>"]}


def test_stops_at_eos(runtime):
    backend = runtime.backend
    backend.reset()
    first = int(np.argmax(backend.prefill(np.asarray(runtime.tokenizer.encode("hello")))[-1]))
    tokens, stats = generate(backend, runtime.tokenizer.encode("hello"), SamplingConfig(max_new_tokens=10),
                             stop_ids={first})
    assert tokens == []
    assert stats.stop_reason == "eos"


def test_context_limit_is_a_clear_error(runtime):
    backend = runtime.backend
    backend.reset()
    limit = backend.max_context
    with pytest.raises(RuntimeBackendError, match=f"exceeds the bundle's max_context {limit}"):
        backend.prefill(np.zeros(limit + 1, np.int64))


def test_generation_stops_at_the_context_limit_keeping_every_token(runtime):
    backend = runtime.backend
    limit = backend.max_context
    prompt = list(np.random.default_rng(0).integers(5, 200, size=limit - 3))
    tokens, stats = generate(backend, prompt, SamplingConfig(max_new_tokens=50), stop_ids=set())
    assert stats.stop_reason == "max_context"
    assert len(tokens) == 4  # 3 decode steps fill the cache; the prefill's token and theirs are kept
    assert backend.position == limit
    full, stats_full = generate(backend, prompt, SamplingConfig(max_new_tokens=4), stop_ids=set())
    assert full == tokens
    assert stats_full.stop_reason == "max_new_tokens"


def test_prompt_filling_the_context_still_answers_one_token(runtime):
    prompt = [7] * runtime.backend.max_context
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=8), stop_ids=set())
    assert len(tokens) == 1
    assert stats.stop_reason == "max_context"


@pytest.mark.parametrize(("length", "message"), [(0, "encodes to 0 tokens"), (257, "257 tokens; the bundle's max_context is 256")])
def test_empty_or_overlong_prompt_is_refused_before_prefill(runtime, length, message):
    with pytest.raises(EdgeSDKError, match=message):
        generate(runtime.backend, [7] * length, SamplingConfig(), stop_ids=set())


def test_sampler_is_reproducible_and_respects_top_p():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    a = [Sampler(SamplingConfig(temperature=1.0, seed=7))(logits) for _ in range(1)]
    sampler_a, sampler_b = Sampler(SamplingConfig(temperature=1.0, seed=7)), Sampler(SamplingConfig(temperature=1.0, seed=7))
    draws_a = [sampler_a(logits) for _ in range(50)]
    assert draws_a == [sampler_b(logits) for _ in range(50)]
    assert a[0] in range(4)
    nucleus = Sampler(SamplingConfig(temperature=1.0, top_p=0.6, seed=0))
    assert set(nucleus(logits) for _ in range(200)) == {0, 1}  # 0.5 + 0.3 >= 0.6
    assert Sampler(SamplingConfig())(logits) == 0


@pytest.mark.filterwarnings("error")  # numpy's overflow warning would print in the middle of an answer
@pytest.mark.parametrize("temperature", [1e-310, 1e-320])
def test_a_tiny_temperature_samples_the_top_token(temperature):
    """Logits divided by a tiny temperature overflowed to inf, and inf - inf gave NaN probabilities."""
    logits = np.array([1.0, 30.0, -2.0, 29.5], np.float32)
    sampler = Sampler(SamplingConfig(temperature=temperature, seed=0))
    assert [sampler(logits) for _ in range(5)] == [1] * 5


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_logits_that_are_not_finite_are_a_backend_error(temperature, bad):
    """Greedy decoding took the NaN's index (token 0, often end-of-text: an empty answer) and
    sampling failed inside numpy; both now name the logits."""
    logits = np.array([0.5, bad, 2.0], np.float32)
    with pytest.raises(RuntimeBackendError, match="logits that are not finite") as info:
        Sampler(SamplingConfig(temperature=temperature, seed=0))(logits)
    assert "--backend ort-cpu" in info.value.fix


@pytest.mark.parametrize(("field", "value"), [("max_new_tokens", 0), ("temperature", -0.1), ("top_p", -0.1), ("top_p", 1.5)])  # top_p 0 is greedy, as llama.cpp
def test_sampling_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingConfig(**{field: value})


def test_stream_decoder_never_splits_characters(runtime):
    text = "naïve café 東京 🙂 done"
    ids = runtime.tokenizer.encode(text, add_special_tokens=False)
    stream = StreamDecoder(runtime.tokenizer)
    pieces = [stream.push(i) for i in ids]
    assert "".join(pieces) == runtime.tokenizer.decode(ids) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_stream_decoder_flush_hands_out_a_final_replacement_character(runtime):
    ids = runtime.tokenizer.encode("a\ufffdb \ufffd", add_special_tokens=False)
    stream = StreamDecoder(runtime.tokenizer)
    text = "".join(stream.push(i) for i in ids)
    assert text + stream.flush() == runtime.tokenizer.decode(ids)
    assert stream.flush() == ""


def test_chat_template_renders_generation_prompt(runtime):
    rendered = runtime.tokenizer.render_chat([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    raw = runtime.tokenizer.prompt_ids("hi", raw=True)
    chat = runtime.tokenizer.prompt_ids("hi", raw=False, system="be brief")
    assert len(chat) > len(raw)


def test_stats_summary():
    stats = GenerationStats(prompt_tokens=10, new_tokens=3, prefill_s=0.5, decode_s=0.2,
                            token_latencies_s=[0.1, 0.1])
    summary = stats.to_json()
    assert summary["prefill_tok_s"] == 20.0
    assert summary["decode_tok_s"] == 10.0
    assert summary["time_to_first_token_ms"] == 500.0


@pytest.mark.parametrize("answer", ["one token", "end of text first"])
def test_an_answer_without_a_decode_step_has_no_decode_rate(runtime, answer):
    """The prefill's token alone gave 'decode 0.0 tok/s, p95 0.0 ms': a rate no step was timed for."""
    prompt = runtime.tokenizer.encode("hello")
    first, _ = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=1), stop_ids=set())
    stop_ids = set(first) if answer == "end of text first" else set()
    tokens, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=1), stop_ids=stop_ids)
    assert len(tokens) == (1 if answer == "one token" else 0)
    assert stats.token_latencies_s == []
    assert stats.decode_tok_s is None
    assert stats.p95_latency_ms is None
    summary = stats.to_json()
    assert summary["decode_tok_s"] is None
    assert summary["p95_inter_token_ms"] is None
    assert summary["time_to_first_token_ms"] > 0


def test_decode_speed_leaves_out_a_simulated_boards_waits(runtime):
    """A simulated board paces on its own clock: its waits cost no wall time, so they must not be
    taken off the wall time of decoding (that gave negative tok/s)."""

    class SimulatedPacing:
        def begin(self, prompt_tokens, max_new_tokens):
            pass

        def before_step(self, kind):
            return 5.0  # seconds on the simulated clock, none on the wall

        def after_step(self, kind, tokens, compute_s):
            pass

        def end(self, stats):
            pass

    prompt = runtime.tokenizer.encode("The quick brown fox")
    _, stats = generate(runtime.backend, prompt, SamplingConfig(max_new_tokens=8), set(), hook=SimulatedPacing())
    assert stats.waited_s == pytest.approx(5.0 * 8)
    assert 0 < stats.decode_s
    assert stats.decode_tok_s > 0


def test_an_empty_system_prompt_is_a_system_message(runtime):
    """--system "" was dropped, so a template that adds a default system prompt when there is none
    (SmolLM2's) added it; transformers renders an empty system message."""
    tokenizer = runtime.tokenizer
    ids = tokenizer.prompt_ids("hi", raw=False, system="")
    assert tokenizer.tokenizer.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.prompt_ids("hi", raw=False) == tokenizer.prompt_ids("hi", raw=False, system=None)


CHAT_TEMPLATES = {
    # the system text written before the loop, which skips it (a template that left it out altogether takes no
    # system role, and gets it merged into the next message, as llama.cpp does: tests/unit/test_chat_template47.py)
    "loop-controls": "{% if messages[0].role == 'system' %}[{{ messages[0].content }}]{% endif %}"
                     "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                     "<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
    "strftime-now": "Today {{ strftime_now('%Y-%m-%d') }}{% for m in messages %} {{ m.content }}{% endfor %}",
    "tojson": "{{ messages | tojson }}",
    "tools-none": "{% if tools is not none %}[TOOLS]{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "generation-block": "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
}


@pytest.mark.parametrize("name", sorted(CHAT_TEMPLATES))
def test_chat_templates_render_as_transformers_renders_them(tiny_bundle, tmp_path, name):
    """Features transformers gives chat templates (loop controls, strftime_now, its tojson, tools=None,
    the generation block): each crashed or rendered another prompt."""
    from transformers import PreTrainedTokenizerFast

    from edgesdk.runtime.text import ChatTokenizer

    template = tmp_path / "chat_template.jinja"
    template.write_text(CHAT_TEMPLATES[name], encoding="utf-8")
    ours = ChatTokenizer(tiny_bundle.path / "tokenizer.json", {}, template)
    messages = [{"role": "system", "content": "Be <brief> & 'nice' \u00e9"}, {"role": "user", "content": "hi"}]
    hf = PreTrainedTokenizerFast(tokenizer_file=str(tiny_bundle.path / "tokenizer.json"))
    expected = hf.apply_chat_template(messages, chat_template=CHAT_TEMPLATES[name], tokenize=False,
                                      add_generation_prompt=True)
    assert ours.render_chat(messages) == expected


def test_a_chat_template_that_fails_is_a_bundle_error(tiny_bundle, tmp_path):
    from edgesdk.runtime.text import ChatTokenizer

    template = tmp_path / "chat_template.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}", encoding="utf-8")  # no endfor
    with pytest.raises(EdgeSDKError, match="the bundle's chat template failed: TemplateSyntaxError") as info:
        ChatTokenizer(tiny_bundle.path / "tokenizer.json", {}, template).render_chat([{"role": "user", "content": "x"}])
    assert "--raw" in info.value.fix


def test_a_tokenizer_file_this_tokenizers_cannot_parse_is_a_bundle_error(tiny_bundle, tmp_path):
    """An older tokenizers than the one that wrote tokenizer.json fails to parse it with a bare
    Exception ('data did not match any variant ...'); the runtime names the version and the upgrade."""
    import json

    import tokenizers

    from edgesdk.errors import BundleError
    from edgesdk.runtime.text import ChatTokenizer

    document = json.loads((tiny_bundle.path / "tokenizer.json").read_text(encoding="utf-8"))
    document["model"]["type"] = "BPE2"  # a model this tokenizers does not know, as a newer file may hold
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(BundleError, match=f"tokenizers {tokenizers.__version__} could not read {path}") as info:
        ChatTokenizer(path, {}, None)
    assert "pip install -U tokenizers" in info.value.fix


@pytest.mark.parametrize(("content", "reason"), [
    (b"# Bundle report\n\nperplexity 29.2\n", "it does not read as JSON"),
    (b"\xff\xfe not text", "it does not read as JSON"),
    (b'{"version": "1.0", "added_tokens": []}', "its JSON has no 'model' object"),
    (b"[1, 2, 3]", "its JSON has no 'model' object"),
])
def test_a_file_that_is_no_tokenizer_json_is_named_as_such_not_as_an_old_tokenizers(tmp_path, content, reason):
    """A manifest whose tokenizer.file names another file (the report, a config) was blamed on the installed
    tokenizers' version; such a file is now called what it is, and the fix points at the manifest."""
    from edgesdk.errors import BundleError
    from edgesdk.runtime.text import ChatTokenizer

    path = tmp_path / "report.md"
    path.write_bytes(content)
    with pytest.raises(BundleError, match=f"{path} is not a tokenizer.json: {reason}") as info:
        ChatTokenizer(path, {}, None)
    assert "'tokenizer.file'" in info.value.fix
    assert "pip install" not in info.value.fix
