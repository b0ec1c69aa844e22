"""A second reading of the prefill in steps (review 50): the thermal guard's ``prefill_chunk`` reaches every prefill
serve runs, and the run summary keeps apart the requests whose steps it records."""

from __future__ import annotations

import numpy as np
import pytest

from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.llama_native import parse_completion_request
from tests.unit.test_prefill50 import Steps


@pytest.fixture(scope="module")
def backends_tiny(tmp_path_factory):
    """test_prefill50's tiny model on the standard ONNX Runtime backend, with a 1,024-token context."""
    pytest.importorskip("torch")
    from edgesdk.export.onnx_export import ExportConfig, export_model
    from edgesdk.runtime.ort_backend import OrtBackend
    from tests._utils.tiny import tiny_llama

    out = tmp_path_factory.mktemp("standard")
    spec = export_model(tiny_llama(hidden=64, heads=4, kv_heads=2, max_positions=1024), out,
                        ExportConfig(form="standard", weights="fp32", max_context=1024))
    return OrtBackend(out / "model.onnx", spec.to_json(), threads=1)


PROMPT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods"


def test_a_prefill_only_request_is_prefilled_in_the_guards_steps(runtime):
    """llama-server's ``n_predict`` 0 (OpenAI's ``max_tokens`` 0, lm-evaluation-harness scoring a prompt) prefilled
    the whole prompt in one pass whatever the thermal guard asked: a long prompt scored on a hot board ran into the
    firmware throttle, as every prompt did before the guard's steps."""
    hook = Steps(4)
    completer = Completer(runtime, ServeDefaults(max_tokens=16), hook=hook)
    done = completer.complete(parse_completion_request({"prompt": PROMPT, "n_predict": 0, "cache_prompt": False}))
    total = done.prompt_tokens
    assert total > 8
    assert hook.asked == list(range(total, 0, -4))  # before the fix: never asked, one pass
    prefills = [step for step in hook.steps if step[0] == "prefill"]
    assert [tokens for _, tokens, _ in prefills] == [0] * len(hook.asked)
    values = completer.metrics
    assert (values.prompt_tokens, values.decodes) == (total, len(hook.asked))
    assert runtime.backend.position == total


def test_a_prompt_scored_in_steps_has_the_log_probabilities_of_one_pass(runtime):
    """OpenAI's prompt scoring (echo, logprobs, max_tokens 0) over the guard's steps: the same entries as one pass."""
    from edgesdk.serve.api import parse_text_request

    body = {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 2}
    whole = Completer(runtime, ServeDefaults(max_tokens=16)).complete(parse_text_request(body))
    hook = Steps(3)
    stepped = Completer(runtime, ServeDefaults(max_tokens=16), hook=hook).complete(parse_text_request(body))
    assert len(hook.asked) > 2
    assert stepped.text == whole.text == PROMPT
    assert stepped.logprobs["tokens"] == whole.logprobs["tokens"]
    assert stepped.logprobs["token_logprobs"][0] is None
    assert stepped.logprobs["token_logprobs"][1:] == pytest.approx(whole.logprobs["token_logprobs"][1:], abs=1e-4)


class LeavesAtStep:
    """The serve wrappers' place around a thermal hook: the client leaves while the guard holds prefill step ``n``
    back (serve's abandon_wait raises ClientGone there; the records of the steps before it are written)."""

    def __init__(self, inner, n: int | None):
        self.inner, self.n, self.begun = inner, n, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def before_step(self, kind):
        if kind == "prefill":
            self.begun += 1
            if self.begun == self.n:
                raise ConnectionAbortedError("the client left")
        return self.inner.before_step(kind)


def test_a_prompt_abandoned_between_its_steps_is_not_merged_into_the_next_request():
    """The run summary (thermal report, plan) added a prefill record's time to the next ones until one had no
    prompt_left: the steps of a prompt whose client left (or whose board never cooled: serve answers 503 and goes on)
    between them were taken for the first steps of the next request, one request with their times summed."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.thermal.plan import _StubDecoder
    from edgesdk.thermal.telemetry import Telemetry, summarize
    from tests.unit.test_prefill50 import PROFILE, thermal_hook

    telemetry = Telemetry(None, {"profile": PROFILE.name})
    thermal = thermal_hook(telemetry=telemetry)
    with pytest.raises(ConnectionAbortedError):
        generate(_StubDecoder(), [2] * 1500, SamplingConfig(max_new_tokens=4), set(), hook=LeavesAtStep(thermal, 3))
    left = [record for record in telemetry.records if record.get("kind") == "prefill"]
    assert [record["prompt_left"] for record in left] == [988, 735]
    generate(_StubDecoder(), [2] * 600, SamplingConfig(max_new_tokens=4), set(), hook=thermal)
    prefills = [record for record in telemetry.records if record.get("kind") == "prefill"]
    answered = prefills[len(left):]
    assert answered[-1]["prompt_left"] == 0
    summary = summarize(telemetry.records)
    assert summary.requests == 2  # before the fix: 1, the abandoned prompt's steps the answered one's first
    first = sum(record["duration_s"] + record["wait_s"] for record in answered)
    abandoned = sum(record["duration_s"] + record["wait_s"] for record in left)
    assert abandoned > 0
    assert summary.mean_ttft_s == pytest.approx(first)  # the abandoned prompt had no first token


def test_a_retry_the_prompt_cache_serves_is_a_request_of_its_own(backends_tiny):
    """The client leaves between its prompt's steps and sends it again: the prompt cache holds the steps that ran,
    so the retry's first step takes exactly what the abandoned prompt left; it is still a request of its own."""
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.prompt_cache import PromptCache
    from edgesdk.thermal.telemetry import Telemetry, summarize
    from tests.unit.test_prefill50 import PROFILE, thermal_hook

    backend = backends_tiny
    prompt = [int(token) for token in np.random.default_rng(3).integers(3, 300, 1000)]
    cache, telemetry = PromptCache(backend), Telemetry(None, {"profile": PROFILE.name})
    thermal = thermal_hook(telemetry=telemetry)
    with pytest.raises(ConnectionAbortedError):
        generate(backend, prompt, SamplingConfig(max_new_tokens=2), set(), hook=LeavesAtStep(thermal, 2), cache=cache)
    generate(backend, prompt, SamplingConfig(max_new_tokens=2), set(), hook=thermal, cache=cache)
    prefills = [record for record in telemetry.records if record.get("kind") == "prefill"]
    # the abandoned prompt's first step (512 tokens, llama.cpp's n_ubatch, before a prefill rate is learned), then
    # the retry's 488 in two steps (6.3 s at the simulated 40 tok/s): what the abandoned step left
    assert [(record["prompt_tokens"], record["prompt_left"], record["prompt_step"]) for record in prefills] == \
        [(512, 488, 1), (253, 235, 1), (235, 0, 2)]
    summary = summarize(telemetry.records)
    assert summary.requests == 2  # before the fix: 1, the retry's first-token time the abandoned step's too
    assert summary.mean_ttft_s == pytest.approx(  # the retry's alone: the abandoned prompt had no first token
        sum(record["duration_s"] + record["wait_s"] for record in prefills[1:]))


def test_a_client_gone_during_a_prompts_steps_stops_it_at_the_next_step(runtime):
    """serve asked whether the client was still there only while the guard held a step back and after each token:
    a client that left during a long prompt's prefill had every step of it run (minutes on a Pi) before the answer
    stopped. llama-server drops a cancelled task between its prompt's batches; the steps run stay in the cache."""
    from edgesdk.serve.api import parse_text_request
    from edgesdk.serve.completion import ClientGone
    from tests.unit.test_prefill50 import thermal_hook

    thermal = thermal_hook(prefill_tok_s=10.0)  # steps of 64 tokens (the floor) once a rate is learned
    completer = Completer(runtime, ServeDefaults(max_tokens=16), hook=thermal)
    words = " ".join(f"w{i}" for i in range(50))
    warm = completer.complete(parse_text_request({"prompt": words[:200], "max_tokens": 1, "temperature": 0}))
    assert warm.prompt_tokens >= 64
    assert thermal.guard.prefill_tok_s  # a rate learned from its one step
    asked = []

    def gone() -> bool:  # asked when the turn comes; the client leaves during the first prefill step
        asked.append(True)
        return len(asked) > 1

    body = {"prompt": words, "max_tokens": 4, "temperature": 0, "cache_prompt": False}
    with pytest.raises(ClientGone):
        completer.complete(parse_text_request(body), client_gone=gone)
    assert len(completer.prompt_cache.tokens) == 64  # before the fix: all of it
    assert runtime.backend.position == 64
    assert completer.metrics.finished["cancelled"] == 1
