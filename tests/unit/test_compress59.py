"""Review 59 of the distillation stage's attention implementation (edgesdk/compress/distill.py): each test named for
a defect fails on the code before its fix; the others check that the fix did not make the stage blind."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.build.registry import BuildContext, make_config, stage_spec  # noqa: E402
from edgesdk.compress import distill  # noqa: E402
from edgesdk.compress.data import DataConfig  # noqa: E402
from edgesdk.compress.structure import layer_records  # noqa: E402
from edgesdk.errors import BuildError  # noqa: E402
from edgesdk.power.adapter import install_adapters, power_state  # noqa: E402
from edgesdk.profile import get_profile  # noqa: E402
from tests._utils.tiny import CORPUS, tiny_llama, tiny_tokenizer  # noqa: E402

SETTINGS = {"steps": 2, "batch_size": 2, "sequence_length": 16, "grad_accumulation": 1}


def _context(tmp_path, teacher) -> BuildContext:
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    return BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                        progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))


def _distill(tmp_path, model, teacher, **settings):
    return stage_spec("distill").run(model, make_config("distill", {**SETTINGS, **settings}), _context(tmp_path, teacher))


def test_distillation_leaves_a_power_model_in_eager_attention_so_its_peaks_are_still_recorded(tmp_path):
    """The stage ended with set_attn_implementation("sdpa") on the student: a model the power stage had set to eager
    (its attention-peak hook reads the probabilities, which sdpa does not return) recorded no peak afterwards, while
    the same model resumed from the stage's checkpoint (the adapters' load hook sets eager) recorded them."""
    teacher = tiny_llama(seed=1)
    model = copy.deepcopy(teacher)
    install_adapters(model, rank=2)
    assert model.config._attn_implementation == "eager"
    _distill(tmp_path, model, teacher)
    assert model.config._attn_implementation == "eager"
    state = power_state(model)
    state.clear()
    state.record = True
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7, 8]]))
    state.record = False
    assert len(state.peaks) == len(state.peak_layers)


def test_distillation_leaves_the_teacher_in_the_attention_implementation_it_came_with(tmp_path):
    """The stage set the teacher (the model as loaded, which the build shares with every stage) to sdpa whatever it
    had been."""
    teacher = tiny_llama(seed=2)
    model = copy.deepcopy(teacher)
    teacher.set_attn_implementation("eager")
    _distill(tmp_path, model, teacher)
    assert teacher.config._attn_implementation == "eager"
    assert model.config._attn_implementation == "sdpa"  # the student came in sdpa


def test_a_distillation_that_fails_leaves_both_models_as_they_came(tmp_path):
    """A stage stopped by a non-finite loss left the teacher and the student in eager attention."""
    teacher = tiny_llama(seed=3)
    model = copy.deepcopy(teacher)
    with torch.no_grad():
        teacher.model.norm.weight.fill_(float("nan"))
    with pytest.raises(BuildError, match="before any update"):
        _distill(tmp_path, model, teacher)
    assert teacher.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "sdpa"


def test_the_stage_still_trains_on_attention_maps(tmp_path):
    """The stage's attention terms still read maps: every attention layer of both models returns its probabilities
    during the training, and the training changes the student."""
    teacher = tiny_llama(seed=4)
    model = copy.deepcopy(teacher)
    seen = []

    def record(module, args, output):
        seen.append(output[1] is not None)

    handles = [layer.self_attn.register_forward_hook(record)
               for m in (teacher, model) for layer in m.model.layers]
    before = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    _distill(tmp_path, model, teacher, attention_weight=1.0, lr=1e-2)
    for handle in handles:
        handle.remove()
    assert seen[:4 * SETTINGS["steps"]] == [True] * (4 * SETTINGS["steps"])  # 2 layers x 2 models per batch
    assert not torch.equal(model.model.layers[0].self_attn.q_proj.weight, before)


def test_the_loss_on_models_without_attention_maps_names_the_implementation_and_the_fix():
    """distillation_loss on models in sdpa attention (transformers' default) failed inside zip(): "argument 2 is
    longer than argument 1", naming neither the maps nor the implementation."""
    teacher, student = tiny_llama(seed=5), tiny_llama(seed=6)
    config = distill.DistillConfig(steps=1, sequence_length=8)
    kept = [record["heads"] for record in layer_records(student)]
    loss_fn = distill.distillation_loss(student, distill.TeacherWithPrefix(teacher, 0, 0), kept, config)
    batch = torch.randint(3, teacher.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="teacher returned no attention maps.*implementation is 'sdpa'.*eager"):
        loss_fn(batch, 0.0)
    with distill.eager_attention(teacher, student):
        loss, parts = loss_fn(batch, 0.0)
    assert set(parts) == {"logits", "token", "layer", "global"}
    assert torch.isfinite(loss)
    assert teacher.config._attn_implementation == student.config._attn_implementation == "sdpa"


def test_the_logits_only_loss_needs_no_attention_maps():
    teacher, student = tiny_llama(seed=5), tiny_llama(seed=6)
    config = distill.DistillConfig(steps=1, sequence_length=8, attention_weight=0.0)
    kept = [record["heads"] for record in layer_records(student)]
    loss_fn = distill.distillation_loss(student, distill.TeacherWithPrefix(teacher, 0, 0), kept, config)
    loss, parts = loss_fn(torch.randint(3, teacher.config.vocab_size, (2, 8)), 0.0)
    assert set(parts) == {"logits"}
    assert loss.item() > 0
