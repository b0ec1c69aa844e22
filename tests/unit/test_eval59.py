"""Evaluation review 59 (edgesdk/cli_eval.py); each test failed before its fix.

- ``eval --method llama-perplexity -f /dev/stdin`` (or ``-f <(zcat wiki.raw.gz)``) read the file twice, once to check
  it was UTF-8 and once for its bytes as llama-perplexity's -f reads them: the second read of the pipe found nothing,
  and the run was refused as "--text /dev/stdin has nothing to score: its 0 characters are empty", where
  llama-perplexity -f /dev/stdin scores the text. The bytes are now read once, and refused as before where they are
  not UTF-8.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

WORDS = ("the river ran past the old mill where seven ravens sat on a gate and watched the farmers bring in "
         "their autumn wheat").split()
TEXT = "\n".join(" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40)) + " ." for i in range(12)) + "\n"


def _eval(bundle, text_file: str, stdin: bytes, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgesdk", "eval", str(bundle.path), "-f", text_file, "-c", "32",
                           "--method", "llama-perplexity", "--max-chars", "0", "--json", *options],
                          input=stdin, capture_output=True, timeout=300)


@pytest.mark.skipif(sys.platform == "win32", reason="/dev/stdin")
def test_llama_perplexity_scores_a_text_piped_on_stdin_as_the_same_text_in_a_file(tiny_bundle, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    piped = _eval(tiny_bundle, "/dev/stdin", TEXT.encode("utf-8"), "--chunks", "2")
    assert piped.returncode == 0, piped.stderr.decode()
    from_file = _eval(tiny_bundle, str(path), b"", "--chunks", "2")
    assert from_file.returncode == 0, from_file.stderr.decode()
    assert json.loads(piped.stdout)["bundle"] == json.loads(from_file.stdout)["bundle"]
    assert json.loads(piped.stdout)["characters"] == len(TEXT) - 1  # one trailing newline dropped, as -f drops it


@pytest.mark.skipif(sys.platform == "win32", reason="/dev/stdin")
@pytest.mark.parametrize(("data", "said"), [("café".encode("latin-1") + b" ok\n", "not UTF-8 text (invalid"),
                                            ("hello world\n".encode("utf-16-le"), "bytes are NUL, where utf-16le")])
def test_a_piped_text_that_is_not_utf8_is_still_refused_by_name(tiny_bundle, data, said):
    piped = _eval(tiny_bundle, "/dev/stdin", data)
    assert piped.returncode != 0
    stderr = piped.stderr.decode()
    assert "--text /dev/stdin is not UTF-8 text" in stderr
    assert said in stderr
    assert "iconv" in stderr
