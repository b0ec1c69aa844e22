"""Fill-in-the-middle on ``edgesdk serve``: llama-server's ``POST /infill`` and Ollama's ``suffix`` on ``/api/generate``.

The FIM tokens are found as llama.cpp's vocab loader finds them (src/llama-vocab.cpp, "auto-detect special tokens
by text"), and the prompt is assembled as llama-server's ``format_prompt_infill`` (tools/server/server-common.cpp)
assembles it: the expected token ids below are written out by hand from that function. A tiny bundle is built with a
tokenizer holding Qwen2.5-Coder's FIM tokens (``<|fim_prefix|>`` ... ``<|repo_name|>``, ``<|file_sep|>``), and a
tokenizer with StarCoder2's (``<fim_prefix>`` ... ``<repo_name>``, ``<file_sep>``, the last two in none of
llama.cpp's lists). The tiny bundle of tests/conftest.py has no FIM tokens.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

QWEN = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
STARCODER = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<repo_name>", "<file_sep>"]
NAME = "tiny-host:latest"
PREFIX, SUFFIX = "def f(x):\n    return ", "\n\nprint(f(2))\n"


def _fim_tokenizer(added: list[str], bos: bool = False):
    """tests/_utils/tiny.py's byte-level tokenizer with ``added`` special tokens (after its 320), and with
    ``bos`` a post-processor that puts <|im_start|> in front of every text, as a BOS-adding tokenizer does."""
    from tokenizers import processors

    from tests._utils.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer(320)
    tokenizer.add_special_tokens({"additional_special_tokens": added})
    if bos:
        start = tokenizer.convert_tokens_to_ids("<|im_start|>")
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single="<|im_start|> $A", special_tokens=[("<|im_start|>", start)])
    return tokenizer


def _chat_tokenizer(folder, added: list[str], bos: bool = False):
    from edgesdk.runtime.text import ChatTokenizer

    _fim_tokenizer(added, bos).save_pretrained(folder)
    return ChatTokenizer(folder / "tokenizer.json", {}, None)


@pytest.fixture(scope="module")
def qwen_bundle(tmp_path_factory):
    """A tiny bundle whose tokenizer has Qwen2.5-Coder's six FIM tokens (ids 320-325), built by the real pipeline."""
    from edgesdk.build.pipeline import BuildConfig, build
    from edgesdk.export.onnx_export import ExportConfig
    from tests._utils.tiny import tiny_llama

    root = tmp_path_factory.mktemp("qwen-fim")
    tokenizer = _fim_tokenizer(QWEN)
    tiny_llama(layers=1, hidden=32, heads=2, kv_heads=1, vocab_size=len(tokenizer)).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return build(BuildConfig(target="host", model=str(root / "model"), out=root / "b",
                             export=ExportConfig(max_context=256), progress=False))


@pytest.fixture(scope="module")
def qwen_runtime(qwen_bundle):
    from edgesdk.runtime.session import open_runtime

    return open_runtime(qwen_bundle.path, threads=1)


@pytest.fixture
def fim_served(qwen_runtime):
    from edgesdk.serve.completion import ServeDefaults
    from tests.unit.test_serve import Served

    server = Served(qwen_runtime, ServeDefaults(max_tokens=8))
    yield server
    server.close()


@pytest.fixture(scope="module")
def starcoder(tmp_path_factory):
    return _chat_tokenizer(tmp_path_factory.mktemp("starcoder"), STARCODER)


# ------------------------------------------------------------------------------------------------ FIM tokens


def test_fim_tokens_are_found_by_llama_cpp_s_texts(qwen_runtime, starcoder, tmp_path):
    from edgesdk.runtime.fim import FimTokens, find_fim_tokens

    qwen = qwen_runtime.tokenizer.fim_tokens()
    assert qwen == FimTokens(pre=320, mid=321, suf=322, pad=323, rep=324, sep=325)
    assert qwen.can_infill
    # StarCoder2's <repo_name> and <file_sep> are in none of llama-vocab.cpp's lists: no FIM_REP, no FIM_SEP
    assert starcoder.fim_tokens() == FimTokens(pre=320, mid=321, suf=322, pad=323)
    # <reponame> (Granite's) is FIM_REP
    granite = _chat_tokenizer(tmp_path / "granite", ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<reponame>"])
    assert granite.fim_tokens() == FimTokens(pre=320, mid=321, suf=322, rep=323)
    # CodeLlama's SentencePiece pieces and DeepSeek-Coder's full-width names, as llama.cpp lists them
    codellama = {"▁<PRE>": 32007, "▁<SUF>": 32008, "▁<MID>": 32009, "▁<EOT>": 32010}
    assert find_fim_tokens(codellama.get) == FimTokens(pre=32007, suf=32008, mid=32009, eot=32010)
    deepseek = {"<｜fim▁begin｜>": 32016, "<｜fim▁hole｜>": 32015, "<｜fim▁end｜>": 32017}
    assert find_fim_tokens(deepseek.get) == FimTokens(pre=32016, suf=32015, mid=32017)
    plain = _chat_tokenizer(tmp_path / "plain", [])
    assert plain.fim_tokens() == FimTokens()
    assert plain.fim_tokens().missing() == ["prefix", "suffix", "middle"]


def test_llama_cpp_finds_the_same_fim_tokens_and_tokenizes_the_parts_alike(qwen_bundle, qwen_runtime, tmp_path):
    """The bundle exported to GGUF (F32) and opened by llama.cpp (``vocab_only``): its FIM token ids, its add-BOS
    flag and its plain-text tokens of the prompt's parts are the bundle's."""
    llama_cpp = pytest.importorskip("llama_cpp")
    pytest.importorskip("gguf")
    from edgesdk.export.gguf_export import export_gguf
    from edgesdk.runtime.fim import leading_bos

    report = export_gguf(qwen_bundle.path, tmp_path / "model.gguf")
    model = llama_cpp.Llama(str(report.path), vocab_only=True, verbose=False)
    vocab, fim, tokenizer = model._model.vocab, qwen_runtime.tokenizer.fim_tokens(), qwen_runtime.tokenizer
    found = {kind: getattr(llama_cpp, f"llama_vocab_fim_{kind}")(vocab) for kind in ("pre", "suf", "mid", "pad",
                                                                                      "rep", "sep")}
    assert found == {kind: getattr(fim, kind) for kind in found}
    assert bool(llama_cpp.llama_vocab_get_add_bos(vocab)) == (leading_bos(tokenizer) is not None)
    for text in (PREFIX, SUFFIX, "myproject\n", "filename\n", "\n\n--- snippet ---\n\n", "a.py\n", "x <|fim_pad|>"):
        assert model.tokenize(text.encode(), add_bos=False, special=False) == tokenizer.encode_plain(text), text


# ------------------------------------------------------------------------------------------------ the prompt


def test_prefix_and_suffix_take_their_share_of_the_batch():
    """n_prefix_take = min(len(prefix), 3 * (n_batch / 4)): the prefix's last tokens; n_suffix_take =
    min(len(suffix), max(0, n_batch / 4 - (2 + len(prompt)))): the suffix's first tokens."""
    from edgesdk.runtime.fim import FimTokens, infill_ids

    fim = FimTokens(pre=100, suf=101, mid=102)
    prefix, suffix, prompt = list(range(30)), list(range(200, 220)), [50, 51]
    # n_batch 32: a quarter is 8; the prefix keeps its last 24 tokens (6..29), the suffix its first 8 - 4 = 4
    ids = infill_ids(fim, prefix, suffix, prompt, [], None, bos=None, n_ctx=4096, n_batch=32)
    assert ids == [100, *range(6, 30), 50, 51, 101, 200, 201, 202, 203, 102]
    # the BOS goes in front of FIM_PRE; --spm-infill's order puts the suffix first
    assert infill_ids(fim, prefix, suffix, prompt, [], None, bos=7, n_ctx=4096, n_batch=32)[:2] == [7, 100]
    assert infill_ids(fim, prefix, suffix, prompt, [], None, bos=7, n_ctx=4096, n_batch=32, spm_infill=True) == \
        [7, 101, 200, 201, 202, 203, 100, *range(6, 30), 50, 51, 102]
    # a prompt of 6 tokens leaves the suffix nothing (8 - (2 + 6) = 0); short parts are kept whole
    assert infill_ids(fim, prefix, suffix, list(range(6)), [], None, bos=None, n_ctx=4096, n_batch=32)[-3:] == \
        [5, 101, 102]
    assert infill_ids(fim, [1, 2], [3], [], [], None, bos=None, n_ctx=4096) == [100, 1, 2, 101, 3, 102]
    with pytest.raises(ValueError, match="middle"):
        infill_ids(FimTokens(pre=1, suf=2), [], [], [], [], None, bos=None, n_ctx=4096)


def test_input_extra_uses_the_repo_level_pattern_where_the_vocabulary_has_fim_rep_and_fim_sep(qwen_runtime):
    from edgesdk.runtime.fim import infill_ids

    tokenizer = qwen_runtime.tokenizer
    fim, plain = tokenizer.fim_tokens(), tokenizer.encode_plain
    extra = [("a.py", "x = 1\n"), ("tmp", "y")]
    ids = infill_ids(fim, plain(PREFIX), plain(SUFFIX), plain("ret"), extra, plain, bos=None, n_ctx=4096)
    whole_extra = [324, *plain("myproject\n"), 325, *plain("a.py\n"), *plain("x = 1\n"), 325, *plain("tmp\n"),
                   *plain("y"), 325, *plain("filename\n")]
    assert ids == whole_extra + [320, *plain(PREFIX), *plain("ret"), 322, *plain(SUFFIX), 321]
    # the extra context keeps only its last n_ctx - n_batch - 2 * n_predict tokens: here 3
    cut = infill_ids(fim, plain(PREFIX), plain(SUFFIX), [], extra, plain, bos=None, n_ctx=2048 + 16 + 3, n_predict=8)
    assert cut[:4] == whole_extra[-3:] + [320]


def test_input_extra_without_fim_sep_is_joined_by_the_snippet_separator(starcoder):
    from edgesdk.runtime.fim import infill_ids

    fim, plain = starcoder.fim_tokens(), starcoder.encode_plain
    ids = infill_ids(fim, plain(PREFIX), plain(SUFFIX), [], [("a.py", "x = 1\n"), ("b.py", "y")], plain, bos=None,
                     n_ctx=4096)
    separator = plain("\n\n--- snippet ---\n\n")
    assert ids == [*separator, *plain("x = 1\n"), *separator, *plain("y"), 320, *plain(PREFIX), 322,
                   *plain(SUFFIX), 321]


def test_the_bos_the_tokenizer_adds_goes_after_the_extra_context(tmp_path):
    from edgesdk.runtime.fim import infill_ids, leading_bos

    tokenizer = _chat_tokenizer(tmp_path, QWEN, bos=True)
    bos, fim, plain = leading_bos(tokenizer), tokenizer.fim_tokens(), tokenizer.encode_plain
    assert bos == tokenizer.token_id("<|im_start|>")
    ids = infill_ids(fim, plain("a"), plain("b"), [], [], plain, bos=bos, n_ctx=4096)
    assert ids == [324, *plain("myproject\n"), 325, *plain("filename\n"), bos, 320, *plain("a"), 322, *plain("b"), 321]


# ------------------------------------------------------------------------------------------------ POST /infill


def _expected(tokenizer, prefix: str, suffix: str, prompt: str = "") -> list[int]:
    """format_prompt_infill's ids on the test bundle: its context (256) is below llama-server's batch (2048), so no
    extra context is kept (not even FIM_REP's), and its tokenizer adds no BOS."""
    return [320, *tokenizer.encode_plain(prefix), *tokenizer.encode(prompt, add_special_tokens=False), 322,
            *tokenizer.encode_plain(suffix), 321]


def test_infill_answers_as_completion_answers_the_assembled_prompt(fim_served, qwen_runtime):
    tokenizer = qwen_runtime.tokenizer
    ids = _expected(tokenizer, PREFIX, SUFFIX, "x<|fim_pad|>")  # the prompt's special tokens are parsed
    assert 323 in ids
    status, infilled = fim_served.post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX,
                                                   "prompt": "x<|fim_pad|>", "n_predict": 6,
                                                   "input_extra": [{"filename": "a.py", "text": "x = 1"}]})
    assert status == 200, infilled
    status, completed = fim_served.post("/completion", {"prompt": ids, "n_predict": 6})
    assert status == 200, completed
    assert infilled["tokens_evaluated"] == len(ids)
    assert infilled["prompt"] == tokenizer.tokenizer.decode(ids, skip_special_tokens=False)
    assert infilled["prompt"].startswith("<|fim_prefix|>def f(x):")
    for field in ("content", "tokens_predicted", "stop_type", "generation_settings", "prompt"):
        assert infilled[field] == completed[field], field
    assert infilled["tokens_predicted"] == 6
    assert infilled["stop"] is True


def test_infill_streams_as_completion_streams(fim_served):
    body = {"input_prefix": ["def ", "f(x):"], "input_suffix": SUFFIX, "n_predict": 5, "temperature": 0}
    status, whole = fim_served.post("/infill", body)
    assert status == 200, whole
    status, headers, payload = fim_served.request("POST", "/infill", {**body, "stream": True})
    assert status == 200
    assert headers["Content-Type"] == "text/event-stream"
    events = [json.loads(line[len("data: "):]) for line in payload.decode().split("\n\n") if line]
    assert all(event["stop"] is False for event in events[:-1])
    assert events[-1]["stop"] is True
    assert "".join(event["content"] for event in events) == whole["content"]
    assert events[-1]["tokens_evaluated"] == whole["tokens_evaluated"]


def test_input_prefix_takes_token_ids_as_tokenize_mixed_reads_them(fim_served, qwen_runtime):
    plain = qwen_runtime.tokenizer.encode_plain
    status, mixed = fim_served.post("/infill", {"input_prefix": ["def", 323, " f"], "input_suffix": "", "n_predict": 2})
    assert status == 200, mixed
    ids = [320, *plain("def"), 323, *plain(" f"), 322, 321]
    assert mixed["prompt"] == qwen_runtime.tokenizer.tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize(("body", "param"), [
    ({"input_suffix": ""}, "input_prefix"),
    ({"input_prefix": ""}, "input_suffix"),
    ({"input_prefix": 5, "input_suffix": ""}, "input_prefix"),
    ({"input_prefix": ["a", -1], "input_suffix": ""}, "input_prefix"),
    ({"input_prefix": "", "input_suffix": "", "prompt": 3}, "prompt"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "x"}}, "input_extra"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a.py"}]}, "input_extra[0].text"),
    ({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "x", "filename": 1}]},
     "input_extra[0].filename"),
    ({"input_prefix": "", "input_suffix": "\ud800"}, "input_suffix"),
    ({"input_prefix": "", "input_suffix": "", "n_predict": "many"}, "n_predict"),
    ({"input_prefix": [99999], "input_suffix": ""}, "input_prefix"),
    ({"input_prefix": "x = 1\n" * 300, "input_suffix": ""}, "input_prefix"),
])
def test_bad_infill_requests_are_refused_naming_the_field(fim_served, body, param):
    status, _, payload = fim_served.request("POST", "/infill", raw=json.dumps(body).encode())
    error = json.loads(payload)["error"]
    assert status == 400, error
    assert error["param"] == param, error


def test_a_model_without_fim_tokens_is_refused_as_llama_server_refuses_it(served):
    status, body = served.post("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX})
    assert status == 501, body
    assert body["error"]["type"] == "not_supported_error"
    assert "Infill is not supported by this model" in body["error"]["message"]
    assert "no FIM prefix, suffix, middle tokens" in body["error"]["message"]
    status, _, _ = served.request("GET", "/infill")
    assert status == 405


# ------------------------------------------------------------------------------------------------ Ollama's suffix


def test_ollama_s_suffix_builds_the_infill_prompt(fim_served, qwen_runtime):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=f"http://127.0.0.1:{fim_served.port}")
    ids = _expected(qwen_runtime.tokenizer, PREFIX, SUFFIX)
    status, completed = fim_served.post("/completion", {"prompt": ids, "n_predict": 5})
    assert status == 200, completed
    whole = client.generate(model=NAME, prompt=PREFIX, suffix=SUFFIX, system="ignored, as Ollama ignores it",
                            options={"num_predict": 5}, stream=False)
    # /completion keeps a character the token limit cut short (U+FFFD), as llama-server does; Ollama's runner trims it
    assert whole.response == completed["content"].rstrip("\ufffd")
    assert whole.prompt_eval_count == len(ids)
    assert whole.eval_count == 5
    streamed = list(client.generate(model=NAME, prompt=PREFIX, suffix=SUFFIX, options={"num_predict": 5}, stream=True))
    assert "".join(part.response for part in streamed) == completed["content"].rstrip("\ufffd")
    assert streamed[-1].done
    # raw leaves the suffix out, as Ollama's raw skips the template that writes it
    raw = client.generate(model=NAME, prompt=PREFIX, suffix=SUFFIX, raw=True, options={"num_predict": 3}, stream=False)
    plain = client.generate(model=NAME, prompt=PREFIX, raw=True, options={"num_predict": 3}, stream=False)
    assert raw.response == plain.response
    assert raw.prompt_eval_count == plain.prompt_eval_count


def test_ollama_s_suffix_on_a_model_without_fim_tokens_is_refused_naming_it(served):
    ollama = pytest.importorskip("ollama")
    client = ollama.Client(host=f"http://127.0.0.1:{served.port}")
    with pytest.raises(ollama.ResponseError) as caught:
        client.generate(model=NAME, prompt=PREFIX, suffix=SUFFIX, stream=False)
    assert caught.value.status_code == 400
    assert "does not support insert" in caught.value.error
    assert "'suffix'" in caught.value.error
    status, body = served.post("/api/generate", {"model": NAME, "prompt": PREFIX, "suffix": 5})
    assert status == 400
    assert "'suffix' must be a string" in body["error"]
