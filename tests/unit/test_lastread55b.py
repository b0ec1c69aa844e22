"""Review 55b: the export check's tolerance, the GGUF add_prefix_space refusal, and ssh warnings about keys deploy
was not given."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from edgesdk.deploy.transport import DeployError, HostSpec, SshOptions, SshTransport
from edgesdk.errors import ExportError
from edgesdk.export.validate import ValidationConfig


@pytest.mark.parametrize("atol", [float("inf"), -float("inf"), True, -1e-3], ids=["inf", "-inf", "bool", "negative"])
def test_a_tolerance_that_passes_or_fails_every_graph_is_refused(atol):
    """atol=inf made scaled_atol infinite, so every graph passed (the fault the NaN refusal was added for); True was
    taken as 1.0; a negative one fails every graph."""
    with pytest.raises(ExportError) as caught:
        ValidationConfig(atol=atol)
    assert f"ValidationConfig atol is {atol!r}" in caught.value.problem
    assert "finite number of at least 0" in caught.value.problem
    assert "atol=1e-3" in caught.value.fix


def test_numpy_numbers_are_taken_as_python_numbers():
    """np.float32(1e-3) and np.int64(2) were refused as 'expected a number' / 'an integer'; they are taken, as the
    Python numbers they hold (the build writes the config to JSON)."""
    config = ValidationConfig(prompts=np.int64(2), prompt_length=np.int32(8), decode_steps=np.int64(0),
                              atol=np.float32(1e-3))
    assert (config.prompts, config.prompt_length, config.decode_steps) == (2, 8, 0)
    assert all(type(value) is int for value in (config.prompts, config.prompt_length, config.decode_steps))
    assert type(config.atol) is float
    assert config.atol == pytest.approx(1e-3)
    assert ValidationConfig(atol=0).atol == 0.0
    json.dumps(config.__dict__)


UNKNOWN_SPLIT = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": r"\s+|\w+"}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": False}]}


def test_an_unknown_layout_with_add_prefix_space_is_refused_as_unknown_naming_the_setting_too():
    """The add_prefix_space refusal fired for any layout ending in such a ByteLevel step, one no llama.cpp regex
    matches too, whose fix (add_prefix_space false) led to the next refusal only."""
    from edgesdk.export.gguf_vocab import _pre_tokenizer_name

    with pytest.raises(ExportError) as caught:
        _pre_tokenizer_name(UNKNOWN_SPLIT, "tokenizer.json")
    assert "has no llama.cpp regex known to match it" in caught.value.problem
    assert "also has add_prefix_space true" in caught.value.problem
    assert "convert_hf_to_gguf.py" in caught.value.fix
    without = json.loads(json.dumps(UNKNOWN_SPLIT))
    without["pretokenizers"][1]["add_prefix_space"] = False
    with pytest.raises(ExportError) as caught:
        _pre_tokenizer_name(without, "tokenizer.json")
    assert "has no llama.cpp regex known to match it" in caught.value.problem
    assert "add_prefix_space true" not in caught.value.problem


def test_a_known_layout_with_add_prefix_space_is_still_refused_naming_the_setting():
    from edgesdk.export.gguf_vocab import _pre_tokenizer_name

    with pytest.raises(ExportError) as caught:
        _pre_tokenizer_name({"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}, "tokenizer.json")
    assert "ByteLevel step has add_prefix_space true" in caught.value.problem
    assert "add_prefix_space false" in caught.value.fix


def refusal(server, options: SshOptions) -> DeployError:
    board = SshTransport(HostSpec.parse(server.destination), options)
    try:
        with pytest.raises(DeployError) as info:
            board.run(["true"], timeout=60)
    finally:
        board.close()
    return info.value


def test_a_loose_key_deploy_was_not_given_is_noted_not_blamed(ssh_server, tmp_path, monkeypatch):
    """ssh warns 'Permissions 0644 ... are too open' and 'Load key' for its default keys too (an old ~/.ssh/id_rsa,
    here a key of the ssh config): where the login failed because the board holds none of the keys tried, the
    error blamed that unrelated key's mode, and the ssh-copy-id advice was gone."""
    import subprocess

    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    old = tmp_path / "id_rsa"  # an old key the board never held, in the PEM format and without its .pub: ssh
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-m", "PEM", "-N", "", "-f", str(old)],
                   check=True, capture_output=True)  # reads the private key to offer it, and warns
    old.with_name("id_rsa.pub").unlink()
    old.chmod(0o644)
    error = refusal(ssh_server, SshOptions(ssh_config="/dev/null", options=(
        f"IdentityFile={old}", f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null")))
    assert f"refused the login of user {ssh_server.user}: " in str(error)
    assert "ignored the private key" not in str(error)
    assert "ssh-copy-id" in error.fix
    assert f"ssh also skipped the private key {old} (bad permissions)" in error.fix


def test_a_loose_key_given_with_i_is_still_blamed(ssh_server, tmp_path):
    key = tmp_path / "board key"
    shutil.copyfile(ssh_server.user_key, key)
    key.chmod(0o644)
    error = refusal(ssh_server, SshOptions(identity=str(key), ssh_config="/dev/null", options=(
        f"UserKnownHostsFile={ssh_server.known_hosts}", "GlobalKnownHostsFile=/dev/null")))
    assert f"ssh ignored the private key {key} because its permissions 0644" in str(error)
    assert f"chmod 600 '{key}'" in error.fix
