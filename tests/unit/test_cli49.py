"""``edgesdk run`` against llama-cli's flag table (llama.cpp common/arg.cpp, review 49): the aliases llama-cli's
scripts pass (-n's --predict / --n-predict, -l, -j, -jf, -sysf, -md, --draft-n, --no-display-prompt), --logit-bias's
sign form read as arg.cpp reads it, llama.cpp's --draft N told apart from --draft BUNDLE, and a JSON schema file with
a UTF-8 byte-order mark, which llama.cpp's JSON parser skips."""

from __future__ import annotations

import json
import re

import pytest

from edgesdk.cli_run import _parse_logit_bias
from tests.unit.test_cli import assert_ok, flat, invoke

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _new_tokens(stderr: str) -> int:
    match = re.search(r", (\d+) new tok,", stderr)
    assert match is not None, stderr
    return int(match.group(1))


@pytest.mark.parametrize("option", ["--json-schema", "-j", "--json-schema-file", "-jf"])
def test_a_schema_file_with_a_byte_order_mark_is_read(tiny_bundle, tmp_path, option):
    """A schema saved by a Windows editor starts with EF BB BF: llama.cpp's -jf reads it (nlohmann::json skips a
    BOM), and so does run; it was refused as "Unexpected UTF-8 BOM". The answer follows the schema."""
    path = tmp_path / "schema.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(SCHEMA).encode() + b"\r\n")
    result = invoke("run", tiny_bundle.path, "-p", "x", "--raw", "-n", "200", option, path)
    assert_ok(result)
    answer = json.loads(result.stdout)
    assert isinstance(answer["a"], int)


def test_json_schema_and_json_schema_file_together_are_refused(tiny_bundle, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    both = invoke("run", tiny_bundle.path, "-p", "x", "-j", json.dumps(SCHEMA), "-jf", path)
    assert both.exit_code == 2, both.output
    assert "--json-schema and --json-schema-file both give the schema; pass one" in flat(both.stderr)
    grammar = invoke("run", tiny_bundle.path, "-p", "x", "-jf", path, "--grammar", 'root ::= "a"')
    assert grammar.exit_code == 2, grammar.output
    assert "--grammar and --json-schema-file each constrain the answer; pass one" in flat(grammar.stderr)


@pytest.mark.parametrize("alias", ["--predict", "--n-predict"])
def test_n_predict_aliases_are_the_token_limit(tiny_bundle, alias):
    """llama-cli's -n is also --predict and --n-predict (arg.cpp: {"-n", "--predict", "--n-predict"})."""
    short = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats", "-n", "5")
    long = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats", alias, "5")
    assert_ok(short)
    assert_ok(long)
    assert _new_tokens(long.stderr) == 5
    assert long.stdout == short.stdout


def test_logit_bias_sign_form_is_read_as_llama_cpp_reads_it():
    """arg.cpp: the sign, then stof of the rest, which the sign multiplies."""
    assert _parse_logit_bias("15043-inf") == (15043, float("-inf"))
    assert _parse_logit_bias("15043+1") == (15043, 1.0)
    assert _parse_logit_bias("15043-1") == (15043, -1.0)
    assert _parse_logit_bias("15043--5") == (15043, 5.0)
    assert _parse_logit_bias("15043+-5") == (15043, -5.0)
    assert _parse_logit_bias("15043 + 2") == (15043, 2.0)
    assert _parse_logit_bias("15043=-100") == (15043, -100.0)
    with pytest.raises(ValueError, match="logit_bias must be given as ID=BIAS"):
        _parse_logit_bias("15043*2")


def test_short_l_with_a_double_sign_raises_the_token(tiny_bundle, runtime):
    """-l is --logit-bias; 'ID--100' is +100 in llama.cpp (the sign times -100), so greedy takes ID every step."""
    token = runtime.tokenizer.tokenizer.encode("z", add_special_tokens=False).ids[0]
    result = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "4", "-l", f"{token}--100")
    assert_ok(result)
    assert result.stdout == "zzzz\n"


def test_system_prompt_file_is_the_system_message(tiny_bundle, tmp_path):
    """-sysf reads the system message from a file, one line end at its end dropped (arg.cpp); given with
    --system, one of them is refused."""
    path = tmp_path / "system.txt"
    path.write_text("Answer in one word.\n")
    typed = invoke("run", tiny_bundle.path, "-p", "hi", "-n", "4", "--stats", "--system", "Answer in one word.")
    read = invoke("run", tiny_bundle.path, "-p", "hi", "-n", "4", "--stats", "-sysf", path)
    alone = invoke("run", tiny_bundle.path, "-p", "hi", "-n", "4", "--stats")
    assert_ok(typed)
    assert_ok(read)
    assert read.stdout == typed.stdout
    tokens = [re.search(r"prompt (\d+) tok", result.stderr).group(1) for result in (typed, read, alone)]
    assert tokens[0] == tokens[1] != tokens[2]  # the system message is in the prompt, as typed
    both = invoke("run", tiny_bundle.path, "-p", "hi", "-sysf", path, "-sys", "x")
    assert both.exit_code == 2, both.output
    assert "--system and --system-prompt-file both give the system message; pass one" in flat(both.stderr)


def test_no_display_prompt_is_accepted(tiny_bundle):
    """Scripts pass llama-cli's --no-display-prompt; run shows only the answer anyway."""
    plain = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "4")
    quiet = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "4", "--no-display-prompt")
    assert_ok(quiet)
    assert quiet.stdout == plain.stdout


def test_model_draft_and_draft_n_aliases(tiny_bundle):
    """llama.cpp's -md / --model-draft is --draft BUNDLE here, and its --draft-n is --draft-max."""
    result = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "-n", "6", "--stats", "-md", tiny_bundle.path,
                    "--draft-n", "3")
    assert_ok(result)
    assert re.search(r"drafts \d+/\d+ taken", result.stderr), result.stderr


def test_llama_cpp_draft_count_is_told_apart_from_a_bundle(tiny_bundle):
    """llama.cpp's --draft N is the tokens drafted at a time; here --draft names the draft bundle, so a number that
    names no directory says where N goes."""
    result = invoke("run", tiny_bundle.path, "-p", "x", "--draft", "8")
    assert result.exit_code == 2, result.output
    text = flat(result.stderr)
    assert "'8' is a number, and --draft names the draft bundle here (llama.cpp's -md / --model-draft)" in text
    assert "pass --draft-max 8 with --draft BUNDLE" in text


def test_underscored_option_names_are_read_as_llama_cpp_reads_them(tiny_bundle):
    """common/arg.cpp reads '_' in an argument starting with '--' as '-', so llama.cpp's scripts pass --n_predict,
    --repeat_penalty and --top_k; run takes them as their names, and the values stay as typed."""
    dashed = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats", "--n-predict", "5",
                    "--repeat-penalty", "1.3", "--top-k", "3", "--temp", "0.7", "-s", "3")
    underscored = invoke("run", tiny_bundle.path, "-p", "The quick", "--raw", "--ignore-eos", "--stats",
                         "--n_predict", "5", "--repeat_penalty", "1.3", "--top_k", "3", "--temp", "0.7", "-s", "3")
    assert_ok(dashed)
    assert_ok(underscored)
    assert _new_tokens(underscored.stderr) == 5
    assert underscored.stdout == dashed.stdout


def test_embed_reads_underscored_option_names_and_keeps_values_as_typed(tiny_bundle):
    """llama-embedding's --embd_normalize / --embd_output_format; the text's own '_' is not touched."""
    dashed = invoke("embed", tiny_bundle.path, "-p", "x_y", "--embd-normalize", "1", "--embd-output-format", "raw")
    underscored = invoke("embed", tiny_bundle.path, "-p", "x_y", "--embd_normalize", "1", "--embd_output_format",
                         "raw")
    other = invoke("embed", tiny_bundle.path, "-p", "x-y", "--embd-normalize", "1", "--embd-output-format", "raw")
    for result in (dashed, underscored, other):
        assert_ok(result)
    assert underscored.stdout == dashed.stdout != other.stdout
    taxicab = sum(abs(float(value)) for value in underscored.stdout.split())
    assert taxicab == pytest.approx(1.0, abs=1e-4)
