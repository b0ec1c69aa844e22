"""``edgesdk eval --kl-divergence-base FILE``, as llama-perplexity's: on the host, without --kl-divergence, the source
model's distributions at the scored positions written to FILE; on a board, with --kl-divergence, read back in place of
the source model (no torch) to give the statistics --reference --kl-divergence gives. It was refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgesdk.errors import EdgeSDKError
from edgesdk.evaluate import (
    PerplexityConfig,
    base_divergence,
    divergence,
    read_divergence_base,
    write_divergence_base,
)
from tests._utils.tiny import CORPUS, save_tiny_model_dir
from tests.unit.test_cli import assert_ok, flat, invoke

SETTINGS = ("--context", 64, "--max-chars", 3000, "-t", 1)


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kl64") / "text.txt"
    path.write_text("\n".join(CORPUS * 30), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def other_source(tiny_model_dir, tmp_path_factory) -> Path:
    """A model of the tiny model's shape and tokenizer with other weights: as --reference-model, a source whose
    distributions are far from the bundle's, so that the statistics compared below are not all 0."""
    return save_tiny_model_dir(tmp_path_factory.mktemp("kl64-other") / "tiny-llama", seed=1)


@pytest.fixture(scope="module")
def written(tiny_bundle, text, other_source, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("kl64-base") / "base.kld"
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference-model", other_source,
                    "--kl-divergence-base", path, "--json")
    assert_ok(result)
    said = json.loads(result.stdout)
    assert said["kl_divergence_base"]["written"] is True
    assert path.is_file()
    return path


def _run_blocked(*args: str) -> subprocess.CompletedProcess:
    """edgesdk in a fresh interpreter where importing torch or transformers fails, as on a board without them
    (through main, not the console script's entry, whose re-execution with huge pages would lift the block)."""
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
            "from edgesdk.cli import main; sys.argv = ['edgesdk', *sys.argv[1:]]; main(prog_name='edgesdk')")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parents[2])


def test_a_written_file_read_back_gives_the_statistics_of_reference_kl_divergence(tiny_bundle, text, other_source,
                                                                                    written):
    direct = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference-model", other_source,
                    "--kl-divergence", "--json")
    assert_ok(direct)
    read = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", written,
                  "--kl-divergence", "--json")
    assert_ok(read)
    direct, read = json.loads(direct.stdout), json.loads(read.stdout)
    assert direct["divergence"]["mean_kld"] > 0.05  # another model's: a comparison of something
    assert read["bundle"] == direct["bundle"]
    assert read["kl_divergence_base"]["bundle_id"] == tiny_bundle.bundle_id
    ours, theirs = read["divergence"], direct["divergence"]
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if isinstance(value, dict):
            for name, figure in value.items():
                assert ours[key][name] == pytest.approx(figure, rel=1e-4, abs=2e-6), (key, name)
        else:
            assert ours[key] == pytest.approx(value, rel=1e-4, abs=2e-6), key


def test_the_writing_run_gives_the_source_models_perplexity_and_says_where_the_file_is(tiny_bundle, text,
                                                                                      other_source, tmp_path):
    path = tmp_path / "base.kld"
    wrote = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference-model", other_source,
                   "--kl-divergence-base", path)
    assert_ok(wrote)
    said = flat(wrote.stdout)
    assert f"to {path} (" in said
    assert f"--kl-divergence-base {path} --kl-divergence" in said
    plain = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference-model", other_source, "--json")
    with_file = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference-model", other_source,
                       "--kl-divergence-base", path, "--json")
    plain, with_file = json.loads(plain.stdout), json.loads(with_file.stdout)
    assert with_file["reference"]["perplexity"] == pytest.approx(plain["reference"]["perplexity"], rel=1e-9)
    assert with_file["kl_divergence_base"]["bytes"] == path.stat().st_size
    assert not list(tmp_path.glob(".*partial"))


def test_the_board_reads_the_file_without_torch(tiny_bundle, text, written):
    done = _run_blocked("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", written,
                        "--kl-divergence", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["divergence"]["mean_kld"] > 0.05


def test_writing_on_a_board_without_torch_names_the_host(tiny_bundle, text, tmp_path):
    done = _run_blocked("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base",
                        tmp_path / "base.kld")
    assert done.returncode != 0
    said = flat(done.stderr)
    assert "Traceback" not in said
    assert "writes the PyTorch source model's distributions" in said
    assert "write it on the host" in said
    assert f"--kl-divergence-base {tmp_path / 'base.kld'} --kl-divergence" in said
    assert not (tmp_path / "base.kld").exists()


@pytest.mark.parametrize(("options", "named"), [
    (("--context", 32, "--max-chars", 3000), "--context 64 (this run: 32)"),
    (("--context", 64, "--max-chars", 2000), "--max-chars 3000 (this run: 2000)"),
    (("--context", 64, "--max-chars", 3000, "--chunks", 3), "--chunks -1 (this run: 3)"),
    (("--context", 64, "--max-chars", 3000, "--method", "llama-perplexity"), "--method windows (this run: llama-perplexity)"),
])
def test_a_file_of_other_settings_is_refused_by_name(tiny_bundle, text, written, options, named):
    result = invoke("eval", tiny_bundle.path, "--text", text, *options, "-t", 1, "--kl-divergence-base", written,
                    "--kl-divergence")
    assert result.exit_code == 1, result.output
    said = flat(result.output)
    assert named in said
    assert "so it holds other positions" in said
    assert "as it was written" in said


def test_a_file_of_another_text_or_tokenizer_is_refused(tiny_bundle, text, written, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("\n".join(reversed(CORPUS * 30)), encoding="utf-8")
    result = invoke("eval", tiny_bundle.path, "--text", other, *SETTINGS, "--kl-divergence-base", written,
                    "--kl-divergence")
    assert result.exit_code == 1, result.output
    assert "was written from another text" in flat(result.output)

    with np.load(written, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    header = json.loads(arrays["header"].tobytes())
    header["tokenizer_sha256"] = "0" * 64
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    moved = tmp_path / "other-tokenizer.kld"
    with open(moved, "wb") as handle:
        np.savez(handle, **arrays)
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", moved,
                    "--kl-divergence")
    assert result.exit_code == 1, result.output
    assert "was written for the tokenizer of bundle" in flat(result.output)


def test_a_missing_damaged_or_pickled_file_is_refused_naming_it(tiny_bundle, text, written, tmp_path):
    def refused(path, fragment):
        result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence-base", path,
                        "--kl-divergence")
        assert result.exit_code == 1, result.output
        said = flat(result.output)
        assert f"--kl-divergence-base {path}" in said
        assert fragment in said
        assert "Traceback" not in said

    refused(tmp_path / "absent.kld", "no such file")
    cut = tmp_path / "cut.kld"
    cut.write_bytes(written.read_bytes()[: written.stat().st_size // 2])
    refused(cut, "is damaged")
    pickled = tmp_path / "pickled.kld"
    np.save(open(pickled, "wb"), np.array([{"a": 1}], dtype=object), allow_pickle=True)
    refused(pickled, "is not a file eval --kl-divergence-base wrote: it is a single .npy array")
    with np.load(written, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    for name, changed, fragment in (("hidden", arrays["hidden"][:-5], "is damaged: it holds"),
                                    ("head", arrays["head"].astype(np.float64), "is damaged: its head is float64"),
                                    ("head", arrays["head"][:-1], "do not make logits over its")):
        altered = tmp_path / f"altered-{name}.kld"
        with open(altered, "wb") as handle:
            np.savez(handle, **{**arrays, name: changed})
        refused(altered, fragment)


def test_reading_beside_reference_and_kl_divergence_alone_are_refused(tiny_bundle, text, written):
    both = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference", "--kl-divergence-base",
                  written, "--kl-divergence")
    assert both.exit_code == 2
    assert "in place of the source model: drop --reference" in flat(both.output)
    alone = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--kl-divergence")
    assert alone.exit_code == 2
    assert "--kl-divergence-base FILE" in flat(alone.output)


def test_the_file_gives_back_the_reference_logits_and_refuses_a_soft_cap(tmp_path):
    """The file keeps each position's hidden state and the output layer once (a few kB a token, not the whole
    vocabulary): the logits they give back are the reference's, so the statistics are those of the comparison with
    the reference itself; a model whose logits are more than its output layer's (Gemma 2's final soft cap) is
    refused, not written wrong."""
    rng = np.random.default_rng(0)
    vocab, width = 3000, 24
    head, bias = rng.normal(0, 1, (vocab, width)).astype(np.float32), rng.normal(0, 1, vocab).astype(np.float32)
    ids = [int(i) for i in rng.integers(0, vocab, 300)]
    states = {}

    def hidden_of(window):
        return states.setdefault(tuple(window), rng.normal(0, 1, (len(window), width)).astype(np.float32))

    def reference_hidden(window):
        hidden = hidden_of(window)
        return hidden @ head.T + bias, hidden

    def bundle(window):
        return reference_hidden(window)[0] + np.sin(np.arange(vocab)) * 0.3

    config = PerplexityConfig(context=50, stride=40, max_chars=None)
    path = tmp_path / "base.kld"
    figure, positions = write_divergence_base(reference_hidden, head, bias, ids, config, path, {"tokenizer_sha256": "x"})
    assert positions == 299
    assert path.stat().st_size < positions * width * 4 + head.nbytes + bias.nbytes + len(ids) * 8 + 4096
    ours = base_divergence(bundle, ids, config, read_divergence_base(path))
    theirs = divergence(bundle, lambda window: reference_hidden(window)[0], ids, config)
    assert ours.mean_kld > 0.01
    _assert_same_statistics(ours, theirs, rel=1e-5, tolerance=1e-6)  # unrounded: to_json's 6 places can round apart
    assert figure.perplexity == pytest.approx(ours.ppl_reference, rel=1e-6)

    def capped(window):
        logits, hidden = reference_hidden(window)
        return 30 * np.tanh(logits / 30), hidden

    with pytest.raises(EdgeSDKError, match="not its last hidden state times its output layer"):
        write_divergence_base(capped, head, bias, ids, config, tmp_path / "capped.kld", {})
    assert not (tmp_path / "capped.kld").exists()


def _assert_same_statistics(ours, theirs, rel: float, tolerance: float = 1e-15) -> None:
    for name, value in vars(theirs).items():
        if isinstance(value, dict):
            for key, figure in value.items():
                assert getattr(ours, name)[key] == pytest.approx(figure, rel=rel, abs=tolerance), (name, key)
        else:
            assert getattr(ours, name) == pytest.approx(value, rel=rel, abs=tolerance), name


def test_the_comparison_taken_in_row_blocks_gives_the_statistics_of_the_whole_window(tiny_bundle, text, written,
                                                                                     monkeypatch):
    """Each window is compared a block of rows at a time (float64 copies of block x V, not of the window's
    511 x 262,144 for a Gemma 3 vocabulary): the statistics are those of the whole window at once, to the last bits
    where both models' logits are at hand; read from the file, whose logits each block multiplies out again, to
    float32 rounding of the logits."""
    import edgesdk.evaluate
    from edgesdk.evaluate import bundle_scorer, check_divergence_base, leading_bos, tokenizer_identity
    from edgesdk.runtime.session import open_runtime

    runtime = open_runtime(tiny_bundle.path, threads=1)
    config = PerplexityConfig(context=64, max_chars=3000)
    ids = edgesdk.evaluate._scored_ids(runtime, text.read_text(encoding="utf-8"), config, "a divergence")
    base = read_divergence_base(written)
    check_divergence_base(base, config, tokenizer_identity(runtime), ids)
    score, bos = bundle_scorer(runtime), leading_bos(runtime.tokenizer)

    def reference(window):
        logits = score(window)
        return 0.7 * logits + np.sin(np.arange(logits.shape[-1])) * 0.5

    held, read = {}, {}
    for block in (1, 7, 64):
        monkeypatch.setattr(edgesdk.evaluate, "DIVERGENCE_BLOCK", block)
        held[block] = divergence(score, reference, ids, config, bos_id=bos)
        read[block] = base_divergence(score, ids, config, base, bos_id=bos)
    assert held[64].tokens_scored > 64
    assert held[64].mean_kld > 0.01
    assert read[64].mean_kld > 0.05
    for block in (1, 7):
        _assert_same_statistics(held[block], held[64], rel=1e-12)
        _assert_same_statistics(read[block], read[64], rel=1e-4, tolerance=2e-6)


def test_a_context_mismatch_under_llama_perplexity_gives_a_fix_that_runs(tiny_bundle, text, other_source, tmp_path):
    """llama-perplexity's stride is its context: named beside it, its fix "--stride 64" was refused as an option of
    --method windows."""
    path = tmp_path / "llama.kld"
    method = ("--method", "llama-perplexity", "--max-chars", 3000, "-t", 1)
    assert_ok(invoke("eval", tiny_bundle.path, "--text", text, *method, "--context", 64, "--reference-model",
                     other_source, "--kl-divergence-base", path))
    refused = invoke("eval", tiny_bundle.path, "--text", text, *method, "--context", 32, "--kl-divergence-base", path,
                     "--kl-divergence")
    assert refused.exit_code == 1, refused.output
    said = flat(refused.output)
    assert "was written with --context 64 (this run: 32), so it holds other positions" in said
    assert "pass --context 64 as it was written" in said
    assert "--stride" not in said
    assert_ok(invoke("eval", tiny_bundle.path, "--text", text, *method, "--context", 64, "--kl-divergence-base", path,
                     "--kl-divergence"))


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a directory that takes no new file")
def test_a_path_that_takes_no_file_is_refused_before_scoring(tiny_bundle, text, other_source):
    """Found only at the end, after all the scoring, it was a raw traceback."""
    result = invoke("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference-model", other_source,
                    "--kl-divergence-base", "/proc/x.kld")
    assert result.exit_code == 1, result.output
    said = flat(result.output)
    assert "Traceback" not in said
    assert "--kl-divergence-base /proc/x.kld cannot be written" in said
    assert "pass a path in a directory this user can write to" in said
    assert "perplexity" not in said.lower()  # refused before any scoring

    with pytest.raises(EdgeSDKError, match="/proc/x.kld cannot be written"):
        write_divergence_base(lambda window: None, np.zeros((3, 2), np.float32), None, list(range(200)),
                              PerplexityConfig(context=50, max_chars=None), "/proc/x.kld", {})


def test_writing_beside_reference_without_torch_names_the_host_not_dropping_reference(tiny_bundle, text, tmp_path):
    """Told to "drop --reference to score the bundle alone", the user still wrote the file, which needs torch."""
    done = _run_blocked("eval", tiny_bundle.path, "--text", text, *SETTINGS, "--reference", "--kl-divergence-base",
                        tmp_path / "base.kld")
    assert done.returncode != 0
    said = flat(done.stderr)
    assert "Traceback" not in said
    assert "drop --reference" not in said
    assert "writes the PyTorch source model's distributions" in said
    assert "write it on the host" in said
