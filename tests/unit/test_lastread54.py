"""What the last read of this change found: an earlier error line put before the tail's own, a tuple of text
taken for text, and a hung vcgencmd given the group advice."""

from __future__ import annotations

import shutil

import pytest

from edgesdk.deploy.session import stderr_tail
from edgesdk.errors import ProfileError
from edgesdk.profile import get_profile
from edgesdk.thermal.sensors import detect_sensors
from tests.unit.test_sensors54 import _pi_tree, _script


def test_a_tail_that_holds_its_error_line_gets_no_earlier_one_put_before_it():
    stderr = "\n".join(["error: old", "a", "b", "c", "error: real", "fix: x", *(f"l{i}" for i in range(7))])
    tail = stderr_tail(stderr, lines=10)
    assert tail[0] == "c"
    assert "error: real" in tail
    assert "error: old" not in tail
    cut = stderr_tail("\n".join(["error: only", *(f"l{i}" for i in range(12))]), lines=10)
    assert cut[:2] == ["error: only", "  ... (2 more lines)"]


def test_a_number_for_a_tuple_of_text_is_not_told_to_quote_a_version(tmp_path):
    profile = get_profile("rpi5").model_dump(mode="json")
    profile["thermal"]["zones"] = 5
    path = tmp_path / "board.yaml"
    path.write_text(__import__("yaml").safe_dump(profile))
    with pytest.raises(ProfileError, match="zones") as refused:
        get_profile(str(path))
    assert "3.10" not in str(refused.value)


def test_a_hung_vcgencmd_is_not_given_the_group_advice(tmp_path):
    bin_dir = tmp_path / "bin"
    _script(bin_dir, "sleep 30\n")
    _, _, notes = detect_sensors(["cpu-thermal"], _pi_tree(tmp_path / "thermal"), use_jtop=False,
                                 which=lambda name: shutil.which(name, path=str(bin_dir)))
    assert len(notes) == 1
    assert "did not answer within its timeout" in notes[0]
    assert "usermod" not in notes[0]


def test_the_llama_option_name_rule_leaves_a_choice_of_numbers_as_it_is():
    """click 8.1 passes a Choice's integer choices (serve's --reasoning-budget -1|0) through the context's
    token_normalize_func: ``-1 .replace`` raised AttributeError at every serve invocation."""
    from edgesdk.cli_llama import LLAMA_OPTION_NAMES

    normalize = LLAMA_OPTION_NAMES["token_normalize_func"]
    assert normalize(-1) == -1
    assert normalize("--n_predict") == "--n-predict"


def test_a_streamed_tool_call_whose_template_refuses_the_messages_is_the_calls_request_error(tiny_bundle):
    """The streamed answer renders the chat when it is made (the reasoning splitter, the tools' think block): a
    template's refusal escaped as the server's ApiError there, while the same request unstreamed is a
    RequestError."""
    import edgesdk
    from edgesdk.api import RequestError
    from tests.unit.test_serve_think54 import TOOLS

    with edgesdk.load(tiny_bundle.path) as model:
        tokenizer = model.runtime.tokenizer
        tokenizer.template_source = "{{ raise_exception('No user query found in messages.') }}<think>"
        tokenizer._template = None
        for stream in (False, True):
            with pytest.raises(RequestError, match="No user query"):
                model.create_chat_completion([{"role": "user", "content": "hi"}], tools=TOOLS, stream=stream)


@pytest.mark.parametrize("option", [["--slots"], ["--threads-http", "4"], ["--webui"], ["--path", "www"]])
def test_llama_servers_http_options_are_refused_by_the_commands_that_serve_nothing(tiny_bundle, option):
    """The table of llama.cpp's options is shared by run, embed, eval and bench: llama-server's HTTP options were
    taken there with notes about GET /slots, or refused as "edgesdk serve has no web UI"."""
    from tests.unit.test_cli import invoke

    result = invoke("run", str(tiny_bundle.path), "-p", "hi", "-n", "1", *option)
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "an option of llama-server's HTTP server, and edgesdk run serves nothing" in said


def test_a_token_that_opens_and_closes_the_block_is_held_to_what_may_follow_the_tag():
    """A token holding <think>, </think> and then JSON skipped the tools' constraint: what follows </think> in the
    token that opens the block gets the rule it gets in the block."""
    from tests.unit.test_serve_mend54 import _constraint

    vocab = [bytes([b]) for b in range(256)] + [b'<think></think>{"x', b"<think></think>\n"]
    constraint = _constraint(opened=False, vocab=vocab)
    assert not constraint.allows(256)
    assert constraint.allows(257)
