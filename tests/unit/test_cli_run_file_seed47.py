"""``edgesdk run -f`` and ``-s`` read as llama-cli reads them (common/arg.cpp)."""

from __future__ import annotations

from edgesdk.cli_run import _one_prompt
from tests.unit.test_cli import assert_ok, invoke


def test_the_file_s_last_newline_is_dropped_as_llama_cli_drops_it(tmp_path):
    """An editor ends a file with a newline, which llama-cli's -f pops; one only, and only at the end."""
    path = tmp_path / "prompt.txt"
    path.write_text("first line\n\nsecond line\n\n", encoding="utf-8")
    assert _one_prompt(None, path) == "first line\n\nsecond line\n"
    path.write_text("no line end", encoding="utf-8")
    assert _one_prompt(None, path) == "no line end"
    path.write_text("escaped\\n\n", encoding="utf-8")
    assert _one_prompt(None, path) == "escaped\n"  # the escape is the prompt's, the line end the file's
    assert _one_prompt(None, path, escape=False) == "escaped\\n"


def test_seed_minus_one_is_a_random_seed_as_llama_cli_s_default(tiny_bundle):
    """llama-cli's --seed defaults to -1, "use random seed": a script passing it must run, not exit 2."""
    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 3, "--threads", 1, "-s", -1,
                    "--temperature", 0.8)
    assert_ok(result)
    assert "--seed" not in result.output


def test_negative_temperature_and_top_k_read_as_llama_cli_reads_them(tiny_bundle):
    """llama-cli clamps --temp below 0 to 0 (greedy) and takes --top-k <= 0 as off (common/arg.cpp,
    llama_sampler_top_k_impl): the same run as with 0 and 0, not a usage error."""
    base = ("run", tiny_bundle.path, "--prompt", "hello", "-n", 4, "--threads", 1, "--raw")
    clamped = invoke(*base, "--temp", -1, "--top-k", -1)
    plain = invoke(*base, "--temp", 0, "--top-k", 0)
    assert_ok(clamped)
    assert_ok(plain)
    assert clamped.stdout == plain.stdout


def test_top_k_before_in_chain_penalties_is_not_called_unused_when_greedy(tiny_bundle):
    """Greedy decoding through penalties placed after top-k takes the top token top-k kept (llama.cpp's chain), so
    --top-k changes the answer and must not be reported as not used."""
    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 2, "--threads", 1, "--temp", 0, "--top-k", 2,
                    "--samplers", "top_k;penalties;temperature", "--repeat-penalty", 1.5)
    assert_ok(result)
    assert "--top-k is not used" not in result.stderr, result.stderr
    greedy = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 2, "--threads", 1, "--temp", 0, "--top-k", 2)
    assert "--top-k is not used" in greedy.stderr
