"""Stop messages read from the state a build is really in: a power stage stopped after it read the rounds a stopped
build kept (their count set) and before it took them (while it measures the cost, installs the adapters and
calibrates the scales) goes on from them, and a stage that trains nothing, stopped while it loads the training text,
says so and what the stop loses. The power rounds name their adapters as the adapters' own list does; the compiler
and the board's loader find a name listed twice by one check.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.compress.train import TrainingProgress, keeping_progress, loading_text, setting_up  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.kernels.loader import first_named_twice  # noqa: E402
from edgesdk.power import adapter, train  # noqa: E402
from tests._utils.tiny import tiny_tokenizer  # noqa: E402
from tests.unit.test_power_resume62 import CONFIG, POOL, ROUNDS, _power, _run  # noqa: E402


def test_power_stopped_after_it_read_the_kept_rounds_and_before_it_took_them_goes_on_from_them(tmp_path,
                                                                                                monkeypatch):
    kept = tmp_path / "02-power.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _run(monkeypatch, TrainingProgress(kept, "power", "build", [].append), stop_at=2)
    assert torch.load(kept, weights_only=True)["batch"] == 2

    # the resumed stage reads the kept rounds (their count set), then profiles c_t, installs and calibrates: stopped
    # there, the file is still there and a --resume goes on from it
    progress = TrainingProgress(kept, "power", "build", [].append)
    _, rounds = train.read_kept(progress, CONFIG, POOL, [], 0)
    assert rounds is not None
    assert (progress.total, progress.kept) == (ROUNDS, None)
    assert progress.stopped_words() == (f"power stopped before its training; --resume goes on from the training "
                                        f"kept in {kept}")

    said: list[str] = []
    _run(monkeypatch, TrainingProgress(kept, "power", "build", said.append))
    assert f"power: going on from round 2 of {ROUNDS}, the training a stopped build kept in {kept}" in said


@pytest.mark.parametrize("stage", ["smooth", "prune", "sparsify"])
def test_a_stage_that_trains_nothing_stopped_while_it_loads_the_text_says_so(tmp_path, stage):
    ctx = BuildContext(profile=None, work_dir=tmp_path, tokenizer=tiny_tokenizer(), progress=False,
                       data_config=DataConfig(files=(str(tmp_path / "missing.txt"),), generated_sequences=0))
    progress = TrainingProgress(tmp_path / f"00-{stage}.training.pt", stage, "build", [].append)
    with keeping_progress(progress), pytest.raises(BuildError, match="missing.txt"):  # refused as it loads
        ctx.training_data()
    assert progress.stopped_words() == (f"{stage} stopped while loading the training text (the --data files "
                                        f"tokenized), before its own work; --resume starts the stage over")


def test_a_stage_that_trains_nothing_stopped_while_the_teacher_samples_names_what_is_lost(tmp_path):
    progress = TrainingProgress(tmp_path / "00-smooth.training.pt", "smooth", "build", [].append)
    with keeping_progress(progress):
        setting_up(*loading_text(DataConfig(generated_sequences=2, generated_tokens=8), teacher=True))
    assert progress.stopped_words() == (
        "smooth stopped while loading the training text (2 sequences of 8 tokens the teacher samples once for this "
        "model, or takes from the cache where an earlier build kept them), before its own work (teacher text not "
        "sampled whole is not kept in the cache: the next build samples it again); --resume starts the stage over")
    # set up and done: a stop there trains nothing in flight
    progress.doing = progress.losing = None
    assert progress.stopped_words() == "smooth keeps no training in flight; --resume starts the stage over"


def test_the_kept_rounds_hold_the_adapters_by_the_names_the_adapters_list_gives(tmp_path, monkeypatch):
    model, _, _ = _power()
    named = adapter.adapter_named_parameters(model)
    assert named
    assert all(".power_adapter." in name for name in named)
    assert [id(p) for p in named.values()] == [id(p) for p in adapter.adapter_parameters(model)]
    assert len(named) < len(list(model.parameters()))  # the backbone is not among them
    kept = tmp_path / "02-power.training.pt"
    with pytest.raises(KeyboardInterrupt):
        _run(monkeypatch, TrainingProgress(kept, "power", "build", [].append), stop_at=1)
    assert list(torch.load(kept, weights_only=True)["params"]) == list(named)


def test_a_name_listed_twice_is_found_once_for_the_compiler_and_the_loader():
    assert first_named_twice(["a", "b", "c"]) is None
    assert first_named_twice([]) is None
    assert first_named_twice(["a", None, "b", 3, "b", "a"]) == "b"  # the first repeated; not names skipped
    assert first_named_twice(iter([None, None, "x", "x"])) == "x"
