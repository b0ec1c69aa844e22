"""A GGUF file written again with keys or tensors set or left out, as a converter would have written it (how
the tests make files whose metadata edgesdk's loader must read as llama.cpp does), and llama.cpp's logits for
a file (llama-cpp-python, which the tests that call it skip without)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def rewrite_gguf(source: Path, target: Path, fields: dict | None = None, tensors: dict | None = None,
                 drop: tuple = ()) -> Path:
    """``source`` written again as ``target``, ``fields`` (key -> (value, GGUFValueType)) and float32 ``tensors``
    set (replacing any of that name) and the keys or tensors in ``drop`` left out."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(target), reader.fields["general.architecture"].contents())
    fields, tensors = fields or {}, tensors or {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in fields or name in drop:
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), field.types[0])
    for name, (value, kind) in fields.items():
        writer.add_key_value(name, value, kind)
    for tensor in reader.tensors:
        if tensor.name not in tensors and tensor.name not in drop:
            writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    for name, value in tensors.items():
        writer.add_tensor(name, np.asarray(value, np.float32))
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
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
