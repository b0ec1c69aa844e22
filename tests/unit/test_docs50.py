"""README.md against the code, for what changed since b0d33b8 (llama.cpp options in run / serve / embed / eval /
bench, llama.cpp's samplers read as off, export validation's scaled bound, Winogrande's rows, Anthropic's wording of
a prompt past the context): each statement checked against the code it describes, so that a change of either
fails here. The code is the real one (click commands, the validation bound, the accuracy reader), nothing mocked.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from edgesdk.cli import main

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "README.md").read_text(encoding="utf-8")
ONE_LINE = re.sub(r"\s*\n\s*", " ", TEXT)  # the README's paragraphs with their line breaks read as spaces


def _llama_args(command_name: str, args: list[str], capsys) -> tuple[list[str], str]:
    """What cli_llama.LlamaCommand leaves of ``args`` for click to parse, and the notes it wrote on stderr."""
    command = main.commands[command_name]
    # the group's settings (help_option_names -h / --help), as the CLI gives each command's context: click keeps the
    # help option a command first made, so a context without them took -h away from later tests' --help
    with click.Context(command, info_name=command_name, **main.context_settings) as ctx:
        kept = command._llama_args(ctx, list(args))
    return kept, capsys.readouterr().err


def _taken_with_a_note() -> list[list[str]]:
    """The llama.cpp options the run row says change nothing on a board and are taken with a note, as arguments."""
    found = re.search(r"llama\.cpp options that change nothing on a board \((.*?)\) are taken with a note", ONE_LINE)
    assert found, "README.md no longer lists the llama.cpp options run takes with a note: update this test with it"
    options = []
    for code in re.findall(r"`([^`]+)`", found[1]):
        options.extend(part.split() for part in code.split("/"))
    return options


def _same_in() -> tuple[list[str], set[str], dict[str, str]]:
    """The commands the run row says take those options the same way, the options it names as exceptions, and the
    values bench takes in llama-bench's form (`-fa 0|1`: llama-bench's -fa takes a value)."""
    found = re.search(r"never read as another option's value \(the same in (.*?)\);", ONE_LINE)
    assert found, "README.md no longer says which commands take llama.cpp's options as run does: update this test"
    listed, _, exceptions = found[1].partition(", but for ")
    bench_forms = dict(re.findall(r"`(-[\w-]+) ([\w|]+)`", exceptions.partition("`bench` reads llama-bench's")[2]))
    return (re.findall(r"`(\w+)`", listed), set(re.findall(r"`(-[\w-]+)`", exceptions.split(":")[0])),
            {name: value.split("|")[-1] for name, value in bench_forms.items()})


# a value for an option the README names without one (`-ctk`/`-ctv f16`: f16 for both)
SAMPLE_VALUE = {"-ngl": "99", "-ctk": "f16"}


def test_every_option_the_readme_says_is_taken_with_a_note_is_taken_with_a_note_by_each_command_it_names(capsys):
    """The run row: llama.cpp options that change nothing on a board (`-ngl`, `-fa`, ..., `-c 0`) are taken with a
    note on stderr, "the same in `serve`, `embed`, `eval` and `bench`". `bench` reads llama-bench's options, where
    `-c` is refused, and `eval` reads `-c` as its own `--context` (llama-perplexity's -c): the README said neither."""
    commands, exceptions, bench_forms = _same_in()
    assert commands, "README.md names no command beside run"
    for command_name in ["run", *commands]:
        own = {name for param in main.commands[command_name].params for name in getattr(param, "opts", ())}
        for option in _taken_with_a_note():
            if command_name != "run" and option[0] in exceptions:
                continue
            args = option + ([SAMPLE_VALUE[option[0]]] if len(option) == 1 and option[0] in SAMPLE_VALUE else [])
            if command_name == "bench" and option[0] in bench_forms:
                args = [option[0], bench_forms[option[0]]]
            if args[0] in own:  # the command's own option (bench's --no-warmup): taken, by the command itself
                assert _llama_args(command_name, args, capsys)[0] == args
                continue
            try:
                kept, notes = _llama_args(command_name, args, capsys)
            except click.ClickException as exc:
                pytest.fail(f"README.md says edgesdk {command_name} takes {' '.join(args)} with a note, but it "
                            f"refuses it: {exc.format_message()}")
            assert kept == [], f"edgesdk {command_name} {' '.join(args)}: {kept} left for click to read"
            if option[0] != "-c":  # -c is checked against the bundle's context once it is known, without a note
                assert f"edgesdk: {option[0]} is accepted for llama.cpp's scripts" in notes, (command_name, notes)


def test_the_exceptions_the_readme_names_for_c_are_what_eval_and_bench_do(capsys):
    """"but for `-c`: `eval`'s `--context`, as llama-perplexity's `-c`, and refused by `bench`"."""
    _, exceptions, bench_forms = _same_in()
    assert "-c" in exceptions
    assert bench_forms == {"-fa": "1"}
    assert "`eval`'s `--context`, as llama-perplexity's `-c`" in ONE_LINE
    assert "refused by `bench`, whose tests' sizes are `-p` and `-n`" in ONE_LINE
    kept, _ = _llama_args("eval", ["-c", "512"], capsys)
    assert kept == ["--context", "512"]
    with pytest.raises(click.UsageError, match=r"-c is llama\.cpp's --ctx-size, which edgesdk bench does not have"):
        _llama_args("bench", ["-c", "0"], capsys)
    with pytest.raises(click.UsageError, match=r"-fa \(llama\.cpp's --flash-attn\) needs a value \(on\|off\|auto\)"):
        _llama_args("bench", ["-fa"], capsys)  # llama-bench's -fa takes 0 or 1; run's may stand alone


def test_the_builds_validation_bound_the_readme_states_is_scaled_atol():
    """The Measured table's first row named 1e-3 "the test's and the build's bound"; the build holds the logits to
    1e-3 per 10 units of the largest logit (export/validate.py scaled_atol), 3.5e-3 for SmolLM2's logits of ~35."""
    from edgesdk.export.validate import ValidationConfig, scaled_atol

    row = next(line for line in TEXT.splitlines() if line.startswith("| exported logits vs PyTorch"))
    config = ValidationConfig()
    assert scaled_atol(config, 35.0) != config.atol  # the bound scales with the logits
    assert "the build's bound" not in row, row
    assert config.atol == 1e-3
    assert "the build refuses more than 1e-3 per 10 units of the largest logit" in row, row
    assert scaled_atol(config, 10.0) == pytest.approx(config.atol)


def test_the_completion_route_names_the_samplers_it_refuses_and_says_off_is_not_one_value():
    """/completion's row said the samplers were refused "when set to anything but their off values"; llama.cpp's
    code reads a range as off (typical_p >= 1, top_n_sigma <= 0, ...), and the server takes it (serve/api.py
    sampler_off), and it named no top-n-sigma."""
    from edgesdk.serve.api import SAMPLERS_OFF, sampler_off

    taken_off = {"typical_p": 1.5, "top_n_sigma": 0.0, "dynatemp_range": -1.0, "xtc_probability": -1.0}
    for field, value in taken_off.items():
        assert value != SAMPLERS_OFF[field], field
        assert sampler_off(field, value, {}), field
    assert sampler_off("dry_multiplier", 0.8, {"dry_penalty_last_n": 0})
    sentence = re.search(r"`post_sampling_probs` refused; (.*?)\)\. The `/v1` prefix", ONE_LINE)
    assert sentence, "README.md's /completion row changed: update this test with it"
    assert "anything but their off values" not in sentence[1]
    assert "a value llama.cpp's code reads as on" in sentence[1]
    names = {"mirostat": "mirostat", "typical_p": "typical-p", "dynatemp_range": "dynamic temperature",
             "xtc_probability": "XTC", "dry_multiplier": "DRY", "top_n_sigma": "top-n-sigma"}
    assert set(names) == set(SAMPLERS_OFF)
    for field, name in names.items():
        assert name in sentence[1], f"README.md's /completion row does not name {field} ({name}) among the refused"


def test_the_winogrande_rows_llama_perplexity_drops_are_as_the_readme_says():
    """"llama.cpp's reader drops the file's last one" was true only of a file ending in one newline or none."""
    from edgesdk.accuracy import winogrande_rows_llama_drops

    rows = "0,The _ sat.,cat,dog,1\n1,The _ ran.,cat,dog,2"
    assert [winogrande_rows_llama_drops(rows + end) for end in ("", "\n", "\n\n")] == [1, 1, 0]
    assert "llama.cpp's reader drops the last row of a file ending in one newline or none" in ONE_LINE
    assert "llama.cpp's reader drops the file's last one" not in ONE_LINE


def test_anthropics_wording_of_a_prompt_past_the_context_is_the_readmes():
    """The Messages API paragraph: a prompt past the context is Anthropic's `prompt is too long: N tokens > M
    maximum`, built from the completer's own refusal (serve/completion.py) by serve/anthropic.py."""
    from edgesdk.serve.anthropic import too_long

    stated = re.search(r"a prompt past the context is Anthropic's `(prompt is too long: N tokens > M maximum)`", ONE_LINE)
    assert stated, "README.md's Anthropic paragraph does not give the wording of a prompt past the context"
    message = too_long("This model's maximum context length is 256 tokens. However, your prompt resulted in 300 "
                       "tokens: shorten the prompt", (300, 256))
    assert message.startswith(stated[1].replace("N", "300").replace("M", "256")), message


def test_every_option_of_bench_is_in_its_row_or_the_runtime_options():
    """bench took llama-bench's lists for -p, -n and -t and its own --no-warmup (39117c1); the README's row named
    neither, and the run row said bench took --no-warmup as a llama.cpp option that changes nothing."""
    command = main.commands["bench"]
    row = next(line for line in TEXT.splitlines() if line.startswith("| `edgesdk bench "))
    runtime = ONE_LINE[ONE_LINE.index("**Runtime**"):ONE_LINE.index("**Thermal**")]
    for param in command.params:
        if not isinstance(param, click.Option) or param.name == "help":
            continue
        named = [name for name in param.opts if re.search(rf"`[^`]*(?<![\w-]){re.escape(name)}(?![\w-])[^`]*`", row)]
        shared = [name for name in param.opts if f"`{name}" in runtime or f"/{name}" in runtime]
        assert named or shared, f"README.md's bench row names none of {param.opts}"
    assert "`--no-warmup`: none" in row
    assert "llama-bench's lists and ranges" in row
    assert "and its `--no-warmup` skips the warm-up" in ONE_LINE
