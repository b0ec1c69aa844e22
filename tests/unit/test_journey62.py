"""A user's journey through ``edgesdk serve`` and ``edgesdk run``:

* an Ollama ``options`` key with a typo (``num_predcit``) was ignored without a word, where Ollama logs "invalid
  option provided" naming it (api/types.go ``Options.FromMap``): the log now names it and the known option nearest
  its name, and the request is still answered;
* ``run --prompt-cache F --stats`` again printed ``prefill 42.53 tok/s`` for the one token prefilled after 293 from
  the cache, which read as the whole prompt's rate: it now says ``prefill 1 tok in X ms (R tok/s)``;
* every stream (OpenAI's, Anthropic's, Ollama's, the Python API's) holds a character whose UTF-8 bytes come in two
  tokens back until it is whole, hands out a byte that can begin no character as U+FFFD at once, and a character
  cut off at the end of the answer as U+FFFD, as llama-server's ``validate_utf8`` does. Checked on a bundle whose
  model answers with byte tokens chosen for it (:func:`_byte_model`)."""

from __future__ import annotations

import json
import logging
import re

import pytest

from edgesdk.serve.ollama import parse_generate
from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_serve import Served

pytest.importorskip("transformers")

NAME = "tiny-host:latest"
C3, A9, STRAY = 0xC3, 0xA9, 0x80  # "é" is C3 A9; 0x80 can begin no character


def _warned(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "edgesdk.serve.ollama" and record.levelno == logging.WARNING]


# ------------------------------------------------------------------------------------------- Ollama's options
def test_a_misspelt_option_is_warned_of_with_the_option_meant(served, caplog):
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.ollama"):
        status, answer = served.post("/api/generate", {"model": NAME, "prompt": "Hi", "stream": False,
                                                       "options": {"num_predcit": 3, "num_predict": 2}})
    assert status == 200, answer
    assert answer["eval_count"] == 2
    warned = _warned(caplog)
    assert len(warned) == 1, warned
    assert "invalid option provided option=num_predcit " in warned[0]
    assert "'num_predict'" in warned[0]


def test_every_option_ollama_knows_is_not_warned_of_and_an_unknown_one_is(caplog):
    known = {"num_ctx": 64, "num_batch": 8, "num_gpu": 1, "main_gpu": 0, "use_mmap": True, "num_thread": 2,
             "num_keep": 4, "seed": 1, "num_predict": 4, "top_k": 1, "top_p": 0.9, "min_p": 0.1, "typical_p": 1.0,
             "repeat_last_n": 64, "temperature": 0, "repeat_penalty": 1.1, "presence_penalty": 0.0,
             "frequency_penalty": 0.0, "stop": ["\n"]}
    with caplog.at_level(logging.WARNING, logger="edgesdk.serve.ollama"):
        parse_generate({"model": NAME, "prompt": "hi", "options": known}, NAME)
        assert _warned(caplog) == []
        parse_generate({"model": NAME, "prompt": "hi", "options": {"rope_frequency_base": 5, "zzz": 1}}, NAME)
    warned = _warned(caplog)
    assert [line.split("option=")[1].split()[0] for line in warned] == ["rope_frequency_base", "zzz"]
    assert all("did you mean" not in line for line in warned[1:]), warned


# ------------------------------------------------------------------------------------------ run --stats, cached
def test_stats_say_how_many_tokens_the_prefill_rate_is_over(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    prompt = "The tower was built for the fair of 1889 and named after its engineer. " * 3
    runs = [invoke("run", tiny_bundle.path, "--prompt", prompt, "--raw", "-n", 4, "--threads", 1, "--stats",
                   "--prompt-cache", path) for _ in range(2)]
    for result in runs:
        assert_ok(result)
    first, again = (next(line for line in result.stderr.splitlines() if "tok/s" in line) for result in runs)
    assert "from the cache" not in first
    assert re.search(r"prefill [\d.]+ tok/s, TTFT [\d.]+ ms", first), first
    prompt_tokens = int(re.search(r"prompt (\d+) tok", again).group(1))
    assert f"({prompt_tokens - 1} from the cache)" in again, again
    found = re.search(r"prefill (\d+) tok in ([\d.]+) ms \(([\d.]+) tok/s\), TTFT ([\d.]+) ms", again)
    assert found, again
    assert found.group(1) == "1"
    assert found.group(2) == found.group(4)
    milliseconds, rate = float(found.group(2)), float(found.group(3))
    if milliseconds >= 0.1:  # both figures are rounded to 0.01
        assert rate * milliseconds / 1e3 == pytest.approx(1, abs=0.01 + 0.005 / milliseconds + 0.005 / rate)


# --------------------------------------------------------------------------- a character in two tokens, streamed
def _byte_ids() -> dict[int, int]:
    """The tiny byte-level tokenizer's one-byte token of each byte."""
    from edgesdk.runtime.json_mode import _byte_level_alphabet
    from tests._utils import tiny

    vocab = tiny.tiny_tokenizer().get_vocab()
    return {byte: vocab[char] for char, byte in _byte_level_alphabet().items()}


def _byte_model(path):
    """A model directory whose greedy answer is set by its last token alone: after 0xC3 comes 0xA9, after 0x80 comes
    0x80 again, and after any other token 0xC3, so that an answer is "é" again and again, each in two tokens (its
    attention and MLP outputs near zero leave the last token's embedding to the head)."""
    import torch

    from tests._utils import tiny

    ids = _byte_ids()
    model = tiny.tiny_llama(tie=False, seed=3)
    hidden = model.config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(1e-4)
            layer.mlp.down_proj.weight.mul_(1e-4)
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.mul_(1e-3)
        embed[:, 0] += 8.0  # any token: state 0
        for token, state in ((ids[C3], 1), (ids[STRAY], 2)):
            embed[token, 0] -= 8.0
            embed[token, state] += 8.0
        head.mul_(1e-3)
        for token, state in ((ids[C3], 0), (ids[A9], 1), (ids[STRAY], 2)):
            head[token, state] += 4.0
        model.model.norm.weight.fill_(1.0)
        assert hidden > 2
    model.save_pretrained(path, safe_serialization=True)
    tiny.tiny_tokenizer(model.config.vocab_size).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def byte_bundle(tmp_path_factory):
    pytest.importorskip("torch")
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig

    model = _byte_model(tmp_path_factory.mktemp("models") / "byte-model")
    return build(BuildConfig(target="host", model=str(model), out=tmp_path_factory.mktemp("bundles") / "tiny-host",
                             export=ExportConfig(max_context=128), progress=False))


@pytest.fixture(scope="module")
def byte_served(byte_bundle):
    from edgesdk.runtime.session import open_runtime

    server = Served(open_runtime(byte_bundle.path, threads=1))
    yield server
    server.close()


def _events(payload: bytes) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in payload.decode().split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def _openai_pieces(server, prompt: list[int], n: int) -> list[str]:
    status, _, payload = server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": n,
                                                                    "temperature": 0, "stream": True})
    assert status == 200, payload
    return [event["choices"][0]["text"] for event in _events(payload) if event["choices"]]


def _chat_pieces(server, n: int) -> list[str]:
    status, _, payload = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": n, "temperature": 0, "stream": True})
    assert status == 200, payload
    return [event["choices"][0]["delta"].get("content") or "" for event in _events(payload) if event["choices"]]


def _anthropic_pieces(server, n: int) -> list[str]:
    status, _, payload = server.request("POST", "/v1/messages", {
        "model": "tiny-host", "max_tokens": n, "temperature": 0, "stream": True,
        "messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200, payload
    return [event["delta"]["text"] for event in _events(payload)
            if event.get("type") == "content_block_delta" and event["delta"].get("type") == "text_delta"]


def _ollama_pieces(server, n: int) -> list[str]:
    status, _, payload = server.request("POST", "/api/generate", {
        "model": NAME, "prompt": "Hi", "stream": True, "options": {"num_predict": n, "temperature": 0}})
    assert status == 200, payload
    return [json.loads(line)["response"] for line in payload.decode().splitlines() if line]


def _answered(pieces: list[str], whole: str) -> None:
    """Each piece is whole characters, and the pieces make ``whole``."""
    assert "".join(pieces) == whole, pieces
    assert all(set(piece) <= {"é"} for piece in pieces), pieces


@pytest.mark.parametrize("streamed", [_chat_pieces, _anthropic_pieces, _ollama_pieces])
def test_every_stream_holds_a_character_back_until_its_bytes_are_whole(byte_served, streamed):
    pieces = streamed(byte_served, 6)
    _answered(pieces, "ééé")
    assert "\ufffd" not in "".join(pieces)
    # cut off by the token limit after a character's first byte: U+FFFD at the end, as llama-server's; the Ollama
    # routes drop it, as Ollama's runner trims bytes that are no whole character
    cut = streamed(byte_served, 5)
    if streamed is _ollama_pieces:
        assert "".join(cut) == "éé", cut
    else:
        assert "".join(cut) == "éé\ufffd", cut
        assert [piece for piece in cut if piece][-1].endswith("\ufffd"), cut


def test_the_completions_stream_holds_back_a_split_character_and_shows_a_stray_byte_at_once(byte_served):
    ids = _byte_ids()
    pieces = _openai_pieces(byte_served, [ids[ord("a")]], 4)
    _answered(pieces, "éé")
    stray = _openai_pieces(byte_served, [ids[STRAY]], 3)  # 0x80 after 0x80: no character, each at once
    assert [piece for piece in stray if piece] == ["\ufffd"] * 3, stray


def test_the_python_api_stream_holds_a_character_back_until_its_bytes_are_whole(byte_bundle):
    import edgesdk

    with edgesdk.load(byte_bundle.path, threads=1) as model:
        chunks = list(model.create_completion("Hi", max_tokens=6, temperature=0, stream=True))
        cut = list(model.create_completion("Hi", max_tokens=5, temperature=0, stream=True))
    _answered([chunk["choices"][0]["text"] for chunk in chunks], "ééé")
    assert "".join(chunk["choices"][0]["text"] for chunk in cut) == "éé\ufffd"
