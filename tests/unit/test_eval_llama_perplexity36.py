"""``edgesdk eval --method llama-perplexity``: the figure llama.cpp's llama-perplexity prints (its perplexity() in
tools/perplexity/perplexity.cpp): the text tokenized once with BOS in front where the vocabulary adds one, cut into
len(tokens) // n_ctx chunks (the tail dropped), each chunk's first token made BOS, the logits at positions
n_ctx/2 .. n_ctx-2 of each chunk scored against the tokens after them. Checked against a hand computation from the
bundle's own full-window logits and, where llama-cpp-python is installed, against llama.cpp's logits for the
bundle exported to GGUF."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from tests._utils.builds import build_tiny_bundle
from tests._utils.tiny import CORPUS
from tests.unit.test_cli import assert_error, assert_ok, invoke

torch = pytest.importorskip("torch")

LLAMA_CPP_MISSING = "llama-cpp-python is not installed (pip install llama-cpp-python, which compiles llama.cpp)"
RECIPE = "name: r\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
TEXT = " ".join(CORPUS[:12])  # a few hundred tokens: several chunks of 32 and a tail
CONTEXT = 32


@pytest.fixture(scope="module")
def bos_bundle(tmp_path_factory):
    """A float32 bundle of a tiny Llama with Llama 2's kind of tokenizer, which puts BOS (<s>, id 1) in front of a
    text, as llama.cpp's vocabulary for it does (add_bos_token)."""
    from tests._utils.tiny import tiny_llama, tiny_llama2_tokenizer

    root = tmp_path_factory.mktemp("bos-llama")
    tokenizer = tiny_llama2_tokenizer()
    model_dir = root / "model"
    tiny_llama(vocab_size=len(tokenizer) + 3).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return build_tiny_bundle(root, RECIPE, "host", model_dir=model_dir), root


@pytest.fixture(scope="module")
def bos_runtime(bos_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(bos_bundle[0].path, threads=1)


def _llama_perplexity_by_hand(logits_of, tokens: list[int], n_ctx: int, bos: int | None):
    """llama-perplexity's loop written out: (perplexity, tokens scored, chunks)."""
    nll, count, chunks = 0.0, 0, len(tokens) // n_ctx
    first = n_ctx // 2
    for i in range(chunks):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        if bos is not None:
            chunk[0] = bos
        logits = np.asarray(logits_of(chunk), np.float64)
        for j in range(first, n_ctx - 1):  # logits at j predict token j + 1
            row = logits[j]
            peak = row.max()
            nll += peak + math.log(np.exp(row - peak).sum()) - row[chunk[j + 1]]
            count += 1
    return math.exp(nll / count), count, chunks


def test_the_chunks_are_whole_the_tail_dropped_and_the_second_half_scored():
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, windows

    config = PerplexityConfig(context=32, stride=32, method=LLAMA_PERPLEXITY)
    assert windows(list(range(100)), config) == [(0, 32, 17), (32, 64, 17), (64, 96, 17)]  # 4 tokens dropped
    odd = PerplexityConfig(context=33, stride=33, method=LLAMA_PERPLEXITY)
    assert windows(list(range(66)), odd) == [(0, 33, 17), (33, 66, 17)]  # first = 33 / 2 = 16: 16 scored a chunk


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"context": 32, "stride": 16}, "no stride"),
    ({"context": 2, "stride": 2}, "needs context >= 3"),
    ({"context": 32, "stride": 32, "method": "sliding"}, "method must be one of windows, llama-perplexity"),
])
def test_settings_llama_perplexity_has_no_meaning_for_are_refused(kwargs, fragment):
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig

    with pytest.raises(ValueError, match=fragment):
        PerplexityConfig(**{"method": LLAMA_PERPLEXITY, **kwargs})


def test_the_bundle_s_figure_is_llama_perplexity_s_rule_on_its_own_logits(bos_runtime, runtime):
    """With BOS (the Llama 2 tokenizer) and without (the byte-level one), the figure is the hand computation's
    from the runtime's full-window logits; the BOS in front of the text shifts every chunk by one token."""
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity, bundle_scorer

    config = PerplexityConfig(context=CONTEXT, stride=CONTEXT, max_chars=None, method=LLAMA_PERPLEXITY)
    for rt, bos in ((bos_runtime, 1), (runtime, None)):
        tokens = rt.tokenizer.encode(TEXT, add_special_tokens=True)
        assert (tokens[0] == bos) if bos is not None else tokens == rt.tokenizer.encode(TEXT,
                                                                                       add_special_tokens=False)
        assert len(tokens) % CONTEXT, "the text should leave a tail to drop"
        score = bundle_scorer(rt)
        expected, count, chunks = _llama_perplexity_by_hand(
            lambda chunk, score=score: score(np.asarray(chunk, np.int64)), tokens, CONTEXT, bos)
        result = bundle_perplexity(rt, TEXT, config)
        assert (result.tokens_scored, result.windows) == (count, chunks)
        assert count == chunks * (CONTEXT - CONTEXT // 2 - 1)
        assert result.perplexity == pytest.approx(expected, rel=1e-9)


def test_llama_cpp_s_logits_under_the_rule_give_the_bundle_s_figure(bos_bundle, bos_runtime):
    """The bundle exported to GGUF: llama.cpp tokenizes the text as llama-perplexity does (common_tokenize with
    add_special, BOS in front) into the bundle's ids, and its logits for each chunk, scored by llama-perplexity's
    loop, give the bundle's figure to float rounding."""
    pytest.importorskip("llama_cpp", reason=LLAMA_CPP_MISSING)
    import llama_cpp

    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity
    from edgesdk.export.gguf_export import export_gguf
    from tests._utils.gguf_files import llama_cpp_logits

    bundle, root = bos_bundle
    report = export_gguf(bundle.path, root / "model.gguf")
    model = llama_cpp.Llama(str(report.path), n_ctx=CONTEXT, n_threads=1, verbose=False)
    tokens = model.tokenize(TEXT.encode(), add_bos=True)  # llama.cpp adds BOS only where its vocabulary does
    assert tokens == bos_runtime.tokenizer.encode(TEXT, add_special_tokens=True)
    theirs, count, chunks = _llama_perplexity_by_hand(
        lambda chunk: llama_cpp_logits(report.path, chunk, context=CONTEXT), tokens, CONTEXT, model.token_bos())
    ours = bundle_perplexity(bos_runtime, TEXT, PerplexityConfig(context=CONTEXT, stride=CONTEXT, max_chars=None,
                                                                 method=LLAMA_PERPLEXITY))
    assert (ours.tokens_scored, ours.windows) == (count, chunks)
    assert ours.perplexity == pytest.approx(theirs, rel=1e-5)


def test_eval_method_llama_perplexity_on_the_command_line(bos_bundle, bos_runtime, tmp_path):
    """--json names the method and gives the library's figure; --reference and --kl-divergence score the same
    chunks (BOS in front of the reference's text too), so a float32 bundle agrees with its source."""
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity

    bundle, _ = bos_bundle
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    answer = invoke("eval", bundle.path, "--text", text, "--method", "llama-perplexity", "--context", CONTEXT,
                    "--reference", "--kl-divergence", "--json", "--threads", 1)
    assert_ok(answer)
    report = json.loads(answer.stdout)
    expected = bundle_perplexity(bos_runtime, TEXT, PerplexityConfig(context=CONTEXT, stride=CONTEXT,
                                                                     method=LLAMA_PERPLEXITY))
    assert report["method"] == "llama-perplexity"
    assert report["bundle"] == expected.to_json()
    assert report["reference"]["tokens_scored"] == report["divergence"]["tokens_scored"] == expected.tokens_scored
    assert abs(report["relative_difference"]) < 1e-4
    assert report["divergence"]["mean_kld"] < 1e-6

    plain = invoke("eval", bundle.path, "--text", text, "--method", "llama-perplexity", "--context", CONTEXT,
                   "--threads", 1)
    assert_ok(plain)
    assert f"chunks of {CONTEXT}, llama-perplexity's rule" in plain.stdout
    assert "--max-chars" not in plain.stdout  # the whole text fits the default 200,000 characters
    cut = invoke("eval", bundle.path, "--text", text, "--method", "llama-perplexity", "--context", CONTEXT,
                 "--max-chars", 600, "--threads", 1)
    assert_ok(cut)
    assert f"scored the first 600 of {len(TEXT):,} characters" in cut.stdout
    assert "pass --max-chars 0 for its figure" in cut.stdout
    default = invoke("eval", bundle.path, "--text", text, "--context", CONTEXT, "--json", "--threads", 1)
    assert_ok(default)
    assert json.loads(default.stdout)["method"] == "windows"


def test_eval_llama_perplexity_refuses_a_stride_and_a_text_under_two_chunks(bos_bundle, tmp_path):
    bundle, _ = bos_bundle
    text = tmp_path / "text.txt"
    text.write_text(TEXT, encoding="utf-8")
    strided = invoke("eval", bundle.path, "--text", text, "--method", "llama-perplexity", "--context", CONTEXT,
                     "--stride", 16)
    assert strided.exit_code == 2, strided.output
    assert "--stride 16" in strided.stderr
    assert "drop --stride" in strided.stderr
    short = tmp_path / "short.txt"
    short.write_text(CORPUS[0], encoding="utf-8")
    assert_error(invoke("eval", bundle.path, "--text", short, "--method", "llama-perplexity", "--context", CONTEXT),
                 f"llama-perplexity's rule needs at least 2 x the context, {2 * CONTEXT} tokens", "lower --context")


def test_a_text_under_two_chunks_is_refused_by_the_library_too(runtime):
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity

    with pytest.raises(EdgeSDKError, match="needs at least 2 x the context, 64 tokens"):
        bundle_perplexity(runtime, CORPUS[0], PerplexityConfig(context=32, stride=32, method=LLAMA_PERPLEXITY))


def test_the_file_is_read_as_llama_perplexity_reads_it(bos_bundle, bos_runtime, tmp_path):
    """llama-perplexity -f takes the file's bytes as they are, one trailing newline dropped (common/arg.cpp). The
    newline kept made a text of 3 x 32 - 1 tokens 3 x 32, one chunk more than llama-perplexity scores; CRLF line
    ends read as LF changed every token after the first line."""
    from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, bundle_perplexity

    bundle, _ = bos_bundle
    config = PerplexityConfig(context=CONTEXT, stride=CONTEXT, max_chars=None, method=LLAMA_PERPLEXITY)
    words = TEXT.split()
    body = next(" ".join(words[:n]) for n in range(len(words))
                if len(bos_runtime.tokenizer.encode(" ".join(words[:n]), add_special_tokens=True)) == 3 * CONTEXT - 1)
    assert len(bos_runtime.tokenizer.encode(body + "\n", add_special_tokens=True)) == 3 * CONTEXT
    path = tmp_path / "text.txt"
    path.write_bytes((body + "\n").encode())
    answer = invoke("eval", bundle.path, "--text", path, "--method", "llama-perplexity", "--context", CONTEXT,
                    "--max-chars", 0, "--json", "--threads", 1)
    assert_ok(answer)
    assert json.loads(answer.stdout)["bundle"] == bundle_perplexity(bos_runtime, body, config).to_json()
    assert json.loads(answer.stdout)["bundle"]["windows"] == 2

    crlf = "\r\n".join(CORPUS[:12])
    path.write_bytes((crlf + "\r\n").encode())
    answer = invoke("eval", bundle.path, "--text", path, "--method", "llama-perplexity", "--context", CONTEXT,
                    "--max-chars", 0, "--json", "--threads", 1)
    assert_ok(answer)
    expected = bundle_perplexity(bos_runtime, crlf + "\r", config)
    assert json.loads(answer.stdout)["bundle"] == expected.to_json()
    assert expected.perplexity != bundle_perplexity(bos_runtime, crlf.replace("\r", ""), config).perplexity
