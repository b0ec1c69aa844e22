"""Review 50 of the compress stages (prune, sparsify, distill, data): each test named for a defect fails on the code
before its fix; the others check that the fix did not make a measure blind."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from edgesdk.compress import distill, prune  # noqa: E402
from edgesdk.compress.structure import layer_records, teacher_layers  # noqa: E402
from tests._utils.tiny import tiny_llama  # noqa: E402


# ------------------------------------------------------------------------------------ distill: attention terms
def _group_pruned_pair():
    """A teacher and a student that is the teacher with one GQA group of its last layer removed and nothing else
    changed: every head the student kept attends exactly as its teacher head does (the layers before it are the
    teacher's, and a head's map depends only on its own query and key)."""
    teacher = tiny_llama(seed=7, layers=2, heads=4, kv_heads=2, hidden=64)
    with torch.no_grad():  # sharper maps than a random model's near-uniform ones, as a trained model's are
        for layer in teacher.model.layers:
            layer.self_attn.q_proj.weight.mul_(4.0)
            layer.self_attn.k_proj.weight.mul_(4.0)
    student = copy.deepcopy(teacher)
    widths = [list(range(layer.mlp.gate_proj.out_features)) for layer in student.model.layers]
    prune.apply_plans(student, widths, [[0, 1], [1]])  # layer 1 keeps group 1: teacher heads 2 and 3
    for model in (teacher, student):
        model.set_attn_implementation("eager")
    return teacher, student


def test_attention_terms_compare_a_pruned_layers_surviving_heads_with_the_same_teacher_heads():
    """The token-level term compared a pruned layer's surviving heads with themselves, but the layer-level KL and the
    global cosine compared the student's head-mean map with the teacher's mean over all its heads, removed ones
    included: a student whose kept heads attend exactly as their teacher heads do scored 0.008 and 0.005 there (a
    loss that cannot reach 0, pulling the kept heads away from the heads the token-level term matches them to)."""
    teacher, student = _group_pruned_pair()
    kept = [record["heads"] for record in layer_records(student)]
    assert kept == [[0, 1, 2, 3], [2, 3]]
    config = distill.DistillConfig(steps=1, sequence_length=12, attention_weight=1.0)
    loss_fn = distill.distillation_loss(student, distill.TeacherWithPrefix(teacher, 0, 0), kept, config,
                                        teacher_layers(student))
    batch = torch.randint(3, teacher.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, parts = loss_fn(batch, 0.5)
    assert parts["token"] == pytest.approx(0.0, abs=1e-6)
    assert parts["layer"] == pytest.approx(0.0, abs=1e-6)
    assert parts["global"] == pytest.approx(0.0, abs=1e-6)
    assert parts["logits"] > 1e-4  # the student is not the teacher: its logits differ


def test_attention_terms_still_see_a_student_whose_kept_heads_attend_elsewhere():
    """The same comparison is not blind: the kept heads matched with the wrong teacher heads score above 0."""
    teacher, student = _group_pruned_pair()
    wrong = [[0, 1, 2, 3], [0, 1]]  # layer 1's survivors are teacher heads 2 and 3, not 0 and 1
    config = distill.DistillConfig(steps=1, sequence_length=12, attention_weight=1.0)
    loss_fn = distill.distillation_loss(student, distill.TeacherWithPrefix(teacher, 0, 0), wrong, config)
    batch = torch.randint(3, teacher.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, parts = loss_fn(batch, 0.5)
    assert parts["token"] > 1e-4
    assert parts["layer"] > 1e-4
    assert parts["global"] > 1e-5


# ------------------------------------------------------------------------------------ sparsify: probe batches
def _sparsify_forwards(tmp_path, probe_batches: int) -> tuple[int, dict]:
    """(forward passes of the model during a sparsify stage with calibration_batches 1, the stage's metrics)."""
    from edgesdk.build.registry import BuildContext, make_config, stage_spec
    from edgesdk.compress.data import DataConfig
    from edgesdk.profile import get_profile
    from tests._utils.tiny import CORPUS, tiny_tokenizer

    teacher = tiny_llama(seed=3, layers=2, heads=4, kv_heads=2, hidden=64)
    model = copy.deepcopy(teacher)
    tmp_path.mkdir()
    text = tmp_path / "train.txt"
    text.write_text("\n".join(CORPUS * 3), encoding="utf-8")
    ctx = BuildContext(profile=get_profile("host"), work_dir=tmp_path, tokenizer=tiny_tokenizer(), teacher=teacher,
                       progress=False, data_config=DataConfig(files=(str(text),), generated_sequences=0))
    calls = []
    handle = model.model.register_forward_hook(lambda module, args, output: calls.append(1))
    config = make_config("sparsify", {"density": 0.75, "block_size": 16, "calibration_batches": 1, "batch_size": 2,
                                      "sequence_length": 16, "probe_batches": probe_batches, "reconstruct": False})
    stage_spec("sparsify").run(model, config, ctx)
    handle.remove()
    return len(calls), ctx.metrics


def test_sensitivity_probes_score_on_the_probe_batches_asked_even_above_calibration_batches(tmp_path):
    """The probes scored on ``batches[:probe_batches]`` of the calibration_batches drawn, so probe_batches 3 with
    calibration_batches 1 measured every weight's cost on one batch, as probe_batches 1 does, and nothing said so.
    Each probe batch adds one forward pass per decoder weight and one for the intact model's reference."""
    one, _ = _sparsify_forwards(tmp_path / "one", 1)
    three, metrics = _sparsify_forwards(tmp_path / "three", 3)
    weights = 2 * 7  # 2 layers x (q, k, v, o, gate, up, down)
    assert three - one == 2 * (weights + 1)
    assert metrics["probe_tokens"] == 3 * 2 * 16
    assert metrics["calibration_tokens"] == 1 * 2 * 16  # the calibration itself still reads calibration_batches
