"""Second reading of cli_llama.LlamaCommand (04bf3df): llama.cpp's options read by name before click parses.

``--help`` among the arguments made LlamaCommand drop llama.cpp's options unread (click shows the help and runs
nothing), but it looked for a help name among all the arguments, also where one is another option's value
(``-p -h``: the prompt "-h", ``-r --help``: a reverse prompt) or follows ``--``. click then runs the command with
no help shown, and llama.cpp's options had been dropped unread: ``-c 4096`` against a 256-token bundle ran without
a word (it is refused without the prompt), ``-hf ORG/NAME`` left its value as an unexpected extra argument instead
of being refused by name, ``-np 4`` was accepted.
"""

from __future__ import annotations

from tests.unit.test_cli import invoke


def test_a_prompt_that_reads_like_help_does_not_turn_off_the_check_of_llama_cpp_ctx_size(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "-h", "--raw", "-n", "2", "-c", "4096")
    assert result.exit_code == 2, result.output  # before the fix: 0, the answer written, -c 4096 never checked
    assert "'-c' (llama.cpp's --ctx-size)" in result.stderr
    assert "is 4096, and the context of" in result.stderr
    assert "256 tokens" in result.stderr


def test_a_reverse_prompt_reading_like_help_leaves_llama_cpp_options_refused_by_name(tiny_bundle):
    result = invoke("run", tiny_bundle.path, "-p", "hi", "-r", "--help", "-hf", "org/model")
    assert result.exit_code == 2, result.output
    # before the fix: "Got unexpected extra argument (org/model)"
    assert "-hf is llama.cpp's --hf-repo, which edgesdk run does not have" in result.stderr
    assert "unexpected extra argument" not in result.stderr


def test_help_still_shows_the_help_with_llama_cpp_options_anywhere(tiny_bundle):
    for args in (("-hf", "org/model", "--help"), ("-ngl", "99", "-h"), ("-c", "4096", "-p", "x", "--help")):
        result = invoke("run", tiny_bundle.path, *args)
        assert result.exit_code == 0, result.output
        assert "Usage: edgesdk run" in result.stdout
        assert "changes nothing here" not in result.stderr


def test_help_after_double_dash_is_an_argument_not_the_help(tiny_bundle):
    result = invoke("run", "-p", "hi", "-hf", "org/model", "--", "--help")
    assert result.exit_code == 2, result.output
    assert "Usage: edgesdk run [OPTIONS]" not in result.stdout  # no help shown
    assert "-hf is llama.cpp's --hf-repo, which edgesdk run does not have" in result.stderr
