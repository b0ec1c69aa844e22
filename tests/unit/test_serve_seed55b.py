"""``edgesdk serve -s/--seed N``: the seed of every request that sends none, as llama-server's ``-s`` is
(server-task.cpp ``params_from_json_cmpl`` reads ``seed`` with the server's for its default). A request's -1 (and
4294967295 on llama-server's and OpenAI's routes) is a random seed still, as llama-server's LLAMA_DEFAULT_SEED draws
one whatever its ``-s``; Ollama's ``options.seed`` -1 too. ``-s`` was refused for any fixed value before: ServeDefaults
had no seed."""

from __future__ import annotations

import json

import pytest

from edgesdk.serve.api import LLAMA_DEFAULT_SEED, parse_chat_request, parse_text_request
from edgesdk.serve.completion import Completer, ServeDefaults
from edgesdk.serve.ollama import parse_chat, parse_generate
from tests.unit.test_serve import Served
from tests.unit.test_serve_models42 import A, B, ask, bundles, serve_in_process  # noqa: F401 (bundles: a fixture)

PROMPT = "Once upon a time"
# a flat distribution (the tiny models repeat a token at temperature 1): two draws of 12 tokens do not meet
SAMPLED = {"prompt": PROMPT, "max_tokens": 12, "temperature": 2.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


@pytest.mark.parametrize("seed", [None, 0, 42, 2**40])
def test_serve_defaults_take_no_seed_or_a_whole_number(seed):
    assert ServeDefaults(seed=seed).seed == seed


@pytest.mark.parametrize("wrong", [-1, True, 1.5, "42"])
def test_serve_defaults_refuse_a_seed_that_is_no_whole_number_naming_it(wrong):
    with pytest.raises(ValueError, match=r"^seed must be None \(a random seed for each request\) or a whole number "
                                         r">= 0, got "):
        ServeDefaults(seed=wrong)


def test_a_request_without_a_seed_gets_the_server_s_and_one_asking_for_a_random_seed_a_random_one(runtime):
    completer = Completer(runtime, ServeDefaults(seed=42))
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    for parse, body in ((parse_chat_request, chat), (parse_text_request, {"prompt": "hi"})):
        assert completer.sampling(parse(body)).seed == 42
        assert completer.sampling(parse({**body, "seed": None})).seed == 42  # null: the default, as llama-server
        assert completer.sampling(parse({**body, "seed": 7})).seed == 7
        assert completer.sampling(parse({**body, "seed": -1})).seed is None
        assert completer.sampling(parse({**body, "seed": LLAMA_DEFAULT_SEED})).seed is None
    # without -s every request that sends no seed draws one, as before
    assert Completer(runtime, ServeDefaults()).sampling(parse_text_request({"prompt": "hi"})).seed is None


def test_ollama_routes_keep_their_seeds_under_a_server_seed(runtime):
    completer = Completer(runtime, ServeDefaults(seed=42))

    def seed_of(options):
        chat = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": options}, "m")
        text = parse_generate({"model": "m", "prompt": "hi", "raw": True, "options": options}, "m")
        seeds = {completer.sampling(chat.request).seed, completer.sampling(text.request).seed}
        assert len(seeds) == 1
        return seeds.pop()

    assert seed_of({}) == 42
    assert seed_of({"seed": -1}) is None  # Ollama's random seed
    assert seed_of({"seed": LLAMA_DEFAULT_SEED}) == LLAMA_DEFAULT_SEED  # fixed in Ollama's sampler
    assert seed_of({"seed": 5}) == 5


def test_the_server_seed_repeats_a_sampled_answer_and_a_request_s_minus_one_does_not_take_it(runtime):
    server = Served(runtime, ServeDefaults(max_tokens=12, seed=42))
    try:
        first = server.post("/v1/completions", SAMPLED)[1]["choices"][0]["text"]
        again = server.post("/v1/completions", SAMPLED)[1]["choices"][0]["text"]
        asked = server.post("/v1/completions", {**SAMPLED, "seed": 42})[1]["choices"][0]["text"]
        assert first == again == asked
        # llama-server's /completion shows the seed each answer sampled with
        status, native = server.post("/completion", {**SAMPLED, "n_predict": 2})
        assert status == 200, native
        assert native["generation_settings"]["seed"] == 42
        status, native = server.post("/completion", {**SAMPLED, "n_predict": 2, "seed": -1})
        assert native["generation_settings"]["seed"] == LLAMA_DEFAULT_SEED
        assert json.loads(server.request("GET", "/props")[2])["default_generation_settings"]["params"]["seed"] == 42
        # a request's -1 draws its own seed: of several such answers, some differ from the server seed's
        randoms = {server.post("/v1/completions", {**SAMPLED, "seed": -1})[1]["choices"][0]["text"] for _ in range(4)}
        assert randoms - {first}
    finally:
        server.close()


@pytest.mark.parametrize("given", [["-s", "42"], ["--seed", "42"], ["--seed=42"]])
def test_serve_s_gives_every_bundle_s_requests_its_seed(bundles, given):  # noqa: F811 (the fixture)
    """``serve A B -s 42``: both models' defaults hold the seed (the second's through _with_model_defaults)."""

    def check(port):
        shown = [ask(port, "GET", f"/props?model={name}")[1]["default_generation_settings"]["params"]["seed"]
                 for name in (A, B)]
        body = {**SAMPLED, "model": B, "n_predict": 6}
        answers = [ask(port, "POST", "/completion", body)[1] for _ in range(2)]
        return shown, [answer["generation_settings"]["seed"] for answer in answers], \
            answers[0]["content"] == answers[1]["content"]

    assert serve_in_process([*map(str, bundles), *given], check) == ([42, 42], [42, 42], True)


@pytest.mark.parametrize("seed", ["-1", "4294967295"])
def test_serve_s_minus_one_is_a_random_seed_for_each_request(bundles, seed):  # noqa: F811 (the fixture)
    shown = serve_in_process([str(bundles[0]), "-s", seed], lambda port: ask(port, "GET", "/props")[1])
    assert shown["default_generation_settings"]["params"]["seed"] == LLAMA_DEFAULT_SEED
