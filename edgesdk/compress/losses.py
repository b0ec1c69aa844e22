"""Distillation losses (seed 004 §4.1): logits KL with temperature, token-level attention KL over
the student's kept heads, layer-level KL of the head-mean maps, and a global cosine over all
layers. Each is >= 0 and exactly 0 when student and teacher agree."""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-8


def logits_kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher || student) of next-token distributions at temperature T, times T^2 (Hinton et al.
    2015); logits (B, S, V), mean over positions."""
    t = temperature
    log_p_student = F.log_softmax(student.float() / t, dim=-1)
    log_p_teacher = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)  # (B, S)
    return kl.mean() * t * t


def _row_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of attention rows (…, S_q, S_k), mean over rows; masked (zero) entries add 0."""
    p, q = p.float(), q.float()
    return (p * (torch.log(p + EPS) - torch.log(q + EPS))).sum(-1).mean()


def token_attention_kl(student_maps, teacher_maps, kept_heads) -> torch.Tensor:
    """Seed L_token = KL(Attn_s || Attn_t), per layer and kept head.

    student_maps[i]: (B, Hs_i, S, S); teacher_maps[i]: (B, Ht, S, S); kept_heads[i]: the teacher
    index of each student head (pruning removes heads; the survivors are compared to themselves).
    """
    losses = []
    for s, t, kept in zip(student_maps, teacher_maps, kept_heads, strict=True):
        losses.append(_row_kl(s, t[:, list(kept)]))
    return torch.stack(losses).mean()


def layer_attention_kl(student_maps, teacher_maps) -> torch.Tensor:
    """Seed L_layer: KL of the head-mean attention maps of each layer (still rows of a distribution)."""
    losses = [_row_kl(s.mean(1), t.mean(1)) for s, t in zip(student_maps, teacher_maps, strict=True)]
    return torch.stack(losses).mean()


def global_attention_cosine(student_maps, teacher_maps) -> torch.Tensor:
    """Seed L_global: 1 - cosine of all layers' head-mean maps concatenated, per sequence.

    Computed as half the squared distance of the unit vectors, ½‖ŝ − t̂‖² (equal to 1 − ŝ·t̂): exactly 0 for equal
    maps and never below it. ``1 - F.cosine_similarity`` rounded a cosine of equal float32 vectors to 1 ± 1e-7, so
    a student that attended exactly as its teacher still had a loss above 0, and differences under that rounding
    were lost in it."""
    s = torch.cat([m.float().mean(1).flatten(1) for m in student_maps], dim=1)  # (B, L*S*S)
    t = torch.cat([m.float().mean(1).flatten(1) for m in teacher_maps], dim=1)
    s_unit, t_unit = F.normalize(s, dim=1, eps=EPS), F.normalize(t, dim=1, eps=EPS)
    return 0.5 * (s_unit - t_unit).pow(2).sum(1).mean()


BASE_WEIGHTS = {"token": 0.4, "layer": 0.35, "global": 0.25}  # seed §4.1: L_kd = .4 L_token + .35 L_layer + .25 L_global


def attention_weights(fraction: float, schedule: bool = True) -> dict[str, float]:
    """The seed's schedule: token weight 0.6 in the first 20 % of steps, layer 0.5 until 70 %, global
    0.4 after; the other two share the rest in their base proportions (weights sum to 1)."""
    if not schedule:
        return dict(BASE_WEIGHTS)
    lead, weight = ("token", 0.6) if fraction < 0.2 else ("layer", 0.5) if fraction < 0.7 else ("global", 0.4)
    others = {k: v for k, v in BASE_WEIGHTS.items() if k != lead}
    total = sum(others.values())
    return {lead: weight, **{k: (1 - weight) * v / total for k, v in others.items()}}
