"""spec51: a GGUF file's named chat templates (tokenizer.chat_template.<name>) read as llama.cpp reads them, and a
speculative draft whose vocabulary differs from the target's a little accepted as llama.cpp accepts it."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("torch")

TOOL = "TOOL:{% for m in messages %}{{ m.content }}{% endfor %}"
PLAIN = "PLAIN:{% for m in messages %}{{ m.content }}{% endfor %}"
RAG = "RAG:{% for m in messages %}{{ m.content }}{% endfor %}"


def _gguf_with_templates(tmp_path, default: str | None, named: dict[str, str]):
    """A one-layer Llama GGUF with its chat templates written as gguf-py's GGUFWriter.add_chat_template writes a
    tokenizer_config's list of named templates (convert_hf_to_gguf.py): "default" as tokenizer.chat_template, every
    other name as tokenizer.chat_template.<name>, listed in tokenizer.chat_templates."""
    from tests._utils.gguf_files import one_layer_llama_gguf, rewrite_gguf

    tokens = ["<unk>", "<s>", "</s>", *"abcdefghijklm", "ab"]
    plain = one_layer_llama_gguf(tmp_path / "plain.gguf", "gpt2", tokens, [2, 3, 3] + [1] * (len(tokens) - 3),
                                 merges=["a b"], pre="smollm", unk=0)
    writer = gguf.GGUFWriter(str(tmp_path / "templates.gguf"), "llama")
    listed = ([{"name": "default", "template": default}] if default is not None else []) + \
        [{"name": name, "template": text} for name, text in named.items()]
    writer.add_chat_template(listed)
    fields, arrays = {}, {}
    for key, field in writer.kv_data[0].items():
        if key == "tokenizer.chat_templates":
            arrays[key] = list(field.value)
        else:
            fields[key] = (field.value, field.type)
    return rewrite_gguf(plain, tmp_path / "named.gguf", fields=fields, arrays=arrays)


def _tokenizer(path):
    from edgesdk.models.loader import load_model
    from edgesdk.models.sources import resolve_model

    return load_model(resolve_model(str(path)), progress=False).tokenizer


def test_a_gguf_with_only_a_tool_use_template_gets_it_as_llama_cpp_does(tmp_path):
    """transformers' GGUF tokenizer reads tokenizer.chat_template alone: a file with only
    tokenizer.chat_template.tool_use had no chat template, where llama.cpp's common_chat_templates_init takes the
    tool_use template as the default (and the build takes it, package.chosen_chat_template)."""
    from edgesdk.build.package import chosen_chat_template

    path = _gguf_with_templates(tmp_path, None, {"tool_use": TOOL})
    tokenizer = _tokenizer(path)
    assert tokenizer.chat_template == {"tool_use": TOOL}
    assert chosen_chat_template(tokenizer) == (TOOL, "tool_use")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             chat_template="tool_use")
    assert rendered == "TOOL:hi"


def test_a_gguf_default_template_stays_the_default_beside_named_ones(tmp_path):
    """Each named template is kept beside the default (the dict transformers makes of a tokenizer_config that lists
    several); the default is the one a chat is rendered with, and the named ones survive save_pretrained."""
    from transformers import AutoTokenizer

    from edgesdk.build.package import chosen_chat_template

    path = _gguf_with_templates(tmp_path, PLAIN, {"tool_use": TOOL, "rag": RAG})
    tokenizer = _tokenizer(path)
    assert tokenizer.chat_template == {"default": PLAIN, "rag": RAG, "tool_use": TOOL}
    assert chosen_chat_template(tokenizer) == (PLAIN, "default")
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "PLAIN:hi"
    tokenizer.save_pretrained(tmp_path / "saved")
    assert AutoTokenizer.from_pretrained(tmp_path / "saved").chat_template == tokenizer.chat_template


def test_a_gguf_with_one_template_keeps_it_as_a_string(tmp_path):
    from edgesdk.build.package import chosen_chat_template

    tokenizer = _tokenizer(_gguf_with_templates(tmp_path, PLAIN, {}))
    assert tokenizer.chat_template == PLAIN
    assert chosen_chat_template(tokenizer) == (PLAIN, None)


# --- a draft whose vocabulary has a few tokens more or less than the bundle's (llama.cpp's
# common_speculative_are_compatible: sizes up to SPEC_VOCAB_MAX_SIZE_DIFFERENCE apart, the same texts from
# SPEC_VOCAB_CHECK_START_TOKEN_ID on over the ids both have)

ADDED = ["<tool_call>", "</tool_call>"]
FUSED = "name: fused\nstages: []\nexport: {form: ort-fused, weights: fp32}\n"
PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def grown_bundle(tiny_model_dir, tmp_path_factory):
    """The tiny bundle's model fine-tuned in form: its tokenizer with two tokens added (ids 320 and 321) and the
    embedding grown to hold them, as a fine-tune that adds tool-call tokens is, in a bundle of its own."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests._utils.builds import build_tiny_bundle

    root = tmp_path_factory.mktemp("grown51")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tokenizer.add_special_tokens({"additional_special_tokens": ADDED}) == 2
    vocab = len(tokenizer)
    model.resize_token_embeddings(vocab, mean_resizing=False)
    with torch.no_grad():  # rows the old ones did not have: small, so the shared text decodes as before
        model.get_input_embeddings().weight[vocab - 2:] *= 0.01
    model.save_pretrained(root / "model", safe_serialization=True)
    tokenizer.save_pretrained(root / "model")
    return build_tiny_bundle(root, FUSED, "host", model_dir=root / "model")


def _answers(target, draft_bundle, prompt_ids):
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.speculative import DraftConfig, open_draft_model

    sampling = SamplingConfig(max_new_tokens=24)
    plain, _ = generate(target.backend, prompt_ids, sampling, stop_ids=set())
    model = open_draft_model(target, draft_bundle, DraftConfig(max_draft=3, p_min=0.0), threads=1)
    drafted, stats = generate(target.backend, prompt_ids, sampling, stop_ids=set(), lookup=model)
    return plain, drafted, stats, model


def test_a_fine_tune_with_added_tokens_takes_its_base_model_as_draft_as_llama_cpp_does(tiny_bundle, grown_bundle):
    """llama.cpp drafts with a model whose vocabulary is up to 128 tokens larger or smaller and holds the same texts
    over the ids both have; edgesdk refused any vocabulary not exactly the bundle's ("has another tokenizer"). The
    answer is the bundle's own, token for token, and no id past the bundle's vocabulary is proposed."""
    from edgesdk.runtime.session import open_runtime

    target = open_runtime(grown_bundle.path, threads=1)  # the fine-tune, drafted by its base model
    prompt = target.tokenizer.encode(PROMPT)
    plain, drafted, stats, model = _answers(target, tiny_bundle.path, prompt)
    assert drafted == plain
    assert stats.draft_accepted > 0  # the same weights over the shared ids: drafts are taken
    assert model.vocab_size == 322
    assert model.foreign == frozenset()
    # a prompt holding an added token the draft has no row for: no drafts, the same answer
    with_tool = prompt + [target.tokenizer.token_id("<tool_call>")]
    plain, drafted, stats, _ = _answers(target, tiny_bundle.path, with_tool)
    assert drafted == plain
    assert stats.draft_tokens == 0


def test_a_draft_with_added_tokens_never_proposes_them_to_the_base_model(tiny_bundle, grown_bundle):
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.speculative import DraftConfig, DraftModel

    target = open_runtime(tiny_bundle.path, threads=1)
    prompt = target.tokenizer.encode(PROMPT)
    plain, drafted, stats, model = _answers(target, grown_bundle.path, prompt)
    assert drafted == plain
    assert stats.draft_accepted > 0
    assert model.vocab_size == 320  # the draft's ids 320 and 321 end a draft: the bundle has no such token
    # an id the draft would propose first, marked foreign (a text that differs below id 5), ends the draft there
    first = model.drafter(prompt).draft()[0]
    assert DraftModel(model.backend, DraftConfig(max_draft=3), 320, frozenset({first})).drafter(prompt).draft() == []


def test_a_draft_whose_token_texts_differ_is_refused_naming_the_first(tiny_bundle, tmp_path):
    """llama.cpp refuses a draft whose token texts differ from id 5 on (or whose sizes are over 128 apart); so does
    edgesdk, saying which."""
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.speculative import DraftConfig, DraftError, open_draft_model
    from tests._utils.builds import build_tiny_bundle
    from tests._utils.tiny import save_tiny_model_dir

    model_dir = save_tiny_model_dir(tmp_path / "model", tokenizer="gemma", vocab_size=384, hidden=64, heads=4,
                                    kv_heads=2)
    other = build_tiny_bundle(tmp_path, FUSED, "host", model_dir=model_dir)
    target = open_runtime(tiny_bundle.path, threads=1)
    with pytest.raises(DraftError) as refused:
        open_draft_model(target, other.path, DraftConfig(), threads=1)
    message = " ".join(str(refused.value).split())
    assert "has another tokenizer than the bundle (384 tokens against 320:" in message
    assert "so its token ids mean other text" in message
    assert "pass a draft bundle built from a model with this bundle's tokenizer" in refused.value.fix
