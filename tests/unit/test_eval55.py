"""Evaluation review 55 (edgesdk/evaluate.py, edgesdk/cli_eval.py); each test failed before its change.

- A ``ppl_stride`` with a context below 2 was refused as a stride "outside 1 .. 0", its fix "pass a ppl_stride of 1
  to 0"; and context 2 with ppl_stride 1, which perplexity_v2 scores (the last token of each 2-token window), was
  refused with the chunk rule ("needs context >= 3"), which --ppl-stride does not follow. The context is now named
  as too short, and context 2 scores what perplexity_v2 scores.
- eval's --ppl-stride help and the module docstring gave llama-perplexity's strided context as
  ``(-b / -c) * -c + N/2``: llama-perplexity takes ``max(1, -b / -c)`` sequences, so with its default -b 2048, -c
  4096 gives 4096 + N/2, where the formula gave N/2.
- ``eval --reference`` for a bundle built with a PEFT adapter whose directory is gone named the directory as "the
  adapter's weights" and told to put back "<directory name> of sha256 ...", the sha256 of its weights file; it now
  names the weights file, as it does where the directory is still there.
- ``eval --multiple-choice -bf FILE``, the command line its help gives as llama-perplexity's, was refused ("-bf is
  llama.cpp's --binary-file, which edgesdk eval does not have: leave it out"); -bf / --binary-file is now --text, as
  -f is. llama-perplexity's ``--file FNAME`` (the long name of -f) was "No such option".
- llama-perplexity's ``--kl-divergence-base FNAME`` was "No such option ... Did you mean '--kl-divergence'?", which
  here needs --reference and reads no file; it was then refused by its own name, and is now eval's own option
  (tests/unit/test_kl_base64.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgesdk.evaluate
from edgesdk.cli_eval import _recorded_adapters
from edgesdk.errors import ModelSourceError
from edgesdk.evaluate import LLAMA_PERPLEXITY, PerplexityConfig, perplexity, windows
from tests.unit.test_accuracy_files39 import MC_TASKS, multiple_choice_file
from tests.unit.test_cli import invoke
from tests.unit.test_eval54 import _perplexity_v2, _scorer


@pytest.mark.parametrize("context", [0, 1])
def test_a_context_too_short_for_any_ppl_stride_is_named_as_such(context):
    with pytest.raises(ValueError, match="too short") as raised:
        PerplexityConfig(context=context, method=LLAMA_PERPLEXITY, ppl_stride=1)
    said = str(raised.value)
    assert f"context {context} is too short" in said
    assert "pass a context of 2 or more" in said
    assert f"1 .. {context - 1}" not in said


def test_a_two_token_context_scores_what_perplexity_v2_scores():
    tokens = [int(t) for t in np.random.default_rng(3).integers(1, 11, 9)]
    config = PerplexityConfig(context=2, method=LLAMA_PERPLEXITY, ppl_stride=1)
    assert windows(tokens, config) == [(i, i + 2, 1) for i in range(7)]
    found = perplexity(_scorer([]), tokens, config, bos_id=0)
    ppl, count, spans = _perplexity_v2(_scorer([]), tokens, 2, 1)
    assert (found.tokens_scored, found.windows) == (count, spans) == (7, 7)
    assert found.perplexity == pytest.approx(ppl, rel=1e-12)


def test_the_strided_context_is_given_as_llama_perplexity_creates_it():
    result = invoke("eval", "--help")
    assert result.exit_code == 0
    said = "".join(result.output.split())  # click wraps the help anywhere
    assert "max(1,-b/-c)*-c+N/2" in said
    assert "4096+N/2" in said
    assert "(-b/-c)*-c" not in said.replace("max(1,-b/-c)*-c", "")
    module = "".join(edgesdk.evaluate.__doc__.split())
    assert "max(1,-b/-c)*-c+N/2" in module
    assert "4096+N/2" in module


def test_a_peft_adapter_whose_directory_is_gone_is_named_by_its_weights_file(tmp_path):
    gone = tmp_path / "my-adapter"
    record = {"path": str(gone), "form": "peft", "file": "adapter_model.safetensors", "sha256": "ab" * 32,
              "config_sha256": "cd" * 32, "scale": 1.0}
    with pytest.raises(ModelSourceError) as raised:
        _recorded_adapters([record], Path("bundle"))
    error = raised.value
    assert f"weights {gone / 'adapter_model.safetensors'} is not here" in error.problem
    assert "(adapter_model.safetensors of sha256 abababababababab...)" in error.fix
    assert f"back at {gone}" in error.fix


@pytest.mark.parametrize("spelling", [("-bf",), ("--binary-file",), ("--binary-file={}",)])
def test_eval_multiple_choice_reads_llama_perplexity_s_binary_file_option(tiny_bundle, tmp_path, spelling):
    tasks = tmp_path / "mc.bin"
    tasks.write_bytes(multiple_choice_file(MC_TASKS))
    given = [part.format(tasks) for part in spelling] + ([] if "=" in spelling[0] else [str(tasks)])
    result = invoke("eval", tiny_bundle.path, "--multiple-choice", *given, "--json", "-t", 1)
    assert result.exit_code == 0, result.output
    expected = invoke("eval", tiny_bundle.path, "--multiple-choice", "--text", tasks, "--json", "-t", 1)
    assert result.stdout == expected.stdout


def test_eval_reads_llama_perplexity_s_long_file_option(tiny_bundle, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the river ran past the old mill where seven ravens sat " * 6, encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--file", text, "--context", 16, "--json")
    assert result.exit_code == 0, result.output
    expected = invoke("eval", tiny_bundle.path, "-f", text, "--context", 16, "--json")
    assert result.stdout == expected.stdout
