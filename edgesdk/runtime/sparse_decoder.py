"""A Llama-family decoder that runs on the block-sparse kernels (``edgesdk.kernels``).

It reads the bundle's block-compressed INT8 weights (export/sparse_export.py) and computes each
step with :func:`edgesdk.kernels.ops.block_sparse_matmul` for every decoder linear (Q|K|V, O,
gate|up, down: four launches per layer) and :func:`edgesdk.kernels.ops.gqa_decode_attention` for
single-token decode; prefill attention (many query tokens at once) uses PyTorch's scaled dot
product attention. The kernel switch (``EDGESDK_KERNELS``: triton, reference, emulated) decides
whether the Triton kernels, their PyTorch twins or the twins' interpreted Triton run.

Numerics follow transformers' Llama (Touvron et al. 2023): RMSNorm in float32, rotary embedding
with half-rotation (Su et al. 2021), SiLU-gated FFN; the KV cache is float32 on the device,
grown by doubling up to the bundle's max_context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgesdk.kernels.block_sparse import BlockSparseWeight
from edgesdk.kernels.ops import block_sparse_matmul, gqa_decode_attention

INITIAL_CAPACITY = 256
LINEARS = ("qkv", "o", "gate_up", "down")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class SparseDecoder:
    """Holds the weights and the KV cache of one sequence; :meth:`step` runs tokens after it."""

    def __init__(self, tensors: dict[str, torch.Tensor], record: dict, device: str = "cpu",
                 mode: str | None = None, compiled=None):
        # ``compiled``: kernels loaded from the bundle's AOT cubins (edgesdk.kernels.loader), used
        # instead of the Triton JIT when the board has no triton package.
        self.device, self.mode, self.compiled = torch.device(device), mode, compiled
        self.head_dim, self.eps = int(record["head_dim"]), float(record["rms_eps"])
        self.rope_scaling = float(record["rope_scaling"])
        self.max_context = int(record["max_context"])
        self.layer_heads = [(int(r["heads"]), int(r["kv_heads"])) for r in record["layers"]]
        move = lambda t: t.to(self.device)  # noqa: E731
        self.embed = move(tensors["embed"]).float()  # (V, D)
        self.lm_head = move(tensors["lm_head"]).float() if "lm_head" in tensors else self.embed
        self.final_norm = move(tensors["final_norm"])
        self.inv_freq = move(tensors["inv_freq"]).float()  # (hd/2,)
        self.layers = []
        for index in range(len(self.layer_heads)):
            prefix = f"layers.{index}"
            layer = {kind: BlockSparseWeight.from_state_dict(tensors, f"{prefix}.{kind}", device=self.device)
                     for kind in LINEARS}
            layer["input_norm"] = move(tensors[f"{prefix}.input_norm"])
            layer["post_attention_norm"] = move(tensors[f"{prefix}.post_attention_norm"])
            layer["qkv_bias"] = move(tensors[f"{prefix}.qkv_bias"]) if f"{prefix}.qkv_bias" in tensors else None
            self.layers.append(layer)
        self.capacity = 0
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.position = 0
        self._grow(min(INITIAL_CAPACITY, self.max_context))

    def reset(self) -> None:
        self.position = 0  # entries past the position are never read

    def _grow(self, capacity: int) -> None:
        cache = []
        for index, (_, kv_heads) in enumerate(self.layer_heads):
            pair = []
            for kind in range(2):
                buffer = torch.zeros(1, kv_heads, capacity, self.head_dim, device=self.device)  # (B, Hkv, cap, hd)
                if self.cache and self.position:
                    buffer[:, :, : self.position] = self.cache[index][kind][:, :, : self.position]
                pair.append(buffer)
            cache.append(tuple(pair))
        self.cache, self.capacity = cache, capacity

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # (T, hd/2)
        angles = torch.cat([freqs, freqs], dim=-1)  # (T, hd)
        return angles.cos() * self.rope_scaling, angles.sin() * self.rope_scaling

    @torch.no_grad()
    def step(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Run ``ids`` (T,) after the cache; returns the last ``keep`` positions' logits (keep, V)."""
        count = int(ids.shape[0])
        start, total = self.position, self.position + count
        if total > self.capacity:
            self._grow(min(self.max_context, max(2 * self.capacity, total)))
        cos, sin = self._rotary(torch.arange(start, total, device=self.device))  # (T, hd) each
        hidden = self.embed[ids.to(self.device)]  # (T, D)
        for layer, (heads, kv_heads), (keys, values) in zip(self.layers, self.layer_heads, self.cache, strict=True):
            x = rms_norm(hidden, layer["input_norm"], self.eps)
            qkv = self._matmul(x, layer["qkv"])  # (T, (Hq + 2 Hkv) hd)
            if layer["qkv_bias"] is not None:
                qkv = qkv + layer["qkv_bias"]
            q, k, v = qkv.split([heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.head_dim], dim=-1)
            q = q.reshape(count, heads, self.head_dim).transpose(0, 1)  # (Hq, T, hd)
            k = k.reshape(count, kv_heads, self.head_dim).transpose(0, 1)  # (Hkv, T, hd)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            keys[0, :, start:total] = k
            values[0, :, start:total] = v.reshape(count, kv_heads, self.head_dim).transpose(0, 1)
            attended = self._attention(q, keys, values, start, total, heads, kv_heads)  # (T, Hq*hd)
            hidden = hidden + self._matmul(attended, layer["o"])
            x = rms_norm(hidden, layer["post_attention_norm"], self.eps)
            gate, up = self._matmul(x, layer["gate_up"]).chunk(2, dim=-1)  # (T, F) each
            hidden = hidden + self._matmul(F.silu(gate) * up, layer["down"])
        hidden = rms_norm(hidden[-keep:], self.final_norm, self.eps)
        self.position = total
        return hidden @ self.lm_head.T  # (keep, V)

    def _matmul(self, x: torch.Tensor, weight: BlockSparseWeight) -> torch.Tensor:
        if self.compiled is not None:
            return self.compiled.block_sparse_matmul(x.contiguous(), weight).float()
        return block_sparse_matmul(x, weight, self.mode)

    def _attention(self, q, keys, values, start, total, heads, kv_heads) -> torch.Tensor:
        scale = self.head_dim ** -0.5
        count = q.shape[1]
        if count == 1:  # decode: the GQA kernel reads the cache in place
            lengths = torch.tensor([total], dtype=torch.int32, device=self.device)
            query = q.transpose(0, 1).contiguous()  # (1, Hq, hd)
            if self.compiled is not None:
                out = self.compiled.gqa_decode_attention(query, keys, values, lengths, scale).float()
            else:
                out = gqa_decode_attention(query, keys, values, lengths, scale, self.mode)
            return out.reshape(1, heads * self.head_dim)
        group = heads // kv_heads
        k = keys[0, :, :total].repeat_interleave(group, dim=0)  # (Hq, total, hd)
        v = values[0, :, :total].repeat_interleave(group, dim=0)
        query_pos = torch.arange(start, total, device=self.device)[:, None]  # (T, 1)
        allowed = torch.arange(total, device=self.device)[None, :] <= query_pos  # (T, total)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scale)  # (Hq, T, hd)
        return out.transpose(0, 1).reshape(count, heads * self.head_dim)
