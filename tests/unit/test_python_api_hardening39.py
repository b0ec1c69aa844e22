"""edgesdk.load's Model used as llama-cpp-python's Llama is used: its call patterns, its bodies read by the openai
package's own types, its lifecycle (close while a stream is read, a stream left or interrupted, a model dropped
unclosed) and the errors a wrong argument gets (a RequestError / EdgeSDKError naming it, never a bare TypeError)."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import edgesdk
from edgesdk.api import RequestError

CHAT = [{"role": "user", "content": "Say something about the sea."}]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tiny_bundle):
    with edgesdk.load(tiny_bundle.path, threads=1, max_tokens=16) as loaded:
        yield loaded


def no_thermal_zones(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "no-thermal-zones"))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))


def test_llama_cpp_python_call_patterns(model):
    answer = model(prompt="Q: Name the planets. A:", max_tokens=32, stop=["Q:", "\n"], echo=True)
    assert answer["choices"][0]["text"].startswith("Q: Name the planets. A:")  # echo: the prompt first
    chat = model.create_chat_completion(messages=CHAT, max_tokens=4, seed=3, temperature=0.8)
    assert chat["object"] == "chat.completion"
    again = model.create_chat_completion(messages=CHAT, max_tokens=4, seed=3, temperature=0.8)
    assert again["choices"] == chat["choices"]  # one seed, one answer
    yes_no = model("Is the sea blue?", grammar='root ::= "yes" | "no"', max_tokens=4)
    assert yes_no["choices"][0]["text"] in ("yes", "no")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    shaped = model.create_chat_completion(CHAT, response_format={"type": "json_object", "schema": schema},
                                          max_tokens=4)  # llama-cpp-python's own form of a schema
    assert shaped["choices"][0]["message"]["content"].lstrip()[:1] in ("", "{")
    stream = model("The sea", max_tokens=3, stream=True)
    assert list(stream)[-1]["choices"][0]["finish_reason"] == "length"
    assert list(stream) == []  # a generator, read once


def test_bodies_validate_strictly_with_the_openai_packages_types(model):
    openai = pytest.importorskip("openai")
    from openai.types import Completion
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    assert openai
    ChatCompletion.model_validate(model.create_chat_completion(CHAT, max_tokens=4, logprobs=True, top_logprobs=2),
                                  strict=True)
    for chunk in model.create_chat_completion(CHAT, max_tokens=4, stream=True, logprobs=True, top_logprobs=2,
                                              stream_options={"include_usage": True}):
        ChatCompletionChunk.model_validate(chunk, strict=True)
    Completion.model_validate(model("The sea", max_tokens=4, logprobs=2), strict=True)
    # A streamed text completion's chunks carry finish_reason null until the last, as OpenAI's own do; the openai
    # package's Completion type (which its client builds without validating) does not allow null there.
    chunks = list(model("The sea", max_tokens=4, stream=True))
    Completion.model_validate(chunks[-1], strict=True)


def test_a_field_the_route_does_not_read_is_refused_by_name(model):
    with pytest.raises(RequestError, match=r"create_completion \(max_token\): create_completion\(\) takes no field "
                                           r"'max_token' \(did you mean 'max_tokens'\?\)") as caught:
        model("The sea", max_token=3)
    assert caught.value.param == "max_token"
    assert "max_tokens" in caught.value.fix
    with pytest.raises(RequestError, match="takes no field 'stopping_criteria'"):  # llama-cpp-python's callbacks
        model("The sea", stopping_criteria=[lambda ids, logits: False])
    with pytest.raises(RequestError, match="takes no field 'n_probs'"):  # llama-server's /completion only
        model("The sea", n_probs=2)
    with pytest.raises(RequestError, match="takes no field 'max_completion_tokens'"):  # chat's name
        model("The sea", max_completion_tokens=2)
    with pytest.raises(RequestError, match=r"create_chat_completion \(prompt\): create_chat_completion\(\) takes no "
                                           r"field 'prompt' \(create_completion's field"):
        model.create_chat_completion(CHAT, prompt="The sea")
    with pytest.raises(RequestError, match="takes no field 'max_tokenz'"):  # refused before a stream starts
        model.create_chat_completion(CHAT, stream=True, max_tokenz=2)
    assert not model._completer.busy
    with pytest.raises(RequestError, match=r"create_completion \(mirostat_mode\): mirostat_mode=2 sets a sampler of "
                                           r"llama-cpp-python's that edgesdk's runtime does not have") as sampler:
        model("The sea", mirostat_mode=2)
    assert sampler.value.fix == "leave mirostat_mode out, or at 0"
    # what llama-cpp-python's Llama passes by default (a wrapper forwarding every keyword) changes nothing
    defaults = {"tfs_z": 1.0, "mirostat_mode": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "logits_processor": None,
                "stopping_criteria": None, "model": None}
    assert model("The sea", max_tokens=2, **defaults)["choices"] == model("The sea", max_tokens=2)["choices"]


def test_every_field_the_server_reads_is_taken(model):
    text = model("The sea", max_tokens=2, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1, samplers="kpt", seed=1,
                 presence_penalty=0.1, frequency_penalty=0.1, repeat_penalty=1.1, repeat_last_n=8,
                 logit_bias={"5": 1}, stop=["x"], stream_options=None, cache_prompt=True, ignore_eos=False,
                 logprobs=1, echo=False, grammar=None, json_schema=None, response_format=None, n=1, best_of=1,
                 suffix=None, mirostat=0, typical_p=1.0, model="any", user="someone", metadata={}, store=False)
    assert text["usage"]["completion_tokens"] <= 2
    chat = model.create_chat_completion(CHAT, max_completion_tokens=2, logprobs=True, top_logprobs=1, tools=None,
                                        tool_choice=None, chat_template_kwargs={}, reasoning_format="none",
                                        parallel_tool_calls=True, modalities=["text"], audio=None,
                                        web_search_options=None, functions=None, function_call=None, model="any")
    assert chat["usage"]["completion_tokens"] <= 2


def test_token_ids_and_messages_as_python_holds_them(model):
    """A tuple, a numpy array or numpy integers are token ids as much as a list of ints, and a tuple of messages
    is messages: each answers as the list does."""
    np = pytest.importorskip("numpy")
    ids = model.tokenize("The sea", add_special=False)
    expected = model(ids, max_tokens=3)["choices"]
    assert model(tuple(ids), max_tokens=3)["choices"] == expected
    assert model(np.array(ids), max_tokens=3)["choices"] == expected
    assert model([np.int64(token) for token in ids], max_tokens=3)["choices"] == expected
    assert model.detokenize(np.array(ids)) == b"The sea"
    chat = model.create_chat_completion(CHAT, max_tokens=3)["choices"]
    assert model.create_chat_completion(tuple(CHAT), max_tokens=3)["choices"] == chat
    with pytest.raises(RequestError, match=r"detokenize \(tokens\[1\]\): tokens\[1\] is 1.5"):
        model.detokenize([np.int64(3), 1.5])


def test_tokenize_and_detokenize_refuse_what_is_not_text_or_token_ids(model):
    with pytest.raises(RequestError, match=r"tokenize \(text\): text is b'\\xffHello'; expected UTF-8 bytes") as caught:
        model.tokenize(b"\xffHello")  # llama-cpp-python's form (bytes) is taken where it is UTF-8
    assert "encode" in caught.value.fix
    with pytest.raises(RequestError, match=r"tokenize \(text\): text is None"):
        model.tokenize(None)
    with pytest.raises(RequestError, match=r"tokenize \(add_special\): add_special is 'no'; expected True or False"):
        model.tokenize("Hello", add_special="no")
    with pytest.raises(RequestError, match=r"detokenize \(tokens\): tokens is None; expected token ids"):
        model.detokenize(None)
    with pytest.raises(RequestError, match=r"detokenize \(tokens\): tokens is 5"):
        model.detokenize(5)
    with pytest.raises(RequestError, match=r"detokenize \(tokens\): tokens is b'ab'"):  # not the byte values as ids
        model.detokenize(b"ab")
    ids = model.tokenize("Hello there", add_special=False)
    assert model.detokenize(iter(ids)) == b"Hello there"


def test_perplexity_refuses_what_it_cannot_score(model):
    text = "the sea is blue and the sky is wide " * 20
    with pytest.raises(RequestError, match=r"perplexity \(max_chars\): max_chars is 'all'; expected a whole number "
                                           r"of characters >= 1"):
        model.perplexity(text, context=16, max_chars="all")
    with pytest.raises(RequestError, match=r"perplexity \(max_chars\): max_chars is -1"):  # not the text less its end
        model.perplexity(text, context=16, max_chars=-1)
    with pytest.raises(RequestError, match=r"perplexity \(context\): context is 512, longer than the bundle's "
                                           r"max_context 256") as caught:
        model.perplexity(text, context=512)  # asked past a bundle of 256 tokens (the default is its 256)
    assert caught.value.fix == "pass context=256 or less"
    with pytest.raises(RequestError, match=r"perplexity \(text\): the text gives 0 token\(s\)") as short:
        model.perplexity("", context=16)
    assert "--" not in short.value.fix  # the Python API's words, not the command line's
    assert model.perplexity(text, context=16, max_chars=60) > 0


def test_load_refuses_arguments_of_the_wrong_kind(tiny_bundle):
    path = tiny_bundle.path
    cases = [
        ({"path": None}, r"load\(\): path=None: expected the bundle's directory"),
        ({"path": path, "target": 5}, r"load\(\): target=5: expected a board's name"),
        ({"path": path, "backend": 3}, r"load\(\): backend=3: expected one of ort-cpu"),
        ({"path": path, "threads": "2"}, r"load\(\): threads='2': expected a whole number"),
        # a truthy string must not run a bundle built for another board, nor start a guard nobody asked for
        ({"path": path, "ignore_target": "no"}, r"load\(\): ignore_target='no': expected True or False"),
        ({"path": path, "watch_thermal": "yes"}, r"load\(\): watch_thermal='yes': expected True or False"),
        ({"path": path, "prompt_cache": "no"}, r"load\(\): prompt_cache='no': expected True or False"),
        ({"path": path, "max_tokens": 0}, r"load\(\): max_tokens=0: expected a whole number of at least 1, or -1 "
                                          r"for no limit but the context"),
        ({"path": path, "cache_ram_mib": "x"}, r"load\(\): cache_ram_mib='x': expected a whole number"),
    ]
    for arguments, message in cases:
        with pytest.raises(edgesdk.EdgeSDKError, match=message) as caught:
            edgesdk.load(arguments.pop("path"), **arguments)
        assert caught.value.fix
        assert "--" not in caught.value.fix, caught.value.fix  # the Python API's words, not the command line's
    with pytest.raises(edgesdk.EdgeSDKError, match="is a file, not a bundle directory"):
        edgesdk.load(path / "manifest.json")


def test_a_bundle_with_a_changed_byte_is_refused(tiny_bundle, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny_bundle.path, copy)
    data = bytearray((copy / "tokenizer.json").read_bytes())
    data[-2] ^= 0x01
    (copy / "tokenizer.json").write_bytes(bytes(data))
    with pytest.raises(edgesdk.EdgeSDKError, match="tokenizer.json"):
        edgesdk.load(copy, threads=1)


def test_close_while_a_stream_is_read_in_another_thread(tiny_bundle, tmp_path, monkeypatch):
    """close() returns once the answer in flight has ended (its reader told the model was closed), so the thermal
    guard is given back after the answer's last step, as edgesdk serve stops its answers before closing its
    thermal session."""
    no_thermal_zones(tmp_path, monkeypatch)
    model = edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True)
    hook, events = model._thermal.hook, []
    stepping, go_on = threading.Event(), threading.Event()
    step = hook.before_step

    def held_step(kind: str) -> float:  # the first step waits until the closer has started
        if not stepping.is_set():
            stepping.set()
            go_on.wait()
        events.append("step")
        return step(kind)

    monkeypatch.setattr(hook, "before_step", held_step)
    outcome = {}

    def read() -> None:
        try:
            list(model.create_chat_completion(CHAT, stream=True, max_tokens=200, ignore_eos=True))
        except RequestError as exc:
            outcome["error"] = exc

    def close() -> None:
        model.close()
        events.append("closed")

    reader, closer = threading.Thread(target=read), threading.Thread(target=close)
    reader.start()
    assert stepping.wait(60)
    closer.start()
    # the step goes on once close() has returned or waits for the answer's turn
    while closer.is_alive() and model._completer._turn.queued < 2:
        closer.join(0.01)
    go_on.set()
    closer.join(60)
    reader.join(60)
    assert events[-1] == "closed", events  # no step after close() returned
    assert "step" in events
    error = outcome["error"]
    assert error.status == 503
    assert str(error).startswith("create_chat_completion: the model was closed while this request waited or "
                                 "generated")
    assert "edgesdk serve" not in str(error)
    with pytest.raises(RequestError, match="the model is closed"):
        model.tokenize("Hello")  # as every other method of a closed model
    with pytest.raises(RequestError, match="the model is closed"):
        model.detokenize([1])


def test_close_inside_the_loop_reading_a_stream(tiny_bundle):
    model = edgesdk.load(tiny_bundle.path, threads=1)

    def read_and_close() -> None:
        for read, _ in enumerate(model("The sea", stream=True, max_tokens=200, ignore_eos=True)):
            if read == 1:
                model.close()  # the worker holds the turn: close waits for its next token, not for the reader

    with pytest.raises(RequestError, match="the model was closed"):
        read_and_close()
    assert not model._completer.busy


def test_keyboard_interrupt_while_reading_a_stream_stops_its_answer(model):
    """Ctrl-C while the loop waits for the next chunk raises KeyboardInterrupt inside the stream's generator,
    as ``throw`` does here: the answer ends at its next token and the next request runs."""
    metrics = model._completer.metrics
    cancelled, generated = metrics.finished["cancelled"], metrics.predicted_tokens
    stream = model("The sea", stream=True, max_tokens=200, ignore_eos=True)
    next(stream)
    with pytest.raises(KeyboardInterrupt):
        stream.throw(KeyboardInterrupt)
    assert not model._completer.busy
    assert metrics.finished["cancelled"] == cancelled + 1
    assert metrics.predicted_tokens - generated < 200
    assert model("The sea", max_tokens=2)["usage"]["completion_tokens"] <= 2


def test_a_stream_dropped_unread_or_half_read_frees_the_model(model):
    stream = model("The sea", stream=True, max_tokens=200, ignore_eos=True)
    next(stream)
    del stream  # garbage: its generator closes, the answer ends
    gc.collect()
    assert not model._completer.busy
    assert "edgesdk-answer" not in {thread.name for thread in threading.enumerate()}
    unread = model("The sea", stream=True, max_tokens=2)
    del unread  # never started: nothing to end
    assert model("The sea", max_tokens=2)["usage"]["completion_tokens"] <= 2


def test_a_model_dropped_unclosed_gives_its_thermal_guard_back(tiny_bundle, tmp_path, monkeypatch):
    from tests._utils.sysfs import make_zone

    monkeypatch.setenv("EDGESDK_THERMAL_ROOT", str(tmp_path / "thermal"))
    monkeypatch.setenv("EDGESDK_CPUFREQ_ROOT", str(tmp_path / "no-cpufreq"))
    zone = tiny_bundle.manifest["target"]["thermal"]["zones"][0]
    make_zone(tmp_path / "thermal", 0, zone, "45000")

    def pollers() -> int:
        return sum(thread.name == "edgesdk-thermal-poll" for thread in threading.enumerate())

    before = pollers()
    model = edgesdk.load(tiny_bundle.path, threads=1, watch_thermal=True)
    assert any("thermal sensors" in note for note in model.notes), model.notes
    assert pollers() == before + 1
    del model
    gc.collect()
    assert pollers() == before


def test_the_api_module_is_python_310_code():
    """The board runtime's Python (JetPack 6: 3.10) compiles and imports edgesdk.api (its module level needs only
    the standard library and edgesdk.errors); tests/e2e/test_board_runtime_py310.py runs the board install."""
    from tests.e2e.test_board_runtime_py310 import find_python310

    python310 = find_python310()
    if python310 is None:
        pytest.skip("no python3.10 interpreter on this machine")
    script = (f"import sys; sys.path.insert(0, {str(REPO)!r}); import edgesdk, edgesdk.api; "
              "print(edgesdk.load is edgesdk.api.load, sys.version_info[:2])")
    done = subprocess.run([python310, "-I", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True (3, 10)"
    assert sys.version_info >= (3, 10)


def test_whole_streamed_and_perplexity_from_several_threads_answer_as_alone(model):
    text = " ".join(["the sea is blue and the sky is wide"] * 10)
    alone = {"whole": model.create_chat_completion(CHAT, max_tokens=6)["choices"][0]["message"]["content"],
             "streamed": model("The sea", max_tokens=6)["choices"][0]["text"],
             "perplexity": model.perplexity(text, context=32)}
    asks = {"whole": lambda: model.create_chat_completion(CHAT, max_tokens=6)["choices"][0]["message"]["content"],
            "streamed": lambda: "".join(chunk["choices"][0]["text"]
                                        for chunk in model("The sea", max_tokens=6, stream=True)),
            "perplexity": lambda: model.perplexity(text, context=32)}
    answers, errors = [], []

    def ask(kind: str) -> None:
        try:
            answers.append((kind, asks[kind]()))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    workers = [threading.Thread(target=ask, args=(kind,)) for kind in ["whole", "streamed", "perplexity"] * 2]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not errors
    assert len(answers) == 6
    for kind, answer in answers:
        assert answer == pytest.approx(alone[kind]) if kind == "perplexity" else answer == alone[kind], kind
