"""The penalties past float32's range, and the -n and -s rules that run, serve and load() share: a huge presence or
frequency penalty saturates a logit at float32's largest (a certainty or all but a ban) rather than make it infinite;
-n takes any number below 0 as no limit, -s wraps a number below 0 to llama.cpp's 32 bits, in every one of them."""

from __future__ import annotations

import math

import click
import numpy as np
import pytest

from edgesdk.api_checks import check_load_arguments, serve_settings
from edgesdk.cli_options import LLAMA_SEED, llama_seed, token_limit
from edgesdk.errors import EdgeSDKError
from edgesdk.runtime.generate import Sampler, SamplingConfig, penalized, shaped
from edgesdk.serve import completion
from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS
from edgesdk.serve.ollama import parse_chat, parse_generate
from tests.unit.test_cli import assert_ok, invoke

FLOAT32_MAX = float(np.finfo(np.float32).max)

# ------------------------------------------------------------------------------------------------ penalties


@pytest.mark.parametrize(("fields", "seen", "expected"), [
    ({"presence_penalty": -1e39}, [1, 2], FLOAT32_MAX),
    ({"presence_penalty": 1e39}, [1, 2], -FLOAT32_MAX),
    ({"frequency_penalty": -1e38}, [1] * 10 + [2] * 10, FLOAT32_MAX),
    ({"frequency_penalty": -1e308, "presence_penalty": -1e308}, [1, 1, 2, 2], FLOAT32_MAX),
    ({"repeat_penalty": 1e-45}, [1, 2], FLOAT32_MAX),
])
def test_a_penalty_past_float32_saturates_the_logit(fields, seen, expected):
    out = penalized(np.array([0.5, 1.0, 2.0, -1.0], np.float32), seen, SamplingConfig(**fields))
    assert out.dtype == np.float32
    assert np.isfinite(out).all()
    assert out[1] == out[2] == np.float32(expected)
    assert out[0] == np.float32(0.5)
    assert out[3] == np.float32(-1.0)


def test_a_banned_token_stays_banned_under_a_huge_penalty():
    """A logit bias of -inf bans the token: the penalty's saturation does not bring it back."""
    config = SamplingConfig(frequency_penalty=-1e39, presence_penalty=-1e39, logit_bias={1: -math.inf})
    logits = np.array([0.5, 1.0, 2.0], np.float32)
    logits[1] = -np.inf
    out = penalized(logits, [1, 2], config)
    assert out[1] == -np.inf
    assert out[2] == np.float32(FLOAT32_MAX)


@pytest.mark.parametrize("samplers", [None, ("top_k", "temperature", "penalties")])
def test_a_huge_negative_penalty_is_a_certainty_when_sampled(samplers):
    """Sampled, with the penalties first (shaped) or inside the chain: the seen token is drawn, no error."""
    config = SamplingConfig(temperature=1.0, presence_penalty=-1e39, seed=3,
                            **({"samplers": samplers} if samplers else {}))
    sampler = Sampler(config)
    logits = np.array([5.0, 1.0, 4.0], np.float32)
    assert {sampler(shaped(logits, [1], config), context=[1]) for _ in range(20)} == {1}


def test_run_takes_a_presence_penalty_past_float32(tiny_bundle):
    """It answered "the backend returned logits that are not finite ... rebuild it", blaming the bundle."""
    args = ("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "6", "--ignore-eos")
    for extra in (("--presence-penalty", "-1e39"), ("--frequency-penalty", "-1e38"),
                  ("--presence-penalty", "1e39", "--temp", "1.5", "-s", "5")):
        result = invoke(*args, *extra)
        assert_ok(result)
        assert "not finite" not in result.output


def test_ollama_takes_a_presence_penalty_past_float32(served):
    for options in ({"presence_penalty": -1e39, "num_predict": 4},
                    {"frequency_penalty": -1e38, "num_predict": 6, "temperature": 0}):
        chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": options},
                          "m").request
        assert served.completer.complete(chat).completion_tokens >= 1
        generated = parse_generate({"model": "m", "prompt": "The quick", "raw": True, "options": options},
                                   "m").request
        assert served.completer.complete(generated).completion_tokens >= 1


# ------------------------------------------------------------------------------------------------ -n


@pytest.mark.parametrize(("given", "limit"), [(-1, 2**31 - 1), (-2, 2**31 - 1), (-3, 2**31 - 1),
                                              (-(2**40), 2**31 - 1), (1, 1), (300, 300)])
def test_token_limit_reads_any_negative_as_no_limit(given, limit):
    assert token_limit(given, "") == limit == (UNTIL_THE_CONTEXT_FILLS if given < 0 else given)


def test_token_limit_refuses_zero_naming_the_option():
    with pytest.raises(click.BadParameter) as caught:
        token_limit(0, "-1 for no limit")
    assert "is 0" in caught.value.format_message()
    assert "-1 for no limit" in caught.value.format_message()


class _Recorded(completion.ServeDefaults):
    """ServeDefaults as serve builds them, kept for the test to read."""

    made: list = []

    def __post_init__(self):
        super().__post_init__()
        _Recorded.made.append(self)


@pytest.fixture
def serve_defaults(monkeypatch):
    _Recorded.made = []
    monkeypatch.setattr(completion, "ServeDefaults", _Recorded)
    return _Recorded.made


@pytest.mark.parametrize("given", ["-1", "-2", "-3", "-100"])
def test_serve_n_takes_any_negative_as_no_limit(serve_defaults, given):
    result = invoke("serve", "no-such-bundle", "-n", given)
    assert "'--max-new-tokens'" not in result.output
    assert [made.max_tokens for made in serve_defaults] == [UNTIL_THE_CONTEXT_FILLS]


def test_serve_n_zero_is_refused(serve_defaults):
    result = invoke("serve", "no-such-bundle", "-n", "0")
    assert result.exit_code == 2
    assert "is 0" in result.output
    assert "below 0" in result.output


@pytest.mark.parametrize(("given", "seed"), [("-2", 4294967294), ("-4294967296", 0), ("-1", None),
                                             ("-4294967297", None), ("4294967295", None), (str(2**40), 2**40)])
def test_serve_seed_is_what_llama_server_makes_of_it(serve_defaults, given, seed):
    invoke("serve", "no-such-bundle", "-s", given)
    assert [made.seed for made in serve_defaults] == [seed]


# ------------------------------------------------------------------------------------------------ -s


@pytest.mark.parametrize(("given", "seed"), [(-1, 4294967295), (-2, 4294967294), (-(2**64 - 1), 1),
                                             (2**64 - 1, 2**64 - 1), (0, 0)])
def test_llama_seed_wraps_below_zero(given, seed):
    assert llama_seed(given) == seed == LLAMA_SEED.convert(str(given), None, None)


@pytest.mark.parametrize("given", [2**64, -(2**64), 10**30])
def test_a_seed_past_stoul_is_refused_either_way(given):
    """std::stoul refuses a number past an unsigned long's range, above as below."""
    with pytest.raises(ValueError, match="std::stoul"):
        llama_seed(given)
    with pytest.raises(click.BadParameter) as caught:
        LLAMA_SEED.convert(str(given), None, None)
    assert str(given) in caught.value.format_message()
    assert "random" in caught.value.format_message()


def test_seed_help_says_what_the_wrap_makes_random():
    for command in ("run", "serve"):
        help_text = " ".join(invoke(command, "--help").output.split())
        assert "-4294967297" in help_text
        assert "2**32" in help_text


# ------------------------------------------------------------------------------------------------ load()


def _checked(**settings):
    check_load_arguments("bundle", None, None, None, False, False, settings)
    return serve_settings(settings)


@pytest.mark.parametrize(("given", "seed"), [(-2, 4294967294), (-4294967296, 0), (-4294967297, None), (-1, None),
                                             (4294967295, None), (7, 7), (2**40, 2**40)])
def test_load_reads_a_seed_as_serve_s(given, seed):
    assert _checked(seed=given)["seed"] == seed


@pytest.mark.parametrize("given", [-1, -2, -3, -(2**40)])
def test_load_reads_any_negative_limit_as_no_limit(given):
    assert _checked(max_tokens=given)["max_tokens"] == UNTIL_THE_CONTEXT_FILLS


@pytest.mark.parametrize(("name", "value"), [("seed", 2**64), ("seed", -(2**64)), ("max_tokens", 0)])
def test_load_refuses_what_serve_refuses(name, value):
    with pytest.raises(EdgeSDKError) as caught:
        _checked(**{name: value})
    assert f"{name}={value}" in str(caught.value)
