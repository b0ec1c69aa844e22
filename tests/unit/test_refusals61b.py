"""llama.cpp's sampler options judged as edgesdk serve judges a request's fields: XTC is off with --xtc-threshold
above 0.5 and DRY with --dry-penalty-last-n 0 (serve.api.sampler_off reads xtc_threshold and dry_penalty_last_n
beside them), where each option was judged alone and refused; their numbers read as std::stoi / std::stof read them
(Python's int and float took '٠', '0_0' and 'infinity'); -hf's fix downloads the one quantization asked for, where
'hf download ORG/NAME' fetched every one in the repository, and says edgesdk downloads nothing from the Hub."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_llama import stof_number
from edgesdk.serve.api import adaptive_p_off, sampler_off
from tests.unit.test_refusals61 import _kept


def _invoke(tmp_path, *args: str, command: str = "run"):
    """``command`` on a bundle that does not exist: parsing the options comes first, the missing bundle after."""
    extra = ("-p", "hi") if command == "run" else ()
    result = CliRunner().invoke(main, [command, str(tmp_path / "no-bundle"), *args, *extra])
    return result, " ".join(result.output.split())


# a sampler turned on by its own option and left off by another's value, as llama.cpp's sampler reads them
OFF_BY_COMPANION = [
    ["--xtc-probability", "0.5", "--xtc-threshold", "0.6"],
    ["--xtc-threshold", "0.6", "--xtc-probability", "0.5"],
    ["--xtc-probability=0.5", "--xtc-threshold=0.9"],
    ["--xtc_threshold=1", "--xtc_probability", "1"],
    ["--dry-multiplier", "0.8", "--dry-penalty-last-n", "0"],
    ["--dry-penalty-last-n", "0", "--dry-multiplier", "0.8"],
    ["--dry-multiplier=0.8", "--dry-penalty-last-n=0"],
    ["--dry_penalty_last_n=-0", "--dry_multiplier", "2"],
    # the last value given is the one llama.cpp reads
    ["--xtc-threshold", "0.1", "--xtc-probability", "0.5", "--xtc-threshold", "0.6"],
]


@pytest.mark.parametrize("args", OFF_BY_COMPANION)
@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_sampler_left_off_by_another_option_is_taken(capsys, command, args):
    """--xtc-probability 0.5 --xtc-threshold 0.6 and --dry-multiplier 0.8 --dry-penalty-last-n 0 were refused: the
    sampler does nothing then, in llama.cpp and in edgesdk serve's API alike."""
    kept, notes = _kept(command, args, capsys)
    assert kept == []
    sampler = "--xtc" if "xtc" in "".join(args) else "--dry"
    assert f"edgesdk: {sampler}" in notes, notes
    assert "changes nothing here" in notes, notes


@pytest.mark.parametrize(("args", "flag", "fix"), [
    (["--xtc-probability", "0.5", "--xtc-threshold", "0.5"], "--xtc-probability",
     "pass --xtc-probability 0 (off) or leave it out, or pass --xtc-threshold above 0.5, e.g. 0.6 (off too)"),
    # 0.50000001 is 0.5 as a float, as std::stof reads it: XTC is on
    (["--xtc-threshold=0.50000001", "--xtc-probability=0.5"], "--xtc-probability", "--xtc-threshold above 0.5"),
    (["--xtc-probability", "0.5", "--dry-penalty-last-n", "0"], "--xtc-probability", "--xtc-threshold above 0.5"),
    (["--dry-multiplier", "0.8", "--dry-penalty-last-n", "-1"], "--dry-multiplier",
     "pass --dry-multiplier 0 (off) or leave it out, or pass --dry-penalty-last-n 0 (off too)"),
    (["--dry-penalty-last-n", "0", "--dry-multiplier", "0.8", "--dry-penalty-last-n", "64"], "--dry-multiplier",
     "--dry-penalty-last-n 0"),
    (["--dry-multiplier=0.8", "--xtc-threshold=0.6"], "--dry-multiplier", "--dry-penalty-last-n 0"),
])
@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_sampler_another_option_leaves_on_is_refused(tmp_path, command, args, flag, fix):
    result, said = _invoke(tmp_path, *args, command=command)
    assert result.exit_code == 2, said
    assert f"'{flag}' (llama.cpp's {flag})" in said, said
    assert "and edgesdk has no" in said, said
    assert fix in said, said


@pytest.mark.parametrize("command", ["embed", "eval", "bench"])
def test_where_nothing_is_sampled_the_other_option_leaves_it_off_too(tmp_path, capsys, command):
    result, said = _invoke(tmp_path, "--xtc-probability", "0.5", command=command)
    assert result.exit_code == 2, said
    assert (f"is 0.5, and edgesdk {command} samples no tokens: pass --xtc-probability 0 (off) or leave it out, or "
            "pass --xtc-threshold above 0.5, e.g. 0.6 (off too)") in said, said
    kept, _ = _kept(command, ["--xtc-probability", "0.5", "--xtc-threshold", "0.7"], capsys)
    assert kept == []


def test_a_companion_that_is_no_number_is_refused_as_itself(tmp_path):
    """The threshold is checked before the probability that reads it, whichever comes first."""
    result, said = _invoke(tmp_path, "--xtc-probability", "0.5", "--xtc-threshold", "٠.6")
    assert result.exit_code == 2, said
    assert "'٠.6' is not a number, which llama.cpp's --xtc-threshold takes" in said, said


@pytest.mark.parametrize(("field", "option", "companion", "value", "other"), [
    ("xtc_probability", "--xtc-probability", "--xtc-threshold", "0.5", "0.6"),
    ("xtc_probability", "--xtc-probability", "--xtc-threshold", "0.5", "0.5"),
    ("xtc_probability", "--xtc-probability", "--xtc-threshold", "-0.5", "0.1"),
    ("dry_multiplier", "--dry-multiplier", "--dry-penalty-last-n", "0.8", "0"),
    ("dry_multiplier", "--dry-multiplier", "--dry-penalty-last-n", "0.8", "-1"),
    ("dry_multiplier", "--dry-multiplier", "--dry-penalty-last-n", "0", "64"),
    ("typical_p", "--typical", None, "1.5", None), ("typical_p", "--typical", None, "0.9", None),
    ("top_n_sigma", "--top-nsigma", None, "0", None), ("top_n_sigma", "--top-nsigma", None, "1", None),
    ("dynatemp_range", "--dynatemp-range", None, "-0.5", None), ("mirostat", "--mirostat", None, "2", None),
    ("mirostat", "--mirostat", None, "0", None),
])
def test_the_command_line_and_the_api_judge_alike(capsys, field, option, companion, value, other):
    """One rule: the option is taken exactly where a request with those fields is taken by edgesdk serve."""
    args = [option, value] + ([companion, other] if companion else [])
    body = {field: float(value) if field != "mirostat" else int(value)}
    if companion:
        body[companion[2:].replace("-", "_")] = int(other) if "last-n" in companion else float(other)
    try:
        _kept("serve", args, capsys)
        taken = True
    except click.BadParameter:
        taken = False
    assert taken is sampler_off(field, body[field], body), (args, body)


@pytest.mark.parametrize(("value", "off"), [("-0.01", True), ("0", False), ("0.3", False)])
def test_adaptive_target_is_judged_by_the_api_s_rule(capsys, value, off):
    try:
        _kept("run", ["--adaptive-target", value], capsys)
        taken = True
    except click.BadParameter:
        taken = False
    assert taken is off is adaptive_p_off(float(value))


@pytest.mark.parametrize(("args", "said"), [
    # other scripts' digits and '_' between digits: int() and float() read them, std::stoi / std::stof do not
    (["--mirostat", "٠"], "'٠' is not a whole number, which llama.cpp's --mirostat takes"),
    (["--mirostat", "0_0"], "'0_0' is not a whole number, which llama.cpp's --mirostat takes"),
    (["--typical", "infinity"], "'infinity' is not a number, which llama.cpp's --typical takes"),
    (["--typical", "nan"], "'nan' is not a number, which llama.cpp's --typical takes"),
    (["--typical-p", "1_0"], "'1_0' is not a number, which llama.cpp's --typical-p takes"),
    (["--dry-multiplier", "٠"], "'٠' is not a number, which llama.cpp's --dry-multiplier takes"),
    (["--top-nsigma", "-1e39"], "'-1e39' is not a number, which llama.cpp's --top-nsigma takes"),  # past a float
    (["--dynatemp-range", "1e-50"], "'1e-50' is not a number, which llama.cpp's --dynatemp-range takes"),
    (["--mirostat-lr", "0_1"], "'0_1' is not a number, which llama.cpp's --mirostat-lr takes"),
    (["--xtc-threshold", "inf"], "'inf' is not a number, which llama.cpp's --xtc-threshold takes"),
])
def test_a_number_std_stoi_or_stof_does_not_read_is_refused(tmp_path, args, said):
    result, output = _invoke(tmp_path, *args)
    assert result.exit_code == 2, output
    assert said in output, output


@pytest.mark.parametrize(("flag", "value"), [("--mirostat", " 0 "), ("--mirostat", "+0"), ("--mirostat", "-0"),
                                             ("--typical", "1e0"), ("--typical", "+1."), ("--top-nsigma", "-.5"),
                                             ("--xtc-probability", "0E5"), ("--dry-multiplier", " 0.0")])
def test_a_number_std_stoi_or_stof_reads_is_taken(capsys, flag, value):
    kept, notes = _kept("run", [flag, value], capsys)
    assert kept == []
    assert f"edgesdk: {flag} is accepted" in notes


@pytest.mark.parametrize(("text", "number"), [("0.5", 0.5), (" -2 ", -2.0), ("1e3", 1000.0), (".25", 0.25),
                                              ("3.", 3.0), ("0.1", 0.10000000149011612), ("0.50000001", 0.5),
                                              ("٣", None), ("1_0", None), ("inf", None), ("-Infinity", None),
                                              ("nan", None), ("1e39", None), ("1e-40", None), ("0x1p3", None),
                                              ("", None), ("+-1", None), ("1e", None), ("\u20031", None)])
def test_stof_number_reads_what_std_stof_reads_as_a_float(text, number):
    assert stof_number(text) == number


def test_a_sampler_option_given_twice_reads_the_companion_s_last_value(capsys):
    kept, _ = _kept("run", ["--dry-penalty-last-n", "64", "--dry-penalty-last-n", "0", "--dry-multiplier", "1"],
                    capsys)
    assert kept == []


@pytest.mark.parametrize(("args", "include", "repo"), [
    (["-hf", "bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0"], '"*Q8_0*.gguf"', "bartowski/Llama-3.2-1B-Instruct-GGUF"),
    (["--hf-repo=org/name:q4_k_m"], '"*Q4_K_M*.gguf"', "org/name"),
    (["-hfr", "org/name:bf16"], '"*bf16*.gguf"', "org/name"),
    (["-hf=org/name"], '"*QUANT*.gguf"', "org/name"),
    (["-hf"], '"*QUANT*.gguf"', "ORG/NAME"),
    (["-hf", "not a repo"], '"*QUANT*.gguf"', "ORG/NAME"),
])
@pytest.mark.parametrize("command", ["run", "serve"])
def test_hf_downloads_the_one_quantization(tmp_path, command, args, include, repo):
    """'hf download ORG/NAME --local-dir DIR' fetched every quantization of a GGUF repository (tens of GB)."""
    result, said = _invoke(tmp_path, *args, command=command)
    assert result.exit_code == 2, said
    assert "edgesdk downloads nothing from the Hub: download" in said, said
    assert "downloads no model" not in said, said
    assert f"'hf download {repo} --include {include} --local-dir DIR'" in said, said
    assert "'edgesdk build --model DIR/FILE.gguf'" in said, said
    assert ("(QUANT: the quantization" in said) is ("QUANT*" in include), said


def test_hf_file_names_the_file_given(tmp_path):
    result, said = _invoke(tmp_path, "-hff", "model-Q8_0.gguf")
    assert result.exit_code == 2, said
    assert ("edgesdk downloads nothing from the Hub: download the file with 'hf download ORG/NAME model-Q8_0.gguf "
            "--local-dir DIR', build a bundle from it with 'edgesdk build --model DIR/model-Q8_0.gguf'") in said, said
