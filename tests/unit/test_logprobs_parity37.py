"""Log-probabilities against llama.cpp's: the numbers and the order of the alternatives of a greedy answer (POST
/completion's ``n_probs``, as llama-server's ``completion_probabilities``) and of an echoed prompt, checked against
llama.cpp's own logits for the bundle exported to an F32 GGUF; equally likely alternatives listed in the order
greedy sampling takes them; a token with no chance (-inf) written as llama-server writes it, in valid JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgesdk.runtime.generate import Sampler, SamplingConfig
from edgesdk.runtime.logprobs import NO_CHANCE, LogprobRecorder, log_softmax
from edgesdk.serve.api import CompletionRequest, logprobs_body

LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"
RECIPE = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
TOP = 5
ANSWER = 8

def _llama_cpp(path: Path, ids: list[int]) -> tuple[np.ndarray, list[bytes]]:
    """llama.cpp's logits for the ids and each token's piece as bytes, in a child process."""
    from tests._utils.gguf_files import llama_cpp_child

    logits, answer = llama_cpp_child(path, ids, pieces=True)
    return logits, answer["pieces"]


def _validate_utf8(data: bytes) -> int:
    """llama-server's validate_utf8 (tools/server/server-common.cpp): the length up to a multi-byte character
    cut off at the end."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if (byte & 0xE0) == 0xC0 and back < 2 or (byte & 0xF0) == 0xE0 and back < 3 or \
                (byte & 0xF8) == 0xF0 and back < 4:
            return len(data) - back
    return len(data)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    """(runtime, GGUF path): a float32 bundle of the tiny model and the same weights as llama.cpp reads them."""
    pytest.importorskip("torch")
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.session import open_runtime
    from tests._utils.builds import build_tiny_bundle

    root = tmp_path_factory.mktemp("fp32-logprobs")
    bundle = build_tiny_bundle(root, RECIPE, "host")
    return open_runtime(bundle.path, threads=1), export_gguf(bundle.path, root / "model.gguf").path


def test_greedy_answer_and_echo_log_probabilities_are_llama_cpp_s(fp32):
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    runtime, gguf = fp32
    prompt = runtime.tokenizer.encode("The quick brown fox")
    served = Served(runtime, ServeDefaults(max_tokens=16))
    try:
        status, native = served.post("/completion", {"prompt": prompt, "n_predict": ANSWER, "temperature": 0,
                                                     "n_probs": TOP})
        assert status == 200, native
        status, echo = served.post("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0,
                                                       "logprobs": TOP, "echo": True})
        assert status == 200, echo
    finally:
        served.close()
    answer = [entry["id"] for entry in native["completion_probabilities"]]
    assert len(answer) == ANSWER
    logits, pieces = _llama_cpp(gguf, prompt + answer)
    rows = log_softmax(logits)  # rows[i] scores token i + 1, as llama-server's softmax over all logits does
    worst = 0.0
    for index, entry in enumerate(native["completion_probabilities"]):
        row = rows[len(prompt) - 1 + index]
        assert entry["id"] == int(np.argmax(row))  # greedy: llama.cpp's pick too
        expected = np.argsort(-row, kind="stable")[:TOP]
        assert [alt["id"] for alt in entry["top_logprobs"]] == list(expected)
        for shown in (entry, *entry["top_logprobs"]):
            worst = max(worst, abs(shown["logprob"] - row[shown["id"]]))
            piece = pieces[shown["id"]]
            assert bytes(shown["bytes"]) == piece
            assert shown["token"] == piece[:_validate_utf8(piece)].decode("utf-8", errors="replace")
    scored = echo["choices"][0]["logprobs"]["token_logprobs"][1:len(prompt)]  # the prompt's, the first has none
    worst = max(worst, *(abs(logprob - rows[index][prompt[index + 1]]) for index, logprob in enumerate(scored)))
    assert worst < 5e-4, worst  # float32 on both sides: 6.7e-5 measured


def test_equally_likely_alternatives_come_in_the_order_greedy_sampling_takes_them():
    """A flat distribution (every logit the same, as an untrained vocabulary's padding rows give): greedy sampling
    takes the lowest id, and the alternatives list it first, then the next ids."""
    logits = np.zeros(1000, np.float32)
    picked = Sampler(SamplingConfig(temperature=0.0))(logits)
    entry = LogprobRecorder(top=5).entry(logits, picked)
    assert [token for token, _ in entry.top] == [picked, 1, 2, 3, 4]
    tied = np.zeros(50, np.float32)
    tied[[40, 7, 30]] = 1.0
    assert [token for token, _ in LogprobRecorder(top=2).entry(tied, 7).top] == [7, 30]


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("shape", ["chat", "completions", "llama"])
def test_a_token_with_no_chance_is_written_as_llama_server_writes_it(shape):
    """A logit of -inf (a float16 engine's overflow) is a probability of 0: llama-server reports the lowest float32
    (server-task.h's logarithm()), never -Infinity, which JSON parsers refuse."""
    logits = np.array([1.0, 0.5, -np.inf, 0.0], np.float32)
    recorder = LogprobRecorder(top=4)
    recorder.record(logits, 2)
    request = CompletionRequest(chat=shape == "chat", llama_probs=shape == "llama", logprobs=4)
    body = logprobs_body(request, recorder.answer, lambda token: b"abcd"[token:token + 1])
    text = json.dumps(body, ensure_ascii=False)  # as the server writes its answers
    parsed = _strict(text)
    entry = {"chat": lambda: parsed["content"][0], "llama": lambda: parsed[0],
             "completions": lambda: {"logprob": parsed["token_logprobs"][0]}}[shape]()
    assert entry["logprob"] == NO_CHANCE == -3.4028234663852886e+38
    if shape != "completions":
        assert [alt["logprob"] for alt in entry["top_logprobs"]][-1] == NO_CHANCE
    assert recorder.answer[0].top[0][1] == pytest.approx(float(log_softmax(logits)[0]))
