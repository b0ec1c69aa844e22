"""llama.cpp and Ollama read these values so, and so does edgesdk: run's -n below -2 (llama-cli's infinity) and -s
below -1 (std::stoul's 32-bit wrap: a fixed seed), Ollama's presence and frequency penalties past OpenAI's [-2, 2],
and a reasoning block whose answer ended at its end of generation inside ``</think>`` (the tag's start kept)."""

from __future__ import annotations

import math

import click
import pytest

from edgesdk.cli_options import LLAMA_SEED
from edgesdk.runtime.generate import SamplingConfig
from edgesdk.serve.api import ApiError, parse_chat_request
from edgesdk.serve.completion import Completion
from edgesdk.serve.ollama import parse_chat, parse_generate
from edgesdk.serve.openai_answer import whole_answer
from edgesdk.serve.reasoning import ReasoningSplitter, split_answer
from tests.unit.test_cli import assert_ok, invoke
from tests.unit.test_cli_run47 import _stats

# ------------------------------------------------------------------------------------------------ run -n and -s


def test_run_n_below_minus_two_runs_as_minus_one(tiny_bundle):
    """tools/main/main.cpp counts ``n_remain`` down from -n and stops where it reaches 0, which -5 never does: the
    answer runs to the full context, as -1's."""
    args = ("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats")
    five, one = invoke(*args, "-n", "-5"), invoke(*args, "-n", "-1")
    assert_ok(five)
    assert_ok(one)
    assert _stats(five.stderr)["stop"] == "max_context"
    assert five.stdout == one.stdout


def test_run_n_zero_in_a_chat_is_still_refused_naming_the_negative_limits():
    result = invoke("run", "no-such-bundle", "-p", "hi", "-cnv", "-n", "0")
    assert result.exit_code == 2
    assert "any number below 0 but -2" in result.output


@pytest.mark.parametrize(("given", "seed"), [("-1", 4294967295), ("-2", 4294967294), ("-4294967296", 0),
                                             ("-4294967297", 4294967295), ("7", 7), (str(2**40), 2**40)])
def test_seed_reads_as_llama_cpps_stoul(given, seed):
    """common/arg.cpp: ``params.sampling.seed = std::stoul(value)``, a uint32_t: a number below 0 wraps."""
    assert LLAMA_SEED.convert(given, None, None) == seed


@pytest.mark.parametrize("given", [str(-2**64), "x", "1.5"])
def test_seed_past_stoul_or_not_a_number_is_refused_by_name(given):
    with pytest.raises(click.BadParameter) as caught:
        LLAMA_SEED.convert(given, None, None)
    assert given in str(caught.value)
    assert "random" in str(caught.value)


def test_run_seed_below_minus_one_is_a_fixed_seed(tiny_bundle):
    """-s -2 is the fixed seed 4294967294 (not a random one): the same sampled answer each time."""
    args = ("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "12", "--temp", "1.5", "--ignore-eos")
    first, again, wrapped = invoke(*args, "-s", "-2"), invoke(*args, "-s", "-2"), invoke(*args, "-s", "4294967294")
    for result in (first, again, wrapped):
        assert_ok(result)
    assert first.stdout == again.stdout == wrapped.stdout


# ------------------------------------------------------------------------------------------------ Ollama penalties


def _ollama_chat(options: dict):
    return parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": options}, "m")


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [5, -3.5, 2.0, -0.5])
def test_ollama_takes_any_finite_penalty(name, value):
    request = _ollama_chat({name: value}).request
    assert getattr(request, name) == value
    generated = parse_generate({"model": "m", "prompt": "hi", "raw": True, "options": {name: value}}, "m").request
    assert getattr(generated, name) == value


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1", True, 10**400])
def test_ollama_refuses_a_penalty_that_is_no_finite_number(name, value):
    with pytest.raises(ApiError) as caught:
        _ollama_chat({name: value})
    assert caught.value.status == 400
    assert caught.value.param == f"options.{name}"
    assert "finite number" in caught.value.message


def test_ollama_repeat_penalty_any_finite_number():
    assert _ollama_chat({"repeat_penalty": 7.5}).request.repeat_penalty == 7.5
    assert _ollama_chat({"repeat_penalty": -3}).request.repeat_penalty == 1.0  # NewSampler: <= 0 is off


def test_openai_route_keeps_its_range_and_the_sampler_takes_any_finite():
    with pytest.raises(ApiError) as caught:
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 2.5})
    assert caught.value.param == "presence_penalty"
    assert "[-2, 2]" in caught.value.message
    assert SamplingConfig(presence_penalty=5.0, frequency_penalty=-7.0).frequency_penalty == -7.0
    with pytest.raises(ValueError, match="presence_penalty must be a finite number"):
        SamplingConfig(presence_penalty=math.nan)


def test_ollama_strong_penalty_generates(served):
    """The request reaches the sampler: a penalty past [-2, 2] answers (SamplingConfig refused it before)."""
    request = _ollama_chat({"presence_penalty": 5, "frequency_penalty": -4, "num_predict": 4}).request
    completion = served.completer.complete(request)
    assert completion.completion_tokens >= 1
    assert served.completer.sampling(request).presence_penalty == 5.0


# ------------------------------------------------------------------------------------------------ a cut </think>


@pytest.mark.parametrize(("closed", "reasoning"), [(True, "abc</thi"), (False, "abc"), (None, "abc")])
def test_a_block_ended_inside_its_closing_tag(closed, reasoning):
    """common/chat-parser.cpp's ``try_find_literal`` reads a trailing prefix of ``</think>`` as the tag in a partial
    answer alone: one ended at end-of-generation keeps it in its reasoning. Not told (Ollama's parser), it is held
    back and dropped."""
    assert split_answer(ReasoningSplitter(), "<think>abc</thi", closed=closed) == (reasoning, "")
    streamed = ReasoningSplitter()
    pieces = [streamed.push(text) for text in ("<think>ab", "c </t", "hi")] + [streamed.flush(closed)]
    assert "".join(part for part, _ in pieces) == reasoning.replace("abc", "abc " if closed else "abc")
    assert "".join(text for _, text in pieces) == ""


def test_a_legacy_stream_ended_inside_the_tag_keeps_it_and_closes():
    splitter = ReasoningSplitter(inline=True)
    content = splitter.push("<think>abc</th")[1] + splitter.flush(closed=True)[1]
    assert content == "<think>abc</th</think>"
    cut = ReasoningSplitter(inline=True)
    assert cut.push("<think>abc</th")[1] + cut.flush(closed=False)[1] == "<think>abc</think>"


@pytest.mark.parametrize(("finish", "stop", "reasoning"), [("stop", None, "fox</thi"), ("length", None, "fox"),
                                                           ("stop", "STOP", "fox")])
def test_a_whole_openai_answer_keeps_the_tag_start_at_end_of_generation(terse, finish, stop, reasoning):
    request = parse_chat_request({"messages": [{"role": "user", "content": "hi"}]})
    completion = Completion("fox</thi", finish, 3, 5, stop_string=stop)  # the template opened the block
    body = whole_answer(terse.completer, request, "m", completion)
    assert body["choices"][0]["message"].get("reasoning_content") == reasoning
