"""Second reading of review 48's last commits (6ccd448..4ce6670): what a fix left reachable, or broke.

- the UTF-16/32 fix (aac64ee): a file without a byte-order mark was named UTF-32 only where two NULs sat in the
  middle of every 4 bytes, which holds for text below U+0100 alone: UTF-32 CJK or Cyrillic text (its two top bytes
  NUL) was named "utf-16le", and iconv made it UTF-8 with a NUL after every character, without an error.
- the seed (9be250d): a seed past 32 bits, a fixed seed here before, became a 400 on the OpenAI and llama-server
  routes, in the Python API and in ``run -s``; OpenAI takes any 64-bit seed, llama-server and llama-cli take it too
  (cut to 32 bits), and clients send such seeds (ComfyUI's seed widget, ``random.getrandbits(64)``).
"""

from __future__ import annotations

import pytest

from edgesdk.errors import EdgeSDKError, likely_encoding, read_utf8
from edgesdk.serve.api import RANDOM_SEED, parse_chat_request, parse_text_request

TEXTS = {"cjk": "日本語のテキストです。これはテストです。\n", "cyrillic": "Привет, мир. Это тест.\n",
         "latin": "The quíck brown fox.\n"}


@pytest.mark.parametrize("text", list(TEXTS))
@pytest.mark.parametrize("encoding", ["utf-32-le", "utf-32-be", "utf-16-le", "utf-16-be"])
def test_utf32_text_of_any_script_is_named_utf32(tmp_path, text, encoding):
    data = (TEXTS[text] * 8).encode(encoding)
    if encoding.startswith("utf-16") and text != "latin":
        return  # UTF-16 of these scripts has no NULs to tell it by: named latin1, as before (not this fix)
    named = likely_encoding(data)
    assert named == encoding.replace("-le", "le").replace("-be", "be")  # before the fix: utf-32 CJK -> utf-16le
    assert data.decode(named) == TEXTS[text] * 8  # no NUL after each character
    try:
        data.decode("utf-8")
        return  # UTF-32 Cyrillic is all bytes below 0x80: read as UTF-8 (NULs and all), never refused
    except UnicodeDecodeError:
        pass
    path = tmp_path / "text.txt"
    path.write_bytes(data)
    with pytest.raises(EdgeSDKError) as refused:
        read_utf8(path, "evaluation text")
    assert f"iconv -f {named} -t utf-8 " in refused.value.fix


@pytest.mark.parametrize("seed", [2**32, 156680208700286, 2**63 - 1])
def test_a_seed_past_32_bits_is_a_fixed_seed_as_before(seed):
    """Before 9be250d these were fixed seeds; it made them a 400 that OpenAI and llama-server do not give."""
    chat = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "seed": seed})
    assert chat.seed == seed
    assert parse_text_request({"prompt": "hi", "seed": seed}).seed == seed
    # llama.cpp's LLAMA_DEFAULT_SEED stays a random seed, and -1 too
    assert parse_text_request({"prompt": "hi", "seed": 4294967295}).seed == RANDOM_SEED
    assert parse_text_request({"prompt": "hi", "seed": -1}).seed == RANDOM_SEED


def test_run_s_takes_a_seed_past_32_bits(tiny_bundle):
    from tests.unit.test_cli import assert_ok, invoke

    result = invoke("run", tiny_bundle.path, "--prompt", "hello", "-n", 2, "--threads", 1, "--temperature", 0.8,
                    "-s", 2**40)
    assert_ok(result)  # before the fix: exit 2, "2**40 is not in the range -1<=x<=4294967295"


def test_a_runtime_only_restart_that_fails_without_an_earlier_runtime_says_so(monkeypatch):
    """d937d28 restarts the unit where a redeploy of the current release switched runtime/current alone. Where the
    board had no runtime before (runtime_key None) and the unit does not come up, the error said "there is no
    earlier release to go back to", about a release that never moved: it names the runtime now."""
    from edgesdk.deploy import orchestrate, service
    from edgesdk.deploy.remote import BoardRefusal
    from edgesdk.deploy.transport import DeployError

    def refused(board):
        raise BoardRefusal("the user service edgesdk-serve did not come up", "read its journal")

    monkeypatch.setattr(service, "restart_after_switch", refused)
    with pytest.raises(DeployError) as failed:
        orchestrate.restart_unit_after_switch(object(), None, "abc", "abc", None, None, {})
    problem = failed.value.problem
    assert problem.startswith("the user service edgesdk-serve did not come up\n")
    assert "no earlier release" not in problem  # before the fix: "there is no earlier release to go back to"
    assert "releases/abc (smoke-tested) stays current, as it was" in problem
    assert "the board had no runtime before it to go back to" in problem
    assert failed.value.fix == "read its journal"
    # a first deploy (no release before) still says there is no earlier release
    with pytest.raises(DeployError, match="there is no earlier release to go back to"):
        orchestrate.restart_unit_after_switch(object(), None, None, "abc", None, None, {})
