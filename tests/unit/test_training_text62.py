"""Every stage that loads the build's training text first says so, in its name, where the text is loaded
(``BuildContext.training_data``): not QAT alone. With --no-progress the teacher's text is sampled with no bar, and a
build whose first text stage is smooth, prune or distill sat that long with no line.

A real ``edgesdk build`` on a tiny model (smooth, then qat) and a real ``BuildContext`` inside a stage's
``keeping_progress``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.compress.train import TrainingProgress, keeping_progress  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from tests._utils.tiny import CORPUS, save_tiny_model_dir, tiny_tokenizer  # noqa: E402

RECIPE = """name: tiny-smooth-first
stages:
  - stage: smooth
    config: {calibration_batches: 2, batch_size: 2, sequence_length: 24}
  - stage: qat
    config: {granularity: channel, activations: tensor, embedding_bits: null, steps: 4, batch_size: 2,
             sequence_length: 24, observer_batches: 2}
export: {form: standard, weights: int8}
"""

SAMPLED = ("loading the training text (the --data files tokenized, and 2 sequences of 256 tokens the teacher samples "
           "once for this model, or takes from the cache where an earlier build kept them)")


@pytest.mark.slow
def test_a_build_whose_first_text_stage_is_smooth_says_there_that_it_loads_the_text(tmp_path):
    model = save_tiny_model_dir(tmp_path / "model", hidden=64, heads=4, kv_heads=2)
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    (tmp_path / "train.txt").write_text("\n".join(CORPUS * 3))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "EDGESDK_CACHE": str(tmp_path / "cache"),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "edgesdk", "build", "-t", "host", "-m", str(model),
                           "-o", str(tmp_path / "b"), "--recipe", str(tmp_path / "recipe.yaml"),
                           "--data", str(tmp_path / "train.txt"), "--data-skip-chars", "2000",
                           "--generated-sequences", "2", "--max-context", "64", "--no-progress"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    loading = [line for line in lines if "loading the training text" in line]
    assert loading == [f"edgesdk build: smooth: {SAMPLED}"], done.stderr  # once, by the stage that loads it
    smooth = next(i for i, line in enumerate(lines) if line.startswith("edgesdk build: [2/") and " smooth: " in line)
    qat = next(i for i, line in enumerate(lines) if line.startswith("edgesdk build: [3/") and " qat: " in line)
    assert smooth < lines.index(loading[0]) < qat, done.stderr
    # qat, which finds the text loaded, says only its own set-up
    assert "edgesdk build: qat: observing the activation ranges for the fake-quant scales on 2 batches" in lines


def test_the_stage_that_loads_the_text_names_it_once_and_a_stop_after_it_is_not_while_it_loads(tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS))
    ctx = BuildContext(profile=None, work_dir=tmp_path, tokenizer=tiny_tokenizer(), progress=False,
                       data_config=DataConfig(files=(str(text),), generated_sequences=0))
    said: list[str] = []
    progress = TrainingProgress(tmp_path / "00-distill.training.pt", "distill", "build", said.append)
    assert not ctx.has_training_data
    with keeping_progress(progress):
        data = ctx.training_data()
        assert ctx.training_data() is data
    assert ctx.has_training_data
    assert said == ["distill: loading the training text (the --data files tokenized)"]
    # the text is loaded: a stop before the training is not said to be while it loads
    assert (progress.doing, progress.losing) == (None, None)
    assert progress.stopped_words() == "distill stopped before its training; --resume starts the stage over"


def test_a_stop_while_the_text_loads_names_the_loading_in_the_stage_that_loads_it(tmp_path):
    ctx = BuildContext(profile=None, work_dir=tmp_path, tokenizer=tiny_tokenizer(), progress=False,
                       data_config=DataConfig(files=(str(tmp_path / "missing.txt"),), generated_sequences=0),
                       terms="python")
    progress = TrainingProgress(tmp_path / "00-power.training.pt", "power", "build", [].append, "python")
    with keeping_progress(progress), pytest.raises(BuildError, match="missing.txt"):  # refused as it loads
        ctx.training_data()
    assert not ctx.has_training_data
    assert progress.stopped_words() == ("power stopped while loading the training text (the data files tokenized), "
                                        "before its training; resume=True starts the stage over")
