"""A Llama-family decoder that runs on the block-sparse kernels (``edgesdk.kernels``).

It reads the bundle's block-compressed INT8 weights (export/sparse_export.py) and computes each
step with :func:`edgesdk.kernels.ops.block_sparse_matmul` for every decoder linear (Q|K|V, O,
gate|up, down: four launches per layer) and :func:`edgesdk.kernels.ops.gqa_decode_attention` for
single-token decode; prefill attention (many query tokens at once) uses PyTorch's scaled dot
product attention. The kernel switch (``EDGESDK_KERNELS``: triton, reference, emulated) decides
whether the Triton kernels, their PyTorch twins or the twins' interpreted Triton run.

Numerics follow transformers' Llama (Touvron et al. 2023): RMSNorm in float32, rotary embedding
with half-rotation (Su et al. 2021), SiLU-gated FFN, and Qwen3's RMSNorm of each query and key head; the KV cache is float32 on the device
(with AOT-compiled kernels: the dtype their attention reads, float16, so no step converts it),
grown by doubling up to the bundle's max_context.

Gemma 3 (Gemma Team 2025, "Gemma 3 Technical Report"; transformers' Gemma3ForCausalLM) adds what the sparse
record and weights carry (export/sparse_export.py): the looked-up embedding times ``embed_scale`` (sqrt(D); the
tied LM head reads the table unscaled), the softmax scale ``attention_scale`` (query_pre_attn_scalar ** -0.5),
RMSNorms of the attention's and the FFN's outputs before each residual add (``attn_out_norm``,
``ffn_out_norm``; every Gemma norm weight is stored as the 1 + w it scales by, so one rms_norm serves both
families), the per-head query / key norms, GeGLU with tanh GELU (``activation``), a rotary table per layer kind
(``rope``: the sliding layers' local base, the full layers' global one) and each sliding layer's ``window``: a
query at position p reads keys p - window + 1 .. p, in prefill's mask and in the decode kernel alike.

SmolLM3 (transformers' SmolLM3ForCausalLM) is Llama's layout with no rotary in the layers whose ``no_rope_layers``
entry is 0 (every fourth): their record's ``rope`` is null, and their queries and keys go into the cache and the
decode kernel unrotated (the kernel never rotates: rotary is applied here, before it).

On a CUDA device single-token decode runs a static step (token, position and length in device
tensors) captured once as a CUDA graph and replayed, so a step costs one launch from Python
instead of about a thousand.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from edgesdk.bundle import context_fix
from edgesdk.errors import RuntimeBackendError
from edgesdk.kernels.block_sparse import BlockSparseWeight
from edgesdk.kernels.ops import block_sparse_matmul, gqa_decode_attention, kernel_mode

INITIAL_CAPACITY = 256
LINEARS = ("qkv", "o", "gate_up", "down")
# the FFN gate's activation by the record's ``activation``: SwiGLU (Llama) | GeGLU with tanh GELU (Gemma 3's
# gelu_pytorch_tanh)
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": lambda gate: F.gelu(gate, approximate="tanh")}


def rope_table_key(index: int) -> str:
    """The tensor holding rotary table ``index``'s inverse frequencies (table 0: ``inv_freq``, as before there were
    several)."""
    return "inv_freq" if index == 0 else f"inv_freq.{index}"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def layer_misfits(index: int, layer: dict, heads: tuple[int, int], ffn: int | None, head_dim: int, width: int,
                  record: dict) -> list[str]:
    """What of decoder layer ``index``'s weights does not fit its record, one line each: ``heads`` (query, KV) with
    the query heads a multiple of the KV heads; for D the embedding's ``width`` and F the layer's ``ffn`` (None: the
    width ``down`` holds), ``qkv`` ``((Hq + 2 Hkv) head_dim, D)``, ``o`` ``(D, Hq head_dim)``, ``gate_up``
    ``(2 F, D)``, ``down`` ``(D, F)``, each in the record's ``block`` and ``layout`` (what the bundle's compiled
    kernels were built for), and a ``qkv_bias`` of one entry per ``qkv`` row."""
    hq, hkv = heads
    if hkv < 1 or hq % hkv:
        return [f"layer {index}: heads={hq} is not a multiple of kv_heads={hkv}"]
    ffn = layer["down"].shape[1] if ffn is None else ffn
    expected = {"qkv": ((hq + 2 * hkv) * head_dim, width), "o": (width, hq * head_dim), "gate_up": (2 * ffn, width),
                "down": (width, ffn)}
    block = (int(record["block"]),) * 2 if record.get("block") is not None else None
    problems = []
    bias = layer["qkv_bias"]  # Qwen2's: one per fused Q|K|V row
    if bias is not None and tuple(bias.shape) != expected["qkv"][:1]:
        problems.append(f"layers.{index}.qkv_bias has shape {tuple(bias.shape)}, expected {expected['qkv'][:1]} "
                        f"(one per Q|K|V row)")
    for kind, shape in expected.items():
        weight = layer[kind]
        tiles = (block or weight.block, record.get("layout", weight.layout))
        if weight.shape != shape:
            problems.append(f"layers.{index}.{kind} is {weight.shape[0]}x{weight.shape[1]}, expected "
                            f"{shape[0]}x{shape[1]} (heads={hq}, kv_heads={hkv}, head_dim={head_dim}, ffn={ffn}, "
                            f"embedding width {width})")
        elif (weight.block, weight.layout) != tiles:
            problems.append(f"layers.{index}.{kind} is in {weight.block[0]}x{weight.block[1]} {weight.layout} "
                            f"blocks, but the record says {tiles[0][0]}x{tiles[0][1]} {tiles[1]}")
    return problems


class SparseDecoder:
    """Holds the weights and the KV cache of one sequence; :meth:`step` runs tokens after it."""

    # the model's max_position_embeddings its bundle's manifest records (the triton backend's, which sets it), which a
    # refusal of a step past max_context names as the most a rebuild gives; None: not recorded (the sparse record
    # does not hold it)
    model_positions: int | None = None

    def __init__(self, tensors: dict[str, torch.Tensor], record: dict, device: str = "cpu",
                 mode: str | None = None, compiled=None, graphs: bool | None = None):
        # ``compiled``: kernels loaded from the bundle's AOT cubins (edgesdk.kernels.loader), used
        # instead of the Triton JIT when the board has no triton package.
        # ``graphs``: replay decode steps from one captured CUDA graph (default: on a CUDA device running the
        # Triton or AOT kernels). A decode step is about 38 small launches per layer; at batch 1 their launch
        # cost, not the weights' bytes, sets the token rate unless they are replayed as one graph.
        self.device, self.mode, self.compiled = torch.device(device), mode, compiled
        if graphs is None:  # the PyTorch twins synchronise with the host, so only the kernels are captured
            graphs = self.device.type == "cuda" and (compiled is not None or (mode or kernel_mode()) == "triton")
        self.graphs = graphs
        self._graph = None  # None: not captured yet; False: capture failed, static steps run eagerly
        self._graph_logits: torch.Tensor | None = None  # the captured step's output buffer
        self.graph_error: str | None = None
        self.head_dim, self.eps = int(record["head_dim"]), float(record["rms_eps"])
        self.rope_scaling = float(record["rope_scaling"])
        self.max_context = int(record["max_context"])
        self.layer_heads = [(int(r["heads"]), int(r["kv_heads"])) for r in record["layers"]]
        # Gemma 3's settings; a Llama / Qwen record has none of them and keeps the defaults
        self.embed_scale = float(record.get("embed_scale", 1.0))
        self.scale = float(record["attention_scale"]) if record.get("attention_scale") is not None \
            else self.head_dim ** -0.5
        activation = record.get("activation", "silu")
        if activation not in ACTIVATIONS:
            raise RuntimeBackendError(
                f"the bundle's sparse record sets activation {activation!r}, which this block-sparse decoder does not "
                f"compute (it computes {', '.join(ACTIVATIONS)})",
                "run the bundle with the edgesdk that built it, or rebuild it with this edgesdk")
        self.activation = ACTIVATIONS[activation]
        # each layer's rotary table; None (the record's null): the layer rotates nothing (SmolLM3's NoPE layers)
        self.layer_ropes = [None if r.get("rope", 0) is None else int(r.get("rope", 0)) for r in record["layers"]]
        self.windows = [int(r["window"]) if r.get("window") else None for r in record["layers"]]
        rope_scalings = [self.rope_scaling, *(float(v) for v in record.get("other_rope_scalings", []))]
        # compiled attention reads the cache in its own dtype: held in it, no step copies the whole cache
        self.cache_dtype = compiled.attention_dtype if compiled is not None else torch.float32
        move = lambda t: t.to(self.device)  # noqa: E731
        # The embedding (and tied LM head) stays float16 on a GPU, where reading it is most of the head's cost
        # (49152 x 576 for SmolLM2: 57 MB a token in fp16, 113 MB in fp32); float32 on a CPU, where fp16 matmuls
        # are slow. Rows looked up from it are float32 like every activation.
        table_dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.embed = move(tensors["embed"]).to(table_dtype)  # (V, D)
        self.lm_head = move(tensors["lm_head"]).to(table_dtype) if "lm_head" in tensors else self.embed
        self.final_norm = move(tensors["final_norm"])
        self.inv_freq = move(tensors["inv_freq"]).float()  # (hd/2,)
        # (inverse frequencies (hd/2,), cos/sin multiplier) of each rotary table, by the layers' ``rope``
        self.ropes = [(self.inv_freq, self.rope_scaling)] + [
            (move(tensors[rope_table_key(i)]).float(), scaling) for i, scaling in enumerate(rope_scalings) if i]
        self.layers = []
        for index in range(len(self.layer_heads)):
            prefix = f"layers.{index}"
            layer = {kind: BlockSparseWeight.from_state_dict(tensors, f"{prefix}.{kind}", device=self.device)
                     for kind in LINEARS}
            layer["input_norm"] = move(tensors[f"{prefix}.input_norm"])
            layer["post_attention_norm"] = move(tensors[f"{prefix}.post_attention_norm"])
            layer["qkv_bias"] = move(tensors[f"{prefix}.qkv_bias"]) if f"{prefix}.qkv_bias" in tensors else None
            # Qwen3, Gemma 3: RMSNorm of each query / key head before rotary; Gemma 3: of the attention's output
            # and of the FFN's output, before their residual adds
            for norm in ("q_norm", "k_norm", "attn_out_norm", "ffn_out_norm"):
                layer[norm] = move(tensors[f"{prefix}.{norm}"]) if f"{prefix}.{norm}" in tensors else None
            self.layers.append(layer)
        self._check_weights_fit_record(record)
        self.capacity = 0
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.position = 0
        self._grow(min(INITIAL_CAPACITY, self.max_context))

    def _check_weights_fit_record(self, record: dict) -> None:
        """Refuse weights that do not fit the sparse record, naming the tensor, its shape and the record's numbers
        that make the expected one (:func:`layer_misfits` per layer; every rotary table ``(head_dim / 2,)`` and
        each layer's ``rope`` one of them). Unchecked, a mismatch failed at the first step in torch's words
        ("x must be (M, K=64), got (3, 96)"), naming no layer."""
        hd = self.head_dim
        problems = [f"rotary table {rope_table_key(i)} has {inv_freq.numel()} inverse frequencies, expected "
                    f"head_dim / 2 = {hd // 2}" for i, (inv_freq, _) in enumerate(self.ropes) if inv_freq.numel() != hd // 2]
        for index, (layer, heads, rope, spec) in enumerate(
                zip(self.layers, self.layer_heads, self.layer_ropes, record["layers"], strict=True)):
            if rope is not None and not 0 <= rope < len(self.ropes):
                problems.append(f"layer {index}: rope={rope}, but the record has {len(self.ropes)} rotary tables")
            ffn = int(spec["ffn"]) if spec.get("ffn") is not None else None
            problems += layer_misfits(index, layer, heads, ffn, hd, int(self.embed.shape[1]), record)
        if problems:
            raise RuntimeBackendError(
                f"the bundle's block-sparse weights do not fit its sparse record: {'; '.join(problems[:4])}"
                + (f"; and {len(problems) - 4} more" if len(problems) > 4 else ""),
                "the weights file and the manifest's sparse record come from different builds: run 'edgesdk verify "
                "BUNDLE', and rebuild the bundle with this edgesdk")

    def reset(self) -> None:
        self.position = 0  # entries past the position are never read; a captured graph stays valid

    def close(self) -> None:
        """Drop the captured CUDA graph and the KV cache, then close the compiled kernels (their modules and
        scratch, :meth:`edgesdk.kernels.loader.CompiledKernels.close`), once the steps in flight end: the compiled
        kernels' close waits for the device itself; without them (the Triton JIT on a GPU) torch waits here. The
        weights go with the decoder's last reference. The graph goes first: it launches the compiled kernels, whose
        modules go next (a graph still running is freed when it ends, ``cuGraphExecDestroy``). Each step is taken
        even when one before it raised; closing again is harmless (closed kernels stay closed)."""
        try:
            if self.compiled is None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the steps in flight end before their buffers go
        finally:
            self._graph = self._graph_logits = None
            self.cache, self.capacity, self.position = [], 0, 0
            if self.compiled is not None:
                self.compiled.close()

    def _grow(self, capacity: int) -> None:
        cache = []
        for index, (_, kv_heads) in enumerate(self.layer_heads):
            pair = []
            for kind in range(2):
                buffer = torch.zeros(1, kv_heads, capacity, self.head_dim, device=self.device,
                                     dtype=self.cache_dtype)  # (B, Hkv, cap, hd)
                if self.cache and self.position:
                    buffer[:, :, : self.position] = self.cache[index][kind][:, :, : self.position]
                pair.append(buffer)
            cache.append(tuple(pair))
        self.cache, self.capacity = cache, capacity

    def _rotary(self, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin), each (T, hd), of every rotary table at ``positions`` (T,)."""
        tables = []
        for inv_freq, scaling in self.ropes:
            freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, hd/2)
            angles = torch.cat([freqs, freqs], dim=-1)  # (T, hd)
            tables.append((angles.cos() * scaling, angles.sin() * scaling))
        return tables

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the embedding as float32 (T, D), times Gemma's embed_scale after the lookup."""
        rows = self.embed[ids].float()
        return rows * self.embed_scale if self.embed_scale != 1.0 else rows

    @torch.no_grad()
    def step(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Run ``ids`` (T,) after the cache; returns the last ``keep`` positions' logits (keep, V). No tokens is
        an error, as for the ONNX Runtime backends (edgesdk/runtime/ort_backend.py) and llama.cpp's ``llama_decode``
        ("n_tokens == 0"): it returned a (0, V) array, no next token's logits, and the caller failed later.
        ``keep`` must lie in ``[1, T]`` (``hidden[-0:]`` is every row: keep 0 returned all T rows), and the step
        must end within ``max_context`` (past it a prefill failed in torch's words on the cache's shape, and a
        CUDA-graph decode step wrote past the cache on the device)."""
        count = int(ids.shape[0])
        if count == 0:
            raise RuntimeBackendError("a step of 0 tokens: there is no position whose logits it could return",
                                      "pass at least one token id (the prompt's last token gives the next "
                                      "token's logits)")
        if isinstance(keep, bool) or not isinstance(keep, numbers.Integral) or not 1 <= keep <= count:
            raise RuntimeBackendError(f"keep={keep!r}: expected a whole number of logit rows from 1 to the step's "
                                      f"{count} tokens", "pass keep=1 for the next token's logits, or up to the "
                                      "number of ids for every position's")
        start, total = self.position, self.position + count
        if total > self.max_context:
            shorten = "shorten the prompt or the generation, rewind or reset the cache"
            raise RuntimeBackendError(f"a step of {count} tokens after {start} cached ones makes {total}, past the "
                                      f"bundle's max_context {self.max_context}",
                                      context_fix(shorten, self.max_context, self.model_positions, total))
        if total > self.capacity:
            self._grow(min(self.max_context, max(2 * self.capacity, total)))
        if count == 1 and self.graphs:
            return self._replay(ids, start)
        rotary = self._rotary(torch.arange(start, total, device=self.device))  # (cos, sin) per table, (T, hd) each

        def write(keys, values, k, v):  # k, v (Hkv, T, hd)
            keys[0, :, start:total] = k
            values[0, :, start:total] = v

        def attend(q, keys, values, heads, kv_heads, window):
            return self._attention(q, keys, values, start, total, heads, kv_heads, window)

        hidden = self._layers(self._embed(ids.to(self.device)), rotary, write, attend)  # (T, D)
        self.position = total
        return self._head(hidden[-int(keep):])

    @torch.no_grad()
    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The final-norm hidden states (T, D) of ``ids`` (T,) as a sequence of their own (embeddings). Their keys
        and values go to scratch buffers of T entries: the KV cache and its position are left as they were."""
        count = int(ids.shape[0])
        scratch = [tuple(torch.zeros(1, kv_heads, count, self.head_dim, device=self.device, dtype=self.cache_dtype)
                         for _ in range(2)) for _, kv_heads in self.layer_heads]  # (B, Hkv, T, hd) per kind

        def write(keys, values, k, v):  # k, v (Hkv, T, hd)
            keys[0, :, :count] = k
            values[0, :, :count] = v

        def attend(q, keys, values, heads, kv_heads, window):
            return self._attention(q, keys, values, 0, count, heads, kv_heads, window)

        rotary = self._rotary(torch.arange(count, device=self.device))
        hidden = self._layers(self._embed(ids.to(self.device)), rotary, write, attend, scratch)  # (T, D)
        return rms_norm(hidden, self.final_norm, self.eps).float()

    def _layers(self, hidden, rotary, write, attend, cache=None) -> torch.Tensor:
        """The decoder layers over ``hidden`` (T, D); ``rotary`` holds (cos, sin) of each table at the step's
        positions, ``write`` stores the step's K/V, ``attend`` reads them, in ``cache`` (the KV cache unless
        given)."""
        count = hidden.shape[0]
        for layer, (heads, kv_heads), (keys, values), rope, window in zip(
                self.layers, self.layer_heads, self.cache if cache is None else cache, self.layer_ropes,
                self.windows, strict=True):
            x = rms_norm(hidden, layer["input_norm"], self.eps)
            qkv = self._matmul(x, layer["qkv"])  # (T, (Hq + 2 Hkv) hd)
            if layer["qkv_bias"] is not None:
                qkv = qkv + layer["qkv_bias"]
            q, k, v = qkv.split([heads * self.head_dim, kv_heads * self.head_dim, kv_heads * self.head_dim], dim=-1)
            q = q.reshape(count, heads, self.head_dim).transpose(0, 1)  # (Hq, T, hd)
            k = k.reshape(count, kv_heads, self.head_dim).transpose(0, 1)  # (Hkv, T, hd)
            if layer["q_norm"] is not None:
                q, k = rms_norm(q, layer["q_norm"], self.eps), rms_norm(k, layer["k_norm"], self.eps)
            if rope is not None:  # SmolLM3's NoPE layers skip rotary (transformers' use_rope false)
                cos, sin = rotary[rope]
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
            write(keys, values, k, v.reshape(count, kv_heads, self.head_dim).transpose(0, 1))
            attended = attend(q, keys, values, heads, kv_heads, window)  # (T, Hq*hd)
            out = self._matmul(attended, layer["o"])
            if layer["attn_out_norm"] is not None:
                out = rms_norm(out, layer["attn_out_norm"], self.eps)
            hidden = hidden + out
            x = rms_norm(hidden, layer["post_attention_norm"], self.eps)
            gate, up = self._matmul(x, layer["gate_up"]).chunk(2, dim=-1)  # (T, F) each
            out = self._matmul(self.activation(gate) * up, layer["down"])
            if layer["ffn_out_norm"] is not None:
                out = rms_norm(out, layer["ffn_out_norm"], self.eps)
            hidden = hidden + out
        return hidden

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: (T, D) -> (T, V) float32; the head is read in its stored precision."""
        hidden = rms_norm(hidden, self.final_norm, self.eps)
        return F.linear(hidden.to(self.lm_head.dtype), self.lm_head).float()

    # ------------------------------------------------------------------ static decode (CUDA graphs)
    def _decode_static(self) -> torch.Tensor:
        """One decode step whose every shape and address is fixed: the token, its position and the attended
        length are read from device tensors (``_token``, ``_slot``, ``_length``), the K/V row is written with
        ``index_copy_`` and the GQA kernel loops to ``_length`` on the device. So the step can be captured in a
        CUDA graph once and replayed for every later position (CUDA C++ Programming Guide, "CUDA Graphs")."""
        rotary = self._rotary(self._slot)  # (cos, sin) per table, (1, hd) each

        def write(keys, values, k, v):  # k, v (Hkv, 1, hd) into the (Hkv, cap, hd) cache at _slot
            keys[0].index_copy_(1, self._slot, k.to(keys.dtype))
            values[0].index_copy_(1, self._slot, v.to(values.dtype))

        def attend(q, keys, values, heads, kv_heads, window):  # the window: a constant of the captured launch
            return self._decode_attention(q, keys, values, self._length, heads, window)

        return self._head(self._layers(self._embed(self._token), rotary, write, attend))  # (1, V)

    def _prepare_static(self) -> None:
        if self.capacity < self.max_context:  # the graph holds the cache's addresses: allocate it whole
            self._grow(self.max_context)
        self._token = torch.zeros(1, dtype=torch.long, device=self.device)
        self._slot = torch.zeros(1, dtype=torch.long, device=self.device)
        self._length = torch.ones(1, dtype=torch.int32, device=self.device)

    def _replay(self, ids: torch.Tensor, position: int) -> torch.Tensor:
        if self._graph is None:
            self._prepare_static()
        self._token.copy_(ids.reshape(1), non_blocking=True)
        self._slot.fill_(position)
        self._length.fill_(position + 1)
        if self._graph is None:
            self._graph, self._graph_logits = self._capture()
        if self._graph is False:  # capture failed once: run the same static step eagerly
            logits = self._decode_static()
        else:
            self._graph.replay()
            logits = self._graph_logits
        self.position = position + 1
        return logits.clone()

    def _capture(self):
        """(graph, its logits buffer), or (False, None) where this device or build cannot capture."""
        if self.device.type != "cuda":
            return False, None
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):  # warm-up outside the graph: compiles the kernels, fills the allocator
                self._decode_static()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = self._decode_static()
            return graph, logits
        except RuntimeError as exc:  # e.g. a driver without graph support: eager static steps still work
            self.graph_error = str(exc)
            return False, None

    def _matmul(self, x: torch.Tensor, weight: BlockSparseWeight) -> torch.Tensor:
        if self.compiled is not None:
            return self.compiled.block_sparse_matmul(x.contiguous(), weight).float()
        return block_sparse_matmul(x, weight, self.mode)

    def _attention(self, q, keys, values, start, total, heads, kv_heads, window) -> torch.Tensor:
        """q (Hq, T, hd) of positions start .. total - 1 against the cache; ``window``: each query reads its
        last ``window`` positions, itself included (None: every earlier one) -> (T, Hq*hd)."""
        count = q.shape[1]
        if count == 1:  # decode: the GQA kernel reads the cache in place
            lengths = torch.tensor([total], dtype=torch.int32, device=self.device)
            return self._decode_attention(q, keys, values, lengths, heads, window)
        group = heads // kv_heads
        first = max(0, start - window + 1) if window else 0  # no query of this step reads a key before it
        k = keys[0, :, first:total].float().repeat_interleave(group, dim=0)  # (Hq, total - first, hd)
        v = values[0, :, first:total].float().repeat_interleave(group, dim=0)
        query_pos = torch.arange(start, total, device=self.device)[:, None]  # (T, 1)
        key_pos = torch.arange(first, total, device=self.device)[None, :]  # (1, total - first)
        allowed = key_pos <= query_pos  # (T, total - first)
        if window:  # transformers' sliding_window_overlay: kv > q - window
            allowed &= key_pos > query_pos - window
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scale)  # (Hq, T, hd)
        return out.transpose(0, 1).reshape(count, heads * self.head_dim)

    def _decode_attention(self, q, keys, values, lengths, heads, window=None) -> torch.Tensor:
        """q (Hq, 1, hd) against the first ``lengths[0]`` cache rows (the last ``window`` of them when given)
        -> (1, Hq*hd)."""
        query = q.transpose(0, 1).contiguous()  # (1, Hq, hd)
        if self.compiled is not None:
            extra = {"window": window} if window else {}  # loaded kernels from before windows take none
            out = self.compiled.gqa_decode_attention(query, keys, values, lengths, self.scale, **extra).float()
        else:
            out = gqa_decode_attention(query, keys, values, lengths, self.scale, self.mode, window=window)
        return out.reshape(1, heads * self.head_dim)
