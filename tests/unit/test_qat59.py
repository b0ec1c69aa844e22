"""Review 59, training text and the build's measurements: a --data file given twice is refused before the model
loads, the held-out perplexity of fewer tokens than a window is refused rather than reported as 1 (a perfect
model), and a float model (no recorded scheme) can be measured with a scheme's fake quantization."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import fake_quant  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.compress.measure import HELDOUT_WINDOW, heldout_perplexity, quantized_heldout_perplexity  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


def _text_file(path):
    path.write_text("The quick brown fox jumps over the lazy dog.\n" * 20, encoding="utf-8")
    return path


def test_a_data_file_given_twice_is_refused_before_the_model_loads(tmp_path):
    wiki = str(_text_file(tmp_path / "wiki.txt"))
    with pytest.raises(BuildError, match=r"wiki\.txt is given again \(--data twice\)") as refused:
        DataConfig(files=(wiki, wiki)).check_files()
    assert "pass each file to --data once" in refused.value.fix


def test_a_data_file_given_under_two_spellings_is_refused_naming_both(tmp_path, monkeypatch):
    _text_file(tmp_path / "wiki.txt")
    (tmp_path / "link.txt").symlink_to(tmp_path / "wiki.txt")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BuildError, match=r"wiki\.txt is given again as \./wiki\.txt"):
        DataConfig(files=("wiki.txt", "./wiki.txt")).check_files()
    with pytest.raises(BuildError, match=r"wiki\.txt is given again as link\.txt") as refused:
        DataConfig(files=("wiki.txt", "link.txt")).check_files("python")
    assert "pass each file to data once" in refused.value.fix  # build_bundle()'s argument


def test_two_different_data_files_are_taken(tmp_path):
    DataConfig(files=(str(_text_file(tmp_path / "a.txt")), str(_text_file(tmp_path / "b.txt")))).check_files()


def test_heldout_perplexity_of_fewer_tokens_than_a_window_is_refused_not_one():
    model = tiny_llama()
    ids = torch.randint(0, 320, (HELDOUT_WINDOW - 1,), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=f"one whole window of {HELDOUT_WINDOW} tokens.*got {HELDOUT_WINDOW - 1}"):
        heldout_perplexity(model, ids)  # no token scored: was exp(0) = 1.0
    with pytest.raises(ValueError, match="2 tokens or more"):
        heldout_perplexity(model, ids, 1)
    assert heldout_perplexity(model, ids[:32], 32) > 1.0  # one whole window is scored


def test_a_float_model_is_measured_with_a_schemes_fake_quantization_and_left_as_it_was():
    ids = torch.randint(0, 320, (HELDOUT_WINDOW,), generator=torch.Generator().manual_seed(1))
    model = tiny_llama(seed=2)
    scheme = fake_quant.QuantScheme(weight_bits=4, granularity="block", activations="block", embedding_bits=4)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    reference = tiny_llama(seed=2)
    fake_quant.attach(reference, scheme)
    expected = heldout_perplexity(reference, ids)
    assert expected != pytest.approx(heldout_perplexity(model, ids), rel=1e-4)  # the scheme shows in the figure

    assert quantized_heldout_perplexity(model, ids, scheme) == pytest.approx(expected, rel=1e-6)  # was AttributeError
    assert fake_quant.QuantScheme.of(model) is None
    assert not hasattr(model.config, fake_quant.CONFIG_KEY)  # its config.json gains no key
    assert not any(isinstance(m, (fake_quant.QuantLinear, fake_quant.QuantEmbedding)) for m in model.modules())
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
