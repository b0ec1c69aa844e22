"""``edgesdk eval`` reads an option's name with '_' for '-', as llama.cpp's tools do (common/arg.cpp) and as ``run``,
``embed`` and ``serve`` already did (cli_llama.LLAMA_OPTION_NAMES): llama-perplexity scripts' ``--max_chars``,
``--ppl_stride`` or ``--kl_divergence`` were "No such option" (only --ppl_stride had a hand-written alias)."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_cli import flat, invoke
from tests.unit.test_eval53 import text_file  # noqa: F401  (a fixture)


def _scored(bundle, text, *options) -> dict:
    result = invoke("eval", bundle, "-f", text, "--method", "llama-perplexity", "-t", 1, "--json", *options)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_eval_reads_underscores_in_its_option_names_as_dashes(tiny_bundle, text_file):  # noqa: F811
    dashes = _scored(tiny_bundle.path, text_file, "--ctx-size", 16, "--ppl-stride", 4, "--max-chars", 0)
    underscores = _scored(tiny_bundle.path, text_file, "--ctx_size", 16, "--ppl_stride=4", "--max_chars", 0)
    assert underscores == dashes
    assert dashes["ppl_stride"] == 4


@pytest.mark.parametrize("spelling", ["--kl_divergence", "--kl-divergence"])
def test_an_underscore_flag_is_that_flag_refused_as_it_is(tiny_bundle, text_file, spelling):  # noqa: F811
    result = invoke("eval", tiny_bundle.path, "-f", text_file, spelling)
    assert result.exit_code == 2
    said = flat(result.output)
    assert "No such option" not in said
    assert "Invalid value for --kl-divergence" in said, said
    assert "add --reference" in said


def test_eval_help_names_ppl_stride_once():
    result = invoke("eval", "--help")
    assert result.exit_code == 0
    assert "--ppl-stride" in result.output
    assert "--ppl_stride" not in result.output
