"""edgesdk from Python (edgesdk/api.py): a loaded bundle answers as `edgesdk serve` answers over HTTP.

Every answer here is compared with the one a real server over the same bundle sends for the same request, so the
in-process API cannot drift from the HTTP API; ids, creation times and timings are the only fields left out."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

import edgesdk
from edgesdk.api import RequestError
from edgesdk.errors import BundleError
from tests._utils.chat_stream import accumulated_message
from tests.unit.test_lean_import import BLOCKER

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CHAT = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=16) as loaded:
        yield loaded


@pytest.fixture(scope="module")
def http(tiny_bundle):
    """A real server over the same bundle, with the same default answer length."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(open_runtime(tiny_bundle.path, threads=1), ServeDefaults(max_tokens=16))
    yield server
    server.close()


def comparable(body: dict) -> dict:
    """An answer without what differs between two answers of one request (its ids, time and timings)."""
    kept = {key: value for key, value in body.items() if key not in ("id", "created", "timings", "model")}
    for choice in kept.get("choices", []):
        for call in choice.get("message", {}).get("tool_calls") or []:
            call["id"] = "call"
    return kept


def test_chat_answer_equals_the_servers(model, http):
    for fields in ({}, {"max_tokens": 5, "logprobs": True, "top_logprobs": 2}, {"stop": ["e"]},
                   {"temperature": 0.9, "seed": 7}, {"response_format": {"type": "json_object"}, "max_tokens": 12}):
        answer = model.create_chat_completion(CHAT, **fields)
        status, served = http.post("/v1/chat/completions", {"messages": CHAT, **fields})
        assert status == 200
        assert comparable(answer) == comparable(served), fields
        assert answer["model"] == "tiny-llama-host"  # <model>-<target>, as `edgesdk serve` names it by default
        assert set(answer["timings"]) == set(served["timings"])


def test_text_completion_equals_the_servers_and_call_is_create_completion(model, http):
    ids = model.tokenize("The sea", add_special=False)
    for prompt, fields in (("The sea", {"max_tokens": 6}), (ids, {"max_tokens": 4, "logprobs": 2, "echo": True})):
        answer = model(prompt, **fields)
        status, served = http.post("/v1/completions", {"prompt": prompt, **fields})
        assert status == 200
        assert comparable(answer) == comparable(served)
        assert answer["object"] == "text_completion"


def test_streamed_chat_equals_the_whole_answer_and_the_servers_stream(model, http):
    fields = {"max_tokens": 12, "stream_options": {"include_usage": True}}
    chunks = list(model.create_chat_completion(CHAT, stream=True, **fields))
    served = http.stream("/v1/chat/completions", {"messages": CHAT, **fields})[:-1]
    assert [comparable(chunk) for chunk in chunks] == [comparable(chunk) for chunk in served]
    assert len({chunk["id"] for chunk in chunks}) == 1
    whole = model.create_chat_completion(CHAT, max_tokens=12)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks if chunk["choices"]]
    assert accumulated_message(deltas)["content"] == whole["choices"][0]["message"]["content"]
    usage = {key: value for key, value in chunks[-1]["usage"].items() if key != "prompt_tokens_details"}
    assert usage == {key: value for key, value in whole["usage"].items() if key != "prompt_tokens_details"}
    assert whole["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the stream's prompt stayed in the cache
    assert "timings" in chunks[-1]


def test_a_stream_left_early_stops_its_answer_and_the_model_answers_again(model):
    metrics = model._completer.metrics
    generated, cancelled = metrics.predicted_tokens, metrics.finished["cancelled"]
    chunks = model.create_chat_completion(CHAT, stream=True, max_tokens=200, ignore_eos=True)
    first = next(chunks)
    assert first["choices"][0]["delta"]["role"] == "assistant"
    next(chunks)
    chunks.close()  # a `break` out of the reading loop
    assert not model._completer.busy
    assert metrics.finished["cancelled"] == cancelled + 1
    assert metrics.predicted_tokens - generated < 200  # ended early, not at max_tokens
    answer = model.create_chat_completion(CHAT, max_tokens=3)
    assert answer["usage"]["completion_tokens"] <= 3


def test_threads_take_turns(model):
    answers, errors = [], []

    def ask():
        try:
            answers.append(model.create_chat_completion(CHAT, max_tokens=6)["choices"][0]["message"]["content"])
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    workers = [threading.Thread(target=ask) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors
    assert len(set(answers)) == 1


def test_bad_fields_name_the_method_and_the_field(model):
    with pytest.raises(RequestError) as caught:
        model.create_chat_completion(CHAT, temperature="hot")
    assert caught.value.param == "temperature"
    assert caught.value.status == 400
    assert str(caught.value).startswith("create_chat_completion (temperature): ")
    with pytest.raises(RequestError, match=r"create_chat_completion \(messages\)"):
        model.create_chat_completion([])
    with pytest.raises(RequestError, match=r"create_completion \(prompt\)"):
        model.create_completion("")
    with pytest.raises(RequestError, match="'stream' must be true or false"):
        model.create_completion("hi", stream="yes")
    with pytest.raises(ValueError, match="max_tokens"):  # a RequestError is a ValueError, as a bad argument is
        model.create_chat_completion(CHAT, max_tokens=-2)
    with pytest.raises(RequestError) as streamed:  # refused before the stream starts
        model.create_chat_completion(CHAT, stream=True, top_k=1.5)
    assert streamed.value.param == "top_k"


def test_a_prompt_too_long_is_refused_in_a_stream_too(model):
    prompt = "sea " * 400  # more tokens than the tiny bundle's 256-token context
    with pytest.raises(RequestError, match="create_completion"):
        model.create_completion(prompt)
    with pytest.raises(RequestError, match="create_completion"):
        list(model.create_completion(prompt, stream=True))
    assert model.create_completion("The sea", max_tokens=2)["usage"]["completion_tokens"] <= 2


def test_tokenize_and_detokenize(model):
    ids = model.tokenize("Hello there")
    assert ids == model.runtime.tokenizer.encode("Hello there")
    assert model.detokenize(model.tokenize("Hello there", add_special=False)) == b"Hello there"
    special = model.runtime.tokenizer.eos_token
    assert len(model.tokenize(special, add_special=False, parse_special=True)) == 1
    assert len(model.tokenize(special, add_special=False)) > 1  # as plain text by default
    with pytest.raises(RequestError, match=r"detokenize \(tokens\[1\]\): tokens\[1\] is -3"):
        model.detokenize([1, -3])
    with pytest.raises(RequestError, match="vocabulary"):
        model.detokenize([10**7])


def test_perplexity_is_evals_and_leaves_answers_unchanged(model):
    from edgesdk.evaluate import PerplexityConfig, bundle_perplexity
    from tests._utils.tiny import CORPUS

    text = " ".join(CORPUS)
    before = model.create_chat_completion(CHAT, max_tokens=8)
    value = model.perplexity(text, context=64)
    expected = bundle_perplexity(model.runtime, text, PerplexityConfig(context=64, stride=64, max_chars=None))
    assert value == pytest.approx(expected.perplexity, rel=1e-6)
    after = model.create_chat_completion(CHAT, max_tokens=8)  # the prompt cache no longer lists the windows' tokens
    assert comparable(after)["choices"] == comparable(before)["choices"]
    with pytest.raises(RequestError, match=r"perplexity \(stride\): stride is 65; expected a whole number of "
                                           r"tokens from 1 to the context, 64"):
        model.perplexity(text, context=64, stride=65)
    with pytest.raises(RequestError, match=r"perplexity \(context\): context is 1;"):
        model.perplexity(text, context=1)
    with pytest.raises(RequestError, match=r"perplexity \(text\): expected the text to score \(a string\), got a list"):
        model.perplexity(CORPUS)


def test_load_refuses_what_it_cannot_take(tiny_bundle, tmp_path):
    with pytest.raises(edgesdk.EdgeSDKError, match=r"load\(\) got the setting\(s\) 'max_new_tokens'"):
        edgesdk.load(tiny_bundle.path, max_new_tokens=4)
    with pytest.raises(edgesdk.EdgeSDKError, match="temperature"):
        edgesdk.load(tiny_bundle.path, temperature=float("inf"))  # -1.0 is greedy, as serve's --temp -1
    with pytest.raises(edgesdk.EdgeSDKError, match="bundle"):
        edgesdk.load(tmp_path / "nothing-here")
    with pytest.raises(BundleError, match="built for target 'host', not 'rpi5'") as mismatch:
        edgesdk.load(tiny_bundle.path, target="rpi5")
    assert mismatch.value.fix.endswith("or pass ignore_target=True")  # load()'s argument, not run's option
    with pytest.raises(edgesdk.EdgeSDKError, match="no backend could run") as no_backend:
        edgesdk.load(tiny_bundle.path, backend="tensorrt")
    assert "pass backend='ort-cpu'" in no_backend.value.fix


def test_a_closed_model_says_so(tiny_bundle):
    model = edgesdk.load(tiny_bundle.path, threads=1)
    assert repr(model).startswith("Model(")
    assert "ort-cpu" in repr(model)
    assert model.max_context == 256
    assert model.manifest["target"]["name"] == "host"
    model.close()
    model.close()  # twice is fine
    with pytest.raises(RequestError, match="the model is closed") as caught:
        model.create_completion("hi")
    assert caught.value.status == 503


def test_close_gives_back_the_saved_kv_caches_and_the_prompt_cache(tiny_bundle):
    """close() stopped the model but kept what it held: the host copies of other conversations' KV caches (up to
    cache_ram_mib, 256 MiB by default) and the backend's buffers (TensorRT's device memory) until the process
    ended, so a program loading and closing bundles in turn ran out of memory."""
    model = edgesdk.load(tiny_bundle.path, threads=1, max_tokens=4)
    for prompt in ("the quick brown fox " * 6, "edge boards run small models " * 6):
        model(prompt)
    store = model._completer.prompt_cache.store
    assert store.entries  # the first conversation's cache, saved when the second came
    model.close()
    assert not store.entries
    assert model._completer.prompt_cache is None
    assert model.runtime.backend.position == 0


def test_watch_thermal_on_a_machine_without_sensors_says_what_it_fell_back_to(tiny_bundle, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "no-thermal-zones"))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    with edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True) as model:
        assert any("no thermal sensor found" in note for note in model.notes), model.notes
        answer = model.create_chat_completion(CHAT, max_tokens=4)
    with edgesdk.load(tiny_bundle.path, threads=1) as plain:
        assert comparable(plain.create_chat_completion(CHAT, max_tokens=4)) == comparable(answer)


def test_the_api_runs_without_torch(tiny_bundle):
    """On a board only the base install exists: `import edgesdk` and `edgesdk.load` need neither torch nor
    transformers."""
    script = BLOCKER + textwrap.dedent(f"""
        import edgesdk
        with edgesdk.load({str(tiny_bundle.path)!r}, threads=1) as model:
            answer = model.create_chat_completion([{{"role": "user", "content": "Hi"}}], max_tokens=3)
        print(answer["object"], answer["usage"]["completion_tokens"] <= 3)
        print(sorted(name for name in sys.modules if name.split(".")[0] in ("torch", "transformers")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["chat.completion True", "[]"]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A bundle built through edgesdk.build_bundle, with room for a tool's description in its prompt."""
    from tests._utils.tiny import save_tiny_model_dir

    root = tmp_path_factory.mktemp("api-build")
    model = save_tiny_model_dir(root / "model", hidden=64, heads=4, kv_heads=2, max_positions=2048)
    return edgesdk.build_bundle("host", str(model), out=root / "bundle", max_context=1024, progress=False,
                         recipe="fp32-standard")


def test_build_from_python(built, tiny_model_dir, tmp_path):
    from edgesdk.bundle import verify_bundle

    bundle = verify_bundle(built)
    assert built.name == "bundle"
    assert bundle.manifest["target"]["name"] == "host"
    assert bundle.manifest["graph"]["max_context"] == 1024
    assert bundle.manifest["recipe"]["name"] == "fp32-standard"
    with pytest.raises(edgesdk.EdgeSDKError, match="nosuch"):
        edgesdk.build_bundle("host", str(tiny_model_dir), out=tmp_path / "bad", progress=False,
                      overrides={"nosuch.field": 1})


def test_streamed_tool_call_equals_the_whole_answer_and_the_servers(built):
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    fields = {"tools": [WEATHER], "tool_choice": "required", "max_tokens": 420}
    http = Served(open_runtime(built, threads=1), ServeDefaults())
    try:
        status, served = http.post("/v1/chat/completions", {"messages": CHAT, **fields})
    finally:
        http.close()
    with edgesdk.load(built, threads=1) as model:
        whole = model.create_chat_completion(CHAT, **fields)
        deltas = [chunk["choices"][0]["delta"] for chunk in model.create_chat_completion(CHAT, stream=True, **fields)]
    assert status == 200
    assert comparable(whole) == comparable(served)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    streamed = accumulated_message(deltas)
    assert [call["function"] for call in streamed["tool_calls"]] == [call["function"]
                                                                      for call in choice["message"]["tool_calls"]]
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_work_outside_requests_leaves_no_stale_prompt_cache(model):
    """Work on the backend between requests (perplexity) may leave exactly as many tokens in the KV cache as the
    prompt cache lists, but other ones: the next answer must not reuse them."""
    import numpy as np

    before = model.create_chat_completion(CHAT, max_tokens=6)
    listed = list(model._completer.prompt_cache.tokens)
    assert listed
    with model._completer.exclusive():
        backend = model.runtime.backend
        backend.reset()
        backend.prefill(np.asarray([(token + 7) % 50 for token in listed], np.int64))  # same length, other tokens
    after = model.create_chat_completion(CHAT, max_tokens=6)
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert comparable(after)["choices"] == comparable(before)["choices"]


def test_a_draft_bundle_drafts_without_changing_the_answer(tiny_bundle):
    """load(draft=...) is serve's --draft: the same answers, and timings counting what was drafted."""
    with edgesdk.load(tiny_bundle.path, threads=1) as plain:
        expected = plain.create_chat_completion(CHAT, max_tokens=12, ignore_eos=True)
    with edgesdk.load(tiny_bundle.path, threads=1, draft=tiny_bundle.path, draft_max=3) as drafted:
        answer = drafted.create_chat_completion(CHAT, max_tokens=12, ignore_eos=True)
        streamed = list(drafted.create_chat_completion(CHAT, max_tokens=12, ignore_eos=True, stream=True))
    assert comparable(answer)["choices"] == comparable(expected)["choices"]
    assert answer["timings"]["draft_n"] > 0
    assert answer["timings"]["draft_n_accepted"] == answer["timings"]["draft_n"]  # the same weights draft
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in streamed if chunk["choices"])
    assert text == expected["choices"][0]["message"]["content"]


def test_a_draft_is_refused_where_it_cannot_serve(tiny_bundle, tmp_path):
    with pytest.raises(edgesdk.EdgeSDKError, match="draft and lookup both draft tokens"):
        edgesdk.load(tiny_bundle.path, draft=tiny_bundle.path, lookup=2)
    with pytest.raises(edgesdk.EdgeSDKError, match=r"draft_max must be a whole number from 1 to"):
        edgesdk.load(tiny_bundle.path, draft=tiny_bundle.path, draft_max=0)
    with pytest.raises(edgesdk.EdgeSDKError, match=r"draft=5: expected a draft bundle's directory"):
        edgesdk.load(tiny_bundle.path, draft=5)
    with pytest.raises(edgesdk.EdgeSDKError, match="no-draft-here"):
        edgesdk.load(tiny_bundle.path, draft=tmp_path / "no-draft-here")


def test_calls_past_max_waiting_are_refused_and_the_limit_is_a_setting(tiny_bundle):
    """At most max_waiting calls wait behind the one generating, as serve's --max-queue; more are a 503."""
    with edgesdk.load(tiny_bundle.path, threads=1, max_waiting=0) as model:
        stream = model.create_chat_completion(CHAT, stream=True, max_tokens=200, ignore_eos=True)
        next(stream)  # generating now, holding the turn
        with pytest.raises(RequestError, match="the model is busy") as caught:
            model.create_chat_completion(CHAT, max_tokens=2)
        stream.close()
    assert caught.value.status == 503
    assert "max_waiting" in caught.value.fix
    with pytest.raises(edgesdk.EdgeSDKError, match="max_waiting"):
        edgesdk.load(tiny_bundle.path, max_waiting=-1)


def test_build_bundle_names_no_command_line_next_steps(tiny_model_dir, tmp_path, capfd):
    """The command line's 'next: edgesdk run ...' hint is the CLI's, not a Python caller's."""
    out = edgesdk.build_bundle("host", str(tiny_model_dir), out=tmp_path / "quiet", max_context=64, progress=False,
                               recipe="fp32-standard")
    assert out == tmp_path / "quiet"
    assert "next: edgesdk run" not in capfd.readouterr().err
