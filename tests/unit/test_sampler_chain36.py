"""The sampler chain in llama.cpp's order and its ``samplers`` list: each chain's distribution against llama.cpp's
own samplers on the same logits, the names and letters llama.cpp reads, samplers left out, and the constrained
draw where the chain kept no accepted token."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from edgesdk.runtime.generate import DEFAULT_SAMPLERS, Sampler, SamplingConfig, sampler_chain, shaped

DRAWS = 20_000


def _llama_cpp_distribution(logits: np.ndarray, config: SamplingConfig) -> np.ndarray:
    """The probabilities llama.cpp's samplers leave for ``logits``: its top-k / top-p / min-p / temperature
    samplers applied in ``config.samplers``' order to a candidate array, then softmax over what is left."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the reference for the chain")
    size = logits.shape[0]
    data = (llama_cpp.llama_token_data * size)()
    for token, logit in enumerate(logits):
        data[token].id, data[token].logit, data[token].p = token, float(logit), 0.0
    candidates = llama_cpp.llama_token_data_array(data=data, size=size, selected=-1, sorted=False)
    make = {"top_k": lambda: llama_cpp.llama_sampler_init_top_k(config.top_k),
            "top_p": lambda: llama_cpp.llama_sampler_init_top_p(config.top_p, 1),
            "min_p": lambda: llama_cpp.llama_sampler_init_min_p(config.min_p, 1),
            "temperature": lambda: llama_cpp.llama_sampler_init_temp(config.temperature)}
    for name in config.samplers:
        if name == "penalties":
            continue  # the logits here carry no context
        sampler = make[name]()
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(candidates))
        llama_cpp.llama_sampler_free(sampler)
    kept = np.full(size, -np.inf)
    for i in range(candidates.size):
        kept[candidates.data[i].id] = candidates.data[i].logit
    probs = np.exp(kept - kept.max())
    return probs / probs.sum()


@pytest.mark.parametrize("samplers", [DEFAULT_SAMPLERS, "kpmt", "ktpm", "tpkm", "pt", "mt", "tm", "kp"])
def test_each_chain_keeps_what_llama_cpp_keeps_at_its_odds(samplers):
    config = SamplingConfig(temperature=0.6, top_k=40, top_p=0.8, min_p=0.05, samplers=samplers)
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(30):
        logits = (rng.standard_normal(300) * 2.5).astype(np.float32)
        ours = Sampler(config)._distribution(logits, int(np.argmax(logits)))
        theirs = _llama_cpp_distribution(logits, config)
        assert set(np.flatnonzero(ours)) == set(np.flatnonzero(theirs))
        worst = max(worst, float(np.abs(ours - theirs).max()))
    print(f"chain {' > '.join(config.samplers)}: max |p - p_llama.cpp| {worst:.2e}")
    assert worst < 1e-5


def test_the_default_chain_takes_top_p_before_the_temperature():
    """A cold temperature sharpens the distribution: before it, top-p keeps more tokens than after it."""
    logits = np.array([2.0, 1.8, 1.6, 1.4, 1.2, 0.0], np.float32)
    llama_order = Sampler(SamplingConfig(temperature=0.3, top_p=0.7))._distribution(logits, 0)
    temperature_first = Sampler(SamplingConfig(temperature=0.3, top_p=0.7, samplers="tp"))._distribution(logits, 0)
    assert np.count_nonzero(llama_order) == 4  # softmax of the logits as they are: 0.27, 0.22, 0.18, 0.15 ...
    assert np.count_nonzero(temperature_first) == 2  # at 0.3: 0.52, 0.27 ...


def test_a_chain_without_the_temperature_draws_at_temperature_one():
    logits = np.array([1.0, 0.5, 0.0, -0.5], np.float32)
    without = Sampler(SamplingConfig(temperature=0.2, samplers=["top_k"]))._distribution(logits, 0)
    probs = np.exp(logits.astype(np.float64))
    np.testing.assert_allclose(without, probs / probs.sum(), rtol=1e-12)


def test_a_chain_without_penalties_applies_none():
    logits = np.array([3.0, 2.0, 1.0], np.float32)
    context = [0, 0, 0]
    with_penalties = SamplingConfig(temperature=1.0, repeat_penalty=2.0, presence_penalty=1.0)
    without = SamplingConfig(temperature=1.0, repeat_penalty=2.0, presence_penalty=1.0, samplers="kpmt")
    assert shaped(logits, context, with_penalties)[0] == pytest.approx(0.5)  # 3 / 2 - 1
    np.testing.assert_array_equal(shaped(logits, context, without), logits)
    assert Sampler(SamplingConfig(samplers="kpmt"))(shaped(logits, context, without)) == 0


@pytest.mark.parametrize(("given", "chain"), [
    ("edskypmxt", ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")),
    (["Top-K", "nucleus", "minp", "temp"], ("top_k", "top_p", "min_p", "temperature")),
    (["typ", "TOP_N_SIGMA", "xtc"], ("typ_p", "top_n_sigma", "xtc")),
    (["typical", "Typical-P", "typ-p"], ("typ_p", "typ_p", "typ_p")),
    ("", ()),
    ([], ()),
])
def test_names_and_letters_read_as_llama_cpp_reads_them(given, chain):
    assert sampler_chain(given) == chain


@pytest.mark.parametrize(("given", "shown"), [
    (["top_k", "bogus"], "'bogus', which is no sampler"),
    (["adaptive_p"], "'adaptive_p', which is llama.cpp's but not carried"),
    ("kpz", "'z', which is no sampler letter"),
    ("ka", "'a', which is llama.cpp's adaptive_p, not carried"),
    (["top_k", 3], "sampler names (strings), got 3"),
    (7, "a list of sampler names or a string of sampler letters, got 7"),
])
def test_a_bad_chain_is_refused_by_name(given, shown):
    with pytest.raises(ValueError, match="samplers") as caught:
        SamplingConfig(samplers=given)
    assert shown in str(caught.value)


def test_pass_through_samplers_change_nothing():
    logits = (np.random.default_rng(3).standard_normal(200) * 2).astype(np.float32)
    plain = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02)
    llama_default = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, samplers="edskypmxt")
    best = int(np.argmax(logits))
    np.testing.assert_array_equal(Sampler(plain)._distribution(logits, best),
                                  Sampler(llama_default)._distribution(logits, best))


def test_where_the_chain_keeps_no_accepted_token_it_runs_again_over_the_accepted_ones():
    """top-k 2 keeps tokens 0 and 1, which the constraint refuses: as llama.cpp resamples with the grammar
    applied first, the draw is top-k 2 over the accepted tokens (5 and 6 at their temperature odds), not the
    most likely accepted token every time."""
    logits = np.array([5.0, 4.0, -9.0, -9.0, -9.0, 1.0, 0.5, 0.0], np.float32)
    accepted = {5, 6, 7}
    sampler = Sampler(SamplingConfig(temperature=0.9, top_k=2, seed=4))
    counts = np.zeros(logits.shape[0])
    for _ in range(DRAWS // 4):
        counts[sampler(logits, lambda token: token in accepted)] += 1
    freq = counts / counts.sum()
    assert set(np.flatnonzero(freq)) == {5, 6}
    expected = np.exp(np.array([1.0, 0.5]) / 0.9)
    expected /= expected.sum()
    assert abs(freq[5] - expected[0]) < 0.03, (freq[5], expected[0])


def _answer(runtime, config: SamplingConfig) -> list[int]:
    from edgesdk.runtime.generate import generate

    ids = runtime.tokenizer.encode("hello")
    tokens, _ = generate(runtime.backend, ids, config, stop_ids=set(runtime.tokenizer.eos_token_ids))
    return [token for token in tokens if token not in runtime.tokenizer.eos_token_ids]


def test_run_takes_llama_cpp_s_samplers_and_sampling_seq(tiny_bundle, runtime):
    """``--samplers`` (names split by ';') and ``--sampling-seq`` (letters) reach the sampler: the answer equals
    generate's with that chain, and a chain of top-k 1 alone at temperature 1 is the greedy answer."""
    from tests.unit.test_cli import assert_ok, invoke

    base = ("run", tiny_bundle.path, "--prompt", "hello", "--raw", "-n", 10, "--threads", 1)
    greedy = invoke(*base)
    assert_ok(greedy)
    top_one = invoke(*base, "--temperature", 1.0, "--top-k", 1, "--seed", 5, "--samplers", "top_k;temperature")
    assert_ok(top_one)
    assert top_one.stdout == greedy.stdout
    for options, chain in ((("--samplers", "temperature;top-p"), ("temperature", "top_p")),
                           (("--sampling-seq", "tp"), ("temperature", "top_p"))):
        result = invoke(*base, "--temperature", 0.7, "--top-p", 0.5, "--seed", 9, *options)
        assert_ok(result)
        config = SamplingConfig(max_new_tokens=10, temperature=0.7, top_p=0.5, seed=9, samplers=chain)
        assert result.stdout == runtime.tokenizer.decode(_answer(runtime, config)) + "\n", options
    # a name llama.cpp does not know is left out with a warning, as common_sampler_types_from_names leaves it out
    unknown = invoke(*base, "--samplers", "top_k;bogus")
    assert_ok(unknown)
    assert "--samplers: 'bogus': no sampler llama.cpp knows by name" in unknown.stderr
    both = invoke(*base, "--samplers", "top_k", "--sampling-seq", "k")
    assert both.exit_code == 2
    assert "pass one" in both.output


def test_serve_takes_llama_server_s_samplers_on_every_route(runtime):
    """``samplers`` as names or letters on /v1/completions, /v1/chat/completions and /completion gives the answer
    generate gives with that chain; a bad one is a 400 naming the field; /props and /completion's
    generation_settings report the chain; the server's own chain comes from ServeDefaults."""
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    config = SamplingConfig(max_new_tokens=8, temperature=0.7, top_p=0.5, seed=3, samplers=("temperature", "top_p"))
    expected = runtime.tokenizer.decode(_answer(runtime, config))
    sampled = {"temperature": 0.7, "top_p": 0.5, "seed": 3, "max_tokens": 8}
    server = Served(runtime, ServeDefaults(max_tokens=8, samplers="kt"))
    try:
        for chain in (["temperature", "top_p"], "tp", ["Temp", "nucleus"]):
            status, answer = server.post("/v1/completions", {"prompt": "hello", **sampled, "samplers": chain})
            assert status == 200, answer
            assert answer["choices"][0]["text"] == expected, chain
        status, native = server.post("/completion", {"prompt": "hello", "temperature": 0.7, "top_p": 0.5, "seed": 3,
                                                     "n_predict": 8, "samplers": "tp"})
        assert status == 200, native
        assert native["generation_settings"]["samplers"] == ["temperature", "top_p"]
        status, chat = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                            **sampled, "samplers": "edskypmxt"})
        assert status == 200, chat
        # a name llama.cpp does not know is left out with a warning, adaptive_p without a target is off
        # (tests/unit/test_api51.py); what is no list of names is refused
        for bad in (5, ["top_k", 3], {"top_k": 1}):
            status, answer = server.post("/v1/completions", {"prompt": "hello", "samplers": bad})
            assert (status, answer["error"]["param"]) == (400, "samplers"), answer
            assert "'samplers'" in answer["error"]["message"]
        status, _, payload = server.request("GET", "/props")
        assert status == 200
        props = json.loads(payload)
        assert props["default_generation_settings"]["params"]["samplers"] == ["top_k", "temperature"]
        status, answer = server.post("/completion", {"prompt": "hello", "n_predict": 2, "samplers": None})
        assert answer["generation_settings"]["samplers"] == ["top_k", "temperature"]
    finally:
        server.close()


def test_serve_takes_the_chain_from_its_options(tiny_bundle):
    from tests.unit.test_cli import invoke

    both = invoke("serve", tiny_bundle.path, "--samplers", "top_k", "--sampling-seq", "k", "--port", 0)
    assert both.exit_code == 2
    assert "pass one" in both.output
    # an unknown letter is left out with a warning; the empty --host then stops serve before it listens
    unknown = invoke("serve", tiny_bundle.path, "--sampling-seq", "kq", "--host", "", "--port", 0)
    assert unknown.exit_code == 2
    assert "--sampling-seq: 'q'" in unknown.output
    assert "'--host'" in unknown.output
    empty = invoke("serve", tiny_bundle.path, "--model-name", " ", "--port", 0)
    assert empty.exit_code == 2
    assert "'--model-name'" in empty.output
    assert "is empty" in empty.output


def test_llama_cli_s_short_names_work(tiny_bundle, runtime):
    """A llama-cli command line (``--temp``, ``-s``, ``-t``, ``-sys`` / ``--system-prompt``) gives the answer the long
    names give."""
    from tests.unit.test_cli import assert_ok, invoke

    long = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 8, "--temperature", 0.9, "--seed", 4,
                  "--threads", 1, "--system", "Be brief.")
    short = invoke("run", tiny_bundle.path, "-p", "hello", "-n", 8, "--temp", 0.9, "-s", 4, "-t", 1,
                   "-sys", "Be brief.")
    prompt = invoke("run", tiny_bundle.path, "-p", "hello", "-n", 8, "--temp", 0.9, "-s", 4, "-t", 1,
                    "--system-prompt", "Be brief.")
    assert_ok(long)
    assert_ok(short)
    assert_ok(prompt)
    assert long.stdout == short.stdout == prompt.stdout
    alias = invoke("serve", tiny_bundle.path, "--alias", " ", "--port", 0)  # llama-server's name for --model-name
    assert alias.exit_code == 2
    assert "is empty" in alias.output
