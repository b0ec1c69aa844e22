"""edgesdk's port of llama.cpp's infill sampler (edgesdk/runtime/infill_sampler.py) against llama.cpp's own
(``llama_sampler_init_infill`` through llama-cpp-python's bindings), on a real vocabulary: an F32 GGUF named by
``EDGESDK_INFILL_GGUF`` (e.g. SmolLM2's), skipped without it. llama.cpp runs in a subprocess (it can fault on some
CPUs); it reads the token texts (``llama_token_to_piece`` without special rendering), the EOG ids and the EOT token
of the vocabulary, picks candidate sets rich in tokens that begin one another, and applies its sampler; the port is
given the same texts and must keep the same candidates, with the same logits and probabilities.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgesdk.runtime.infill_sampler import infill_apply

pytestmark = pytest.mark.benchmark

LLAMA_INFILL = r"""
import ctypes, json, sys
import numpy as np
import llama_cpp as L

L.llama_backend_init()
params = L.llama_model_default_params()
params.vocab_only = True
model = L.llama_model_load_from_file(sys.argv[1].encode(), params)
vocab = L.llama_model_get_vocab(model)
count = L.llama_vocab_n_tokens(vocab)
buf = ctypes.create_string_buffer(1024)
texts = []
for token in range(count):
    size = L.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
    texts.append(buf.raw[:size].hex())
eog = [token for token in range(count) if L.llama_vocab_is_eog(vocab, token)]
eot = L.llama_vocab_eot(vocab)
eot = eot if eot >= 0 else L.llama_vocab_eos(vocab)
rng = np.random.default_rng(41)
by_text = sorted(range(count), key=lambda token: bytes.fromhex(texts[token]))
trials = []
for trial in range(300):
    stem = bytes.fromhex(texts[int(rng.integers(count))])[:int(rng.integers(1, 3))]
    family = [token for token in by_text if bytes.fromhex(texts[token]).startswith(stem)] if stem else []
    picked = set(rng.choice(family, min(len(family), int(rng.integers(1, 12))), replace=False).tolist()) if family else set()
    picked |= set(rng.choice(count, int(rng.integers(1, 30)), replace=False).tolist())
    if rng.random() < 0.5:
        picked |= set(rng.choice(eog, 1).tolist())
    ids = sorted(int(token) for token in picked)
    logits = rng.normal(0, float(rng.choice([0.3, 1.0, 3.0])), len(ids)).astype(np.float32)
    data = (L.llama_token_data * len(ids))(*[L.llama_token_data(token, float(logit), 0.0) for token, logit in zip(ids, logits)])
    array = L.llama_token_data_array(data, len(ids), -1, False)
    sampler = L.llama_sampler_init_infill(vocab)
    L.llama_sampler_apply(sampler, ctypes.byref(array))
    L.llama_sampler_free(sampler)
    kept = [(data[i].id, data[i].logit, data[i].p) for i in range(array.size)]
    trials.append({"ids": ids, "logits": logits.tolist(), "kept": kept})
print(json.dumps({"texts": texts, "eog": eog, "eot": eot, "trials": trials}))
"""


@pytest.fixture(scope="module")
def llama_cpp_runs():
    pytest.importorskip("llama_cpp")
    gguf = os.environ.get("EDGESDK_INFILL_GGUF")
    if not gguf or not Path(gguf).is_file():
        pytest.skip("EDGESDK_INFILL_GGUF names no GGUF file (an F32 GGUF of a model, e.g. SmolLM2's)")
    done = subprocess.run([sys.executable, "-c", LLAMA_INFILL, gguf], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_the_port_keeps_what_llama_cpp_s_infill_sampler_keeps(llama_cpp_runs):
    texts = [bytes.fromhex(text) for text in llama_cpp_runs["texts"]]
    eog, eot = set(llama_cpp_runs["eog"]), llama_cpp_runs["eot"]
    outcomes = set()
    for trial in llama_cpp_runs["trials"]:
        ids, logits, p = infill_apply(trial["ids"], trial["logits"], texts, eog, eot)
        kept = trial["kept"]
        assert ids.tolist() == [token for token, _, _ in kept], trial
        assert logits.tolist() == [logit for _, logit, _ in kept]
        fallback = ids.tolist() == [eot] and logits.tolist() == [1.0]
        if not fallback:  # the fallback's p llama.cpp leaves as it was (its draw sets it to 1)
            assert p.tolist() == pytest.approx([prob for _, _, prob in kept], rel=1e-5, abs=1e-7)
        outcomes.add("eot" if fallback else "eog" if all(int(t) in eog for t in ids) else "text")
    assert outcomes == {"eot", "eog", "text"}
