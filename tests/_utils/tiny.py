"""Tiny randomly initialised Llama-style models (grouped-query attention) and a tokenizer, built offline."""

from __future__ import annotations

import json
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Edge boards run small language models; the runtime keeps them cool.",
    "Grouped-query attention shares key and value heads between query heads.",
    "Überall sind Zeichen: café, naïve, 東京, emoji 🙂.",
] * 20


def tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer trained on a few sentences, wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' "
    "else message['role'] }}\n{{ message['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"]


def tiny_gemma_tokenizer(vocab_size: int = 384):
    """A SentencePiece-style BPE tokenizer as Gemma's (transformers' GemmaTokenizer: spaces as U+2581, byte
    fallback to <0xNN> tokens, Gemma's special tokens first), its merges trained on a few sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    fixed = GEMMA_SPECIALS + [f"<0x{byte:02X}>" for byte in range(256)]
    tokenizers_tok = Tokenizer(models.BPE())
    tokenizers_tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")  # pieces start with U+2581
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(fixed), show_progress=False,
                                  initial_alphabet=["\u2581"], limit_alphabet=64)
    tokenizers_tok.train_from_iterator(CORPUS, trainer)
    learned = json.loads(tokenizers_tok.to_str())["model"]
    vocab = {token: index for index, token in enumerate(fixed)}
    for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in learned["merges"]]
    tokenizer = GemmaTokenizer(vocab=vocab, merges=merges, add_bos_token=True,
                               additional_special_tokens=GEMMA_SPECIALS[5:])
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
    return tokenizer


def tiny_llama2_tokenizer():
    """A SentencePiece-style BPE tokenizer as Llama 2's and TinyLlama's (transformers' LlamaTokenizer: a
    Metaspace pre-tokenizer that puts U+2581 in front of the text, byte fallback, <unk> <s> </s> first), with
    the pieces and merges of tiny_gemma_tokenizer."""
    from transformers.models.llama.tokenization_llama import LlamaTokenizer

    spec = json.loads(tiny_gemma_tokenizer().backend_tokenizer.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for token, _ in sorted(spec["vocab"].items(), key=lambda item: item[1]):
        if token not in GEMMA_SPECIALS:
            vocab.setdefault(token, len(vocab))
    merges = [tuple(pair) if isinstance(pair, list) else tuple(pair.split(" ")) for pair in spec["merges"]]
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(seed: int = 0, layers: int = 2, heads: int = 4, kv_heads: int = 2, hidden: int = 64,
               vocab_size: int = 320, model_type: str = "llama", tie: bool = True, intermediate: int | None = None,
               max_positions: int = 512, head_dim: int | None = None, config_overrides: dict | None = None):
    """A random causal LM small enough for unit tests (a few hundred kB). ``head_dim`` (default
    hidden / heads) sets a query width other than the model's, as Qwen3's configs do; ``config_overrides``
    replace config values (after this function's own choices)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    extra = {"attention_bias": False} if model_type == "llama" else {}
    if head_dim is not None or model_type in ("qwen3", "gemma3_text"):  # their configs default to other sizes
        extra["head_dim"] = head_dim or hidden // heads
    if model_type == "gemma3_text":  # a window shorter than test prompts, both kinds of layer, a scale not 1/sqrt(hd)
        extra.update(sliding_window=4, query_pre_attn_scalar=24,
                     layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)])
    extra.update(config_overrides or {})
    config = AutoConfig.for_model(
        model_type, vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or hidden * 2 - 16,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
        pad_token_id=0, **extra,
    )
    model = AutoModelForCausalLM.from_config(config).eval()
    # Random init gives near-uniform logits; scale up so greedy choices are well separated.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
        for layer in model.model.layers:  # Qwen3's per-head query / key norms start at ones: make them count
            for norm in (getattr(layer.self_attn, "q_norm", None), getattr(layer.self_attn, "k_norm", None)):
                if norm is not None:
                    norm.weight.uniform_(0.5, 1.5)
        if model_type == "gemma3_text":  # Gemma's norms scale by 1 + weight, initialised at 0: every one counts
            for name, parameter in model.named_parameters():
                if "norm" in name:
                    parameter.uniform_(-0.5, 0.5)
        if tie:
            echo_free(model)
    return model


def echo_free(model) -> None:
    """Make a tied model's greedy answer depend on its context. With the embedding scaled up, the residual stream is
    mostly the last token's embedding, and the tied head scores that token highest: greedy decoding repeated the
    last token whatever the KV cache held. A negated final norm scores it lowest instead, and layer outputs eight
    times larger make the context (the attention over the cache) decide. Changed in place."""
    norm = model.model.norm.weight
    if model.config.model_type.startswith("gemma"):  # Gemma's norms scale by 1 + weight, and norm the layer outputs
        norm.copy_(-2.0 - norm)
        for layer in model.model.layers:
            for output_norm in (layer.post_attention_layernorm, layer.post_feedforward_layernorm):
                output_norm.weight.copy_((1.0 + output_norm.weight) * 8.0 - 1.0)
        return
    norm.neg_()
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(8.0)
        layer.mlp.down_proj.weight.mul_(8.0)


def save_tiny_model_dir(path: Path, tokenizer: str = "byte-level", **kwargs) -> Path:
    """A Hugging Face model directory (config, safetensors, tokenizer) for build tests; ``tokenizer``:
    byte-level (tiny_tokenizer) or gemma (tiny_gemma_tokenizer)."""
    model = tiny_llama(**kwargs)
    model.save_pretrained(path, safe_serialization=True)
    make = tiny_gemma_tokenizer if tokenizer == "gemma" else tiny_tokenizer
    make(model.config.vocab_size).save_pretrained(path)
    return path


def on_sparse_grid(model, embedding_in_half: bool = False):
    """``model`` with its linears (all but ``lm_head``) rounded onto the per-row INT8 grid, and with
    ``embedding_in_half`` its embedding rounded to float16: what the block-sparse weights store, so that an export
    holds its weights exactly. Changed in place and returned."""
    import torch

    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and "lm_head" not in name:
                scale = module.weight.abs().amax(1, keepdim=True) / 127  # [out, 1]: one scale per row
                module.weight.copy_((module.weight / scale).round().clamp(-127, 127) * scale)
        if embedding_in_half:
            model.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight.half().float())
    return model


def export_tiny_sparse(out: Path, max_context: int):
    """(model, tensors, record): a tiny Llama whose linears sit on the per-row INT8 grid, exported
    block-sparse into ``out`` (so the INT8 blocks hold its weights exactly)."""
    from safetensors.torch import load_file

    from edgesdk.export.sparse_export import SparseExportConfig, export_sparse

    model = on_sparse_grid(tiny_llama(hidden=64, heads=4, kv_heads=2))
    record = export_sparse(model, out, SparseExportConfig(), max_context=max_context)
    return model, load_file(str(out / record["weights"])), record
