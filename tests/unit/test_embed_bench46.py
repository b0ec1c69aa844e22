"""``edgesdk embed`` and ``edgesdk bench`` checked against llama.cpp's llama-embedding and llama-bench."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from edgesdk.cli import main
from edgesdk.cli_embed import _inputs


def test_a_file_keeps_its_line_ends_as_llama_embedding_reads_them(tmp_path):
    # llama.cpp's -f reads the file's bytes (an ifstream: no newline translation on Linux) and drops one trailing "\n"
    text_file = tmp_path / "crlf.txt"
    text_file.write_bytes(b"first passage\r\nsecond passage\r\n")
    assert [text for text, _ in _inputs((), text_file, "\r\n")] == ["first passage", "second passage\r"]
    assert [text for text, _ in _inputs((), text_file, "\n")] == ["first passage\r", "second passage\r"]
    text_file.write_bytes(b"50%\r100% done\n")  # a lone carriage return ends no line
    assert [text for text, _ in _inputs((), text_file, "\n")] == ["50%\r100% done"]


def test_a_crlf_file_split_at_crlf_embeds_each_line(tiny_bundle, tmp_path):
    text_file = tmp_path / "crlf.txt"
    text_file.write_bytes(b"The quick brown fox\r\nA cold winter night")
    result = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-f", str(text_file),
                                       "--embd-separator", "\r\n", "--embd-output-format", "array"])
    assert result.exit_code == 0, result.output
    rows = np.asarray(json.loads(result.stdout))
    assert rows.shape[0] == 2
    single = CliRunner().invoke(main, ["embed", str(tiny_bundle.path), "--threads", "1", "-p", "A cold winter night",
                                       "--embd-output-format", "array"])
    np.testing.assert_allclose(rows[1], json.loads(single.stdout)[0], atol=1e-7)


def test_bench_json_carries_llama_bench_s_n_depth():
    # llama-bench's rows key a test by n_prompt, n_gen and n_depth (-d, the tokens in the cache before it); every
    # test here starts from an empty cache, so a row read as llama-bench's has depth 0
    from edgesdk.runtime.bench import BenchResult

    for test in ("pp16", "tg8"):
        body = BenchResult(test, int(test[2:]), (100.0, 120.0), (0.16, 0.1333)).to_json()
        assert body["n_depth"] == 0
        assert (body["n_prompt"] + body["n_gen"], body["n_depth"]) == (int(test[2:]), 0)
