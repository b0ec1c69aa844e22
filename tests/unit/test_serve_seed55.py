"""Ollama's whole-number options (``num_ctx``, ``num_predict``, ``seed``, ``top_k``, ...) given as a fraction
(edgesdk/serve/ollama.py ``_as_ollama_reads``): Ollama's ``Options.FromMap`` (api/types.go) sets an int option from
the JSON's float64 with ``field.SetInt(int64(t))``, which cuts the fraction off toward 0, so ``num_ctx`` 4096.5 is
4096 and 0.5 is 0 (then 4, sched.go's floor). Here a fraction was 400 above the clamps' floors and taken below them:
``num_ctx`` 3.5 and 0.5 were 4, 4.5 and 4096.5 a 400 "must be ... a whole number"; ``num_predict`` -0.5 and 0.5
(Ollama: 0, no limit), ``top_k`` 2.5 and ``seed`` 1.5 were 400s too, while ``top_k`` -0.5 was taken.

And ``edgesdk serve -s SEED`` (below)."""

from __future__ import annotations

import pytest

from edgesdk.serve.api import UNTIL_THE_CONTEXT_FILLS, ApiError
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.ollama import parse_chat, parse_embed, parse_generate, windowed

NAME = "tiny-host"
HI = [{"role": "user", "content": "Hi"}]


def _chat(options: dict):
    return parse_chat({"model": NAME, "messages": HI, "options": options}, NAME)


@pytest.mark.parametrize(("num_ctx", "read"), [(4.5, 4), (4096.5, 4096), (40.99, 40), (3.5, 4), (0.5, 4),
                                                (-0.5, 4)])
def test_a_fractional_num_ctx_is_its_whole_part_as_ollama_s_options_decode_it(num_ctx, read):
    body = {"model": NAME, "options": {"num_ctx": num_ctx}}
    chat = parse_chat({**body, "messages": HI}, NAME)
    generate = parse_generate({**body, "prompt": "Hi", "raw": True}, NAME)
    embed = parse_embed({**body, "input": "a"}, NAME)
    assert chat.num_ctx == generate.num_ctx == embed.num_ctx == read


@pytest.mark.parametrize(("options", "field", "read"), [
    ({"num_predict": 6.5}, "max_tokens", 6),
    ({"num_predict": 0.5}, "max_tokens", UNTIL_THE_CONTEXT_FILLS),  # int64(0.5) is 0: no limit in Ollama's runner
    ({"num_predict": -0.5}, "max_tokens", UNTIL_THE_CONTEXT_FILLS),
    ({"seed": 3.9}, "seed", 3),
    ({"top_k": 2.5}, "top_k", 2),
    ({"repeat_last_n": 8.5}, "repeat_last_n", 8),
])
def test_other_whole_number_options_given_a_fraction_are_their_whole_part(options, field, read):
    assert getattr(_chat(options).request, field) == read


def test_a_fractional_num_keep_is_its_whole_part():
    assert _chat({"num_keep": 2.5}).num_keep == 2


@pytest.mark.parametrize("wrong", ["4096", True, [4], float("inf")])
def test_a_num_ctx_that_is_no_number_is_still_refused_naming_it(wrong):
    with pytest.raises(ApiError) as caught:
        _chat({"num_ctx": wrong})
    assert caught.value.param == "options.num_ctx"
    assert caught.value.status == 400


def test_a_fractional_num_ctx_bounds_the_answer_as_its_whole_part_does(runtime):
    completer = Completer(runtime, ServeDefaults(max_tokens=16))
    messages = [{"role": "user", "content": f"Question {turn} about cats and dogs?"} for turn in range(6)]

    def run(num_ctx):
        asked = parse_chat({"model": NAME, "messages": messages, "options": {"num_ctx": num_ctx}, "shift": False},
                           NAME)
        return windowed(completer, asked)

    whole, fraction = run(40), run(40.5)
    assert 1 <= len(fraction.messages) < len(messages)  # the oldest dropped to fit 40 tokens
    assert fraction.messages == whole.messages
    assert fraction.max_tokens == whole.max_tokens
    assert len(completer.prompt_ids(fraction)) < 40


# ``edgesdk serve -s SEED`` (edgesdk/cli_serve.py): llama-server's -s / --seed, the seed of a request that sends
# none, was click's bare "No such option '-s'"; -1 (4294967295 once read), its default, draws a random seed for each
# request, and a fixed seed is every such request's (tests/unit/test_serve_seed55b.py)


@pytest.mark.parametrize("args", [["-s", "42"], ["--seed", "0"], ["--seed=7"]])
def test_serve_s_with_a_fixed_seed_is_taken(tmp_path, args):
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["serve", str(tmp_path / "missing"), *args])
    # past the options: the missing bundle is what stops it
    assert "--seed" not in result.output
    assert "No such option" not in result.output
    assert "does not exist" in result.output


@pytest.mark.parametrize("seed", ["-1", "4294967295"])
def test_serve_s_with_llama_server_s_random_seed_is_taken(tmp_path, seed):
    from click.testing import CliRunner

    from edgesdk.cli import main

    result = CliRunner().invoke(main, ["serve", str(tmp_path / "missing"), "-s", seed])
    # past the options: the missing bundle is what stops it
    assert "--seed" not in result.output
    assert "No such option" not in result.output
    assert "does not exist" in result.output
