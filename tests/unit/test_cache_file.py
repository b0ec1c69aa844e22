"""run --prompt-cache FILE: the KV cache kept in a file between runs (edgesdk/runtime/cache_file.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.unit.test_cli import assert_ok, invoke

PROMPT = "The tower was built for the fair of 1889 and named after its engineer. " * 3


def _run(bundle, *extra):
    result = invoke("run", bundle.path, "--prompt", PROMPT, "--raw", "-n", 8, "--threads", 1, "--stats", *extra)
    assert_ok(result)
    return result


def _cached(stderr: str) -> int:
    found = re.search(r"prompt (\d+) tok(?: \((\d+) from the cache\))?", stderr)
    assert found, stderr
    return int(found.group(2) or 0)


def test_a_second_run_takes_the_prompt_from_the_file_and_answers_the_same(tiny_bundle, tmp_path):
    path = tmp_path / "prompt.cache"
    plain = _run(tiny_bundle)
    first = _run(tiny_bundle, "--prompt-cache", path, "--prompt-cache-all")
    assert _cached(first.stderr) == 0
    assert path.is_file()
    assert not path.with_name(path.name + ".partial").exists()
    second = _run(tiny_bundle, "--prompt-cache", path, "--prompt-cache-all")
    prompt_tokens = int(re.search(r"prompt (\d+) tok", second.stderr).group(1))
    assert _cached(second.stderr) == prompt_tokens - 1  # all but the last prompt token, whose logits are needed
    assert "tokens loaded" in second.stderr
    assert first.stdout == second.stdout == plain.stdout
    with np.load(path) as data:  # prompt and answer, as llama-cli's --prompt-cache-all keeps them
        assert data["tokens"].shape[0] == prompt_tokens + 8 - 1
        assert data["cache_0"].shape[2] == data["tokens"].shape[0]


@pytest.mark.parametrize(("content", "reason"), [
    (b"PK\x03\x04 an .npz cut short", "cannot be read as a cache file"),
    ("other-bundle", "written with another bundle"),
    ("wrong-shape", "do not fit this backend's cache"),
])
def test_a_file_that_does_not_fit_is_not_loaded_and_is_rewritten(tiny_bundle, tmp_path, content, reason):
    path = tmp_path / "prompt.cache"
    _run(tiny_bundle, "--prompt-cache", path)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        with np.load(path) as data:
            arrays = {name: data[name] for name in data.files}
        if content == "other-bundle":
            arrays["bundle_id"] = np.array("0123456789abcdef")
        else:
            arrays["cache_0"] = arrays["cache_0"][:, :, :-1]
        with open(path, "wb") as out:
            np.savez(out, **arrays)
    result = _run(tiny_bundle, "--prompt-cache", path)
    assert reason in result.stderr
    assert "the next answer rewrites it" in result.stderr
    assert _cached(result.stderr) == 0
    assert "tokens loaded" in _run(tiny_bundle, "--prompt-cache", path).stderr  # rewritten whole


def test_an_unwritable_cache_path_is_an_error_naming_it(tiny_bundle, tmp_path):
    result = invoke("run", tiny_bundle.path, "--prompt", "x", "-n", 2, "--prompt-cache", tmp_path / "none" / "c")
    assert result.exit_code != 0
    assert "cannot write the prompt cache" in result.output
