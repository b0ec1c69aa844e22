"""A GGUF file written again with keys or tensors set or left out, as a converter would have written it (how
the tests make files whose metadata edgesdk's loader must read as llama.cpp does), and llama.cpp's logits for
a file (llama-cpp-python, which the tests that call it skip without)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def rewrite_gguf(source: Path, target: Path, fields: dict | None = None, tensors: dict | None = None,
                 drop: tuple = (), arrays: dict | None = None, architecture: str | None = None,
                 quantize=None) -> Path:
    """``source`` written again as ``target``, ``fields`` (key -> (value, GGUFValueType)), ``arrays`` (key ->
    list) and float32 ``tensors`` set (replacing any of that name) and the keys or tensors in ``drop`` left out.

    ``architecture``: another general.architecture, the ``<arch>.*`` keys renamed to it. ``quantize``: a
    GGMLQuantizationType for the 2-D tensors, through gguf-py's quants.quantize as llama.cpp's converter does for
    ``--outtype q8_0``."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    old = reader.fields["general.architecture"].contents()
    architecture = architecture or old
    writer = gguf.GGUFWriter(str(target), architecture)
    fields, tensors, arrays = fields or {}, tensors or {}, arrays or {}
    for name, field in reader.fields.items():
        if (name.startswith("GGUF.") or name == "general.architecture" or name in fields or name in arrays
                or name in drop):
            continue
        key = architecture + name[len(old):] if name.startswith(old + ".") else name
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    for name, (value, kind) in fields.items():
        writer.add_key_value(name, value, kind)
    for name, values in arrays.items():
        writer.add_array(name, values)
    for tensor in reader.tensors:
        if tensor.name in tensors or tensor.name in drop:
            continue
        data = np.asarray(tensor.data)
        if quantize is not None and data.ndim == 2:
            quantized = gguf.quants.quantize(data.astype(np.float32), quantize)
            writer.add_tensor(tensor.name, quantized, raw_shape=quantized.shape, raw_dtype=quantize)
        else:
            writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    for name, value in tensors.items():
        writer.add_tensor(name, np.asarray(value, np.float32))
    return close_gguf(writer, target)


def add_tokenizer_keys(writer, tokenizer_from: Path) -> None:
    """The ``tokenizer.*`` keys of the GGUF file ``tokenizer_from`` added to ``writer``."""
    import gguf

    for name, field in gguf.GGUFReader(str(tokenizer_from)).fields.items():
        if name.startswith("tokenizer."):
            if field.types[0] == gguf.GGUFValueType.ARRAY:
                writer.add_array(name, field.contents())
            else:
                writer.add_key_value(name, field.contents(), field.types[0])


def close_gguf(writer, target: Path) -> Path:
    """``writer``'s header, keys and tensors written to its file, which is closed; ``target`` returned."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def llama_cpp_logits(path: Path, ids: list[int], context: int = 128) -> np.ndarray:
    """llama.cpp's logits (len(ids), V) for ``ids`` evaluated from the start by the GGUF file at ``path``."""
    import llama_cpp

    model = llama_cpp.Llama(str(path), n_ctx=context, logits_all=True, n_threads=1, verbose=False)
    model.eval(list(ids))
    return np.array(model.scores[:len(ids)])


# llama.cpp in a child process, its weights in plain CPU buffers. Its "extra" buffer types repack quantized
# weights for other kernels; on a CPU with AMX that is the AMX buffer, whose kernel (as GCC 12 compiles it:
# its _tile_loadconfig declares an 8-byte operand, so the stores to the rest of the 64-byte tile configuration
# are dropped) loads a configuration holding stale stack bytes, and ldtilecfg faults (SIGSEGV) wherever those
# make it invalid.
_LLAMA_CPP_CHILD = """
import json, sys
import numpy as np
import llama_cpp
from llama_cpp import llama_cpp as api

request = json.load(sys.stdin)
default_params = api.llama_model_default_params

def model_params():
    params = default_params()
    params.use_extra_bufts = False
    return params

api.llama_model_default_params = model_params
# a float32 KV cache (GGML_TYPE_F32 = 0) where asked: llama.cpp's default F16 cache rounds keys and values
cache = {"type_k": 0, "type_v": 0} if request["f32_cache"] else {}
model = llama_cpp.Llama(request["path"], n_ctx=request["context"], logits_all=True, n_threads=1, verbose=False,
                        lora_path=request["lora"], lora_scale=request["lora_scale"], **cache)
answer = {}
if request["text"] is not None:
    answer["tokens"] = model.tokenize(request["text"].encode(), add_bos=True)
model.eval(request["ids"])
np.save(request["out"], np.array(model.scores[:len(request["ids"])]))
if request["pieces"]:  # each token's piece (llama_token_to_piece, special tokens rendered) as bytes
    answer["pieces"] = []
    for token in range(model.n_vocab()):
        buffer = (api.ctypes.c_char * 64)()
        size = api.llama_token_to_piece(model._model.vocab, token, buffer, 64, 0, True)
        answer["pieces"].append(list(buffer.raw[:size]))
json.dump(answer, sys.stdout)
"""


def llama_cpp_child(path: Path, ids: list[int], text: str | None = None, pieces: bool = False,
                    context: int = 64, lora: Path | None = None, lora_scale: float = 1.0,
                    f32_cache: bool = False) -> tuple[np.ndarray, dict]:
    """llama.cpp's logits (len(ids), V) for ``ids`` evaluated from the start by the GGUF file at ``path``, and
    as asked its token ids for ``text`` (BOS added, under "tokens") and every token's piece as bytes (under
    "pieces"), computed in a child process with llama.cpp's plain CPU weight buffers (see _LLAMA_CPP_CHILD): a
    crash there fails the caller with the child's exit and traceback instead of ending the test run. ``lora``: a
    GGUF LoRA adapter applied at ``lora_scale`` (llama.cpp's --lora-scaled); ``f32_cache``: a float32 KV cache."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "logits.npy"
        request = {"path": str(path), "text": text, "ids": list(ids), "context": context, "out": str(out),
                   "pieces": pieces, "lora": None if lora is None else str(lora), "lora_scale": lora_scale,
                   "f32_cache": f32_cache}
        child = subprocess.run([sys.executable, "-X", "faulthandler", "-c", _LLAMA_CPP_CHILD],
                               input=json.dumps(request), capture_output=True, text=True)
        if child.returncode != 0:
            status = (signal.Signals(-child.returncode).name if child.returncode < 0
                      else f"exit status {child.returncode}")
            raise AssertionError(f"llama.cpp's child process for {path.name} ended with {status}:\n"
                                 f"{child.stderr[-6000:]}")
        answer = json.loads(child.stdout)
        if pieces:
            answer["pieces"] = [bytes(piece) for piece in answer["pieces"]]
        return np.load(out), answer


def llama_cpp_tokens_and_logits(path: Path, text: str, ids: list[int], context: int = 64) -> tuple[list, np.ndarray]:
    """llama.cpp's token ids for ``text`` (BOS added) and its logits for ``ids`` (:func:`llama_cpp_child`)."""
    logits, answer = llama_cpp_child(path, ids, text=text, context=context)
    return answer["tokens"], logits


def vocab_only_gguf(target: Path, write_vocabulary) -> Path:
    """A GGUF file with no tensors for llama.cpp to open with ``vocab_only``: a tiny llama architecture's keys and
    whatever ``write_vocabulary(writer)`` adds (the ``tokenizer.ggml.*`` keys)."""
    import gguf

    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    write_vocabulary(writer)
    return close_gguf(writer, target)


def one_layer_llama_gguf(path: Path, tokenizer_model: str, tokens: list[str], types: list[int],
                         scores: list[float] | None = None, merges: list[str] | None = None, pre: str | None = None,
                         bos: int = 1, eos: int = 2, unk: int | None = None, ids: dict[str, int] | None = None,
                         **flags: bool) -> Path:
    """A one-layer Llama GGUF (width 64, 2 heads, 1 KV head, FFN 96, random float32 weights) with the vocabulary
    ``tokens`` of ``types`` (``tokenizer.ggml.model`` ``tokenizer_model``; ``scores`` for SentencePiece,
    ``merges`` for BPE), ``tokenizer.ggml.pre`` ``pre``, the BOS / EOS / UNK ids, the other token-id keys in ``ids``
    (eot_token_id, eom_token_id) and the boolean tokenizer keys in ``flags`` (add_bos_token, add_eos_token,
    add_space_prefix), each only where given: how the tests make files whose tokenizer edgesdk's loader must read
    as llama.cpp does."""
    import gguf

    vocab, width, ffn = len(tokens), 64, 96
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("embedding_length", width), ("attention.head_count", 2),
                       ("attention.head_count_kv", 1), ("context_length", 128), ("feed_forward_length", ffn)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model(tokenizer_model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    if merges is not None:
        writer.add_token_merges(merges)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if unk is not None:
        writer.add_unk_token_id(unk)
    for key, value in (ids or {}).items():
        writer.add_uint32(f"tokenizer.ggml.{key}", value)
    for key, value in flags.items():
        writer.add_bool(f"tokenizer.ggml.{key}", value)
    random = np.random.default_rng(0)
    for name, shape in {"token_embd.weight": (vocab, width), "output_norm.weight": (width,),
                        "blk.0.attn_norm.weight": (width,), "blk.0.attn_q.weight": (width, width),
                        "blk.0.attn_k.weight": (32, width), "blk.0.attn_v.weight": (32, width),
                        "blk.0.attn_output.weight": (width, width), "blk.0.ffn_norm.weight": (width,),
                        "blk.0.ffn_gate.weight": (ffn, width), "blk.0.ffn_up.weight": (ffn, width),
                        "blk.0.ffn_down.weight": (width, ffn)}.items():
        writer.add_tensor(name, random.standard_normal(shape).astype(np.float32))
    return close_gguf(writer, path)
