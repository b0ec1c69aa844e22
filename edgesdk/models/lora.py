"""LoRA adapters merged into a loaded model's weights (``edgesdk build --lora`` / ``--lora-scaled``), host only.

A LoRA adapter of rank r stores, for a linear layer ``y = W x`` with W of shape (out, in), two factors
A (r, in) and B (out, r); the fine-tuned layer computes ``W x + s * B (A x)``. Merging writes
``W' = W + s * (B @ A)`` into the weight once, so the build's stages, the export and the board see the
fine-tuned model and nothing of the adapter is left to run. The factor s is, as llama.cpp computes it
(``llama_adapter_lora_weight::get_scale``, used by ``llm_build_lora_mm``), the user's scale (``--lora``: 1,
``--lora-scaled FILE SCALE``: SCALE) times ``alpha / r``, and the user's scale alone where the adapter gives no
alpha; PEFT's ``LoraLayer.update_layer`` sets ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``), which is what ``merge_and_unload`` adds. Several adapters add their products one after
another, as llama.cpp sums each adapter's term.

Two forms are read:

- a PEFT directory (``adapter_config.json`` and ``adapter_model.safetensors`` or ``adapter_model.bin``), its
  keys ``base_model.model.<module>.lora_A.weight`` / ``.lora_B.weight`` (``.lora_A.<adapter>.weight`` in some
  tools), ``.lora_embedding_A`` / ``.lora_embedding_B`` for an ``nn.Embedding``, and the whole modules
  ``modules_to_save`` names (``<module>.modules_to_save[.<adapter>].weight`` or ``<module>.weight``), which
  replace the base weights as PEFT's ``ModulesToSaveWrapper`` does; factors of a module its ``target_modules`` /
  ``layers_to_transform`` / ``exclude_modules`` leave out are not merged, as PEFT adapts no such module and drops
  them as unexpected keys (noted in a warning and the manifest record's ``ignored``); of PEFT's LoRA variants, block-diagonal LoRA
  (``use_bdlora``: its stacked blocks are put on the diagonal) and VeLoRA / MonteCLoRA (whose extra state is used only
  in training) merge as plain LoRA, as PEFT merges them, and the others (DoRA, KaSA, Arrow's router, ...) are
  refused;
- a GGUF LoRA adapter as llama.cpp's ``convert_lora_to_gguf.py`` writes it: ``general.type`` adapter,
  ``adapter.type`` lora, ``adapter.lora.alpha``, and per base tensor ``<name>.lora_a`` (r, in) and
  ``<name>.lora_b`` (out, r) (numpy order), ``token_embd.weight.lora_a`` (vocab, r) and ``.lora_b`` (dim, r)
  for the embedding (``llm_build_inp_embd``: its A and B are flipped). GGUF names are mapped back to the model's
  modules with gguf-py's ``get_tensor_name_map``, as transformers' GGUF loader maps a model's tensors
  (``get_gguf_hf_weights_map``), and for the llama and smollm3 architectures the rows of ``lora_b`` of attn_q /
  attn_k are put back in Hugging Face order (:func:`edgesdk.models.loader.unpermute_llama_cpp_rows`, the inverse
  transformers' ``LlamaTensorProcessor`` applies to a GGUF model's weights): ``convert_hf_to_gguf.py``'s
  ``LlamaModel.permute`` (which ``SmolLM3Model(LlamaModel)`` inherits) reorders them for llama.cpp's rotary
  layout, in the adapter as in the base model.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgesdk.errors import ModelSourceError

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MLX_WEIGHTS = "adapters.safetensors"  # mlx-lm's adapter weights (mlx_lm.lora --adapter-path DIR)
# transformers' model_type -> the GGUF architecture llama.cpp's converter writes for it (convert_hf_to_gguf.py:
# MistralForCausalLM is converted as llama; transformers' get_gguf_hf_weights_map maps gemma3_text to gemma3).
# Phi-3 and Granite adapters are merged into the model's own modules (Phi-3's attn_qkv is qkv_proj, its ffn_up
# gate_up_proj, gate rows first as in Phi3MLP) before the model is loaded as the Llama it computes.
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "smollm3": "smollm3", "gemma3_text": "gemma3", "phi3": "phi3", "granite": "granite"}
# GGUF architectures whose converter reorders the attn_q / attn_k rows for llama.cpp's pairwise rotary
# (convert_hf_to_gguf.py: LlamaModel.permute, which SmolLM3Model(LlamaModel) and GraniteModel(LlamaModel) inherit;
# Phi3MiniModel keeps attn_qkv's rows as they are)
PAIRWISE_ROPE_ARCHITECTURES = {"llama", "smollm3", "granite"}
# PEFT's init_lora_weights values that change the base weights when the adapter is made (the adapter then holds
# the difference to that residual model, not to the base) unless PEFT converted it on saving (save_pretrained's
# path_initial_model_for_weight_conversion writes init_lora_weights true): PiSSA, OLoRA, CorDA and LoftQ, and
# LoRA-GA, whose LoraLayer.lora_ga_init subtracts scaling * B @ A from the base weight (PEFT 0.21)
BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")
# Parameters PEFT's LoRA variants keep for training only, saved beside the factors but not used by their inference
# forward or their merge (peft/tuners/lora/variants.py: VeloraLinearVariant's lora_velora_embed buffer, read only
# while training; MontecloraLinearVariant's lora_monteclora_sampler, which perturbs lora_A only while training;
# both merge B @ A * scaling as a plain LoRA), and the config option that adds each
TRAINING_ONLY_STATE = {"lora_velora_embed": "velora_config", "lora_monteclora_sampler": "monteclora_config"}
# PEFT task types whose model puts a task head on the base in place of its language-model head (PeftModelFor...
# adds the head's module names to modules_to_save): such an adapter's fine-tuned model classifies, it does not generate
HEAD_TASK_TYPES = {"SEQ_CLS": "classifier / score", "TOKEN_CLS": "classifier / score", "QUESTION_ANS": "qa_outputs"}


class LoraMissingFactors(UserWarning):
    """The module kinds a PEFT adapter's target_modules names whose factors its weights file does not hold: PEFT
    puts a LoRA layer on them and loads nothing into it ("Found missing adapter keys"), so they compute the base
    model's weights; a config and weights file of different adapters, or a training run cut short, look the same.
    ``edgesdk build`` prints it as its own line."""


class LoraMergeNote(UserWarning):
    """The factors of modules a PEFT adapter's adapter_config.json leaves out, which the merge leaves out as PEFT
    does; they are also in the manifest record's ``ignored``, which ``edgesdk build`` and ``edgesdk eval
    --reference`` print as their own line instead (:func:`left_out_warning`)."""


@dataclass(frozen=True)
class LoraAdapter:
    """One adapter to merge: its file or directory and the user's scale (llama.cpp's ``--lora`` is 1.0,
    ``--lora-scaled FNAME SCALE`` the given scale). ``option``: the one it was given with, ``--lora`` or
    ``--lora-scaled``, which errors name (not part of the adapter's identity: equal adapters merge the same)."""

    path: str
    scale: float = 1.0
    option: str = field(default="--lora", compare=False)

    @property
    def named(self) -> str:
        """How an error names the adapter: the option, path and (``--lora-scaled``) scale it came with."""
        return self.given(self.path)

    def given(self, path: str) -> str:
        """The option passing ``path`` as this adapter was passed: ``--lora PATH``, or ``--lora-scaled PATH SCALE``
        with this adapter's scale."""
        if self.option == "--lora-scaled":
            return f"--lora-scaled {path} {self.scale:.15g}"
        return f"--lora {path}"


@dataclass
class _Update:
    """One low-rank update: ``delta = left @ right`` (the weight's shape) times ``factor`` (alpha / r)."""

    module: str  # the model's module name
    key: str  # the adapter's tensor name, for messages
    left: Any  # torch tensor (rows, r)
    right: Any  # torch tensor (r, cols)
    factor: float
    rank: int


@dataclass
class ReadAdapter:
    """An adapter read and checked against one model, ready to merge."""

    adapter: LoraAdapter
    form: str  # "peft" or "gguf"
    weights_file: Path
    updates: list[_Update] = field(default_factory=list)
    replaced: dict[str, Any] = field(default_factory=dict)  # parameter name -> its new value
    alpha: float | None = None
    ignored: list[str] = field(default_factory=list)  # modules whose factors PEFT does not load (not targeted)
    untied: int = 0  # parameters added by giving a tied LM head its own weight (_untie_if_touched)

    def record(self) -> dict:
        """What the bundle manifest records of the adapter: of a PEFT adapter also the sha256 of its
        adapter_config.json, whose lora_alpha, use_rslora and rank / alpha patterns set each module's scale, and
        (``ignored``) the modules whose factors it holds but its target_modules / layers_to_transform leave out, which
        PEFT does not load and the merge leaves out too."""
        from edgesdk.hashing import sha256_file

        path = Path(self.adapter.path).expanduser().resolve()
        config = self.weights_file.parent / PEFT_CONFIG if self.form == "peft" else None
        return {"path": str(path), "form": self.form, "file": self.weights_file.name,
                "sha256": sha256_file(self.weights_file),
                **({"config_sha256": sha256_file(config)} if config is not None else {}),
                "scale": self.adapter.scale,
                "rank": max((update.rank for update in self.updates), default=0),
                **({"alpha": self.alpha} if self.alpha is not None else {}),
                "modules": len({update.module for update in self.updates}),
                **({"replaced": sorted(self.replaced)} if self.replaced else {}),
                **({"ignored": sorted(self.ignored)} if self.ignored else {}),
                # the merge gave the tied LM head its own weight: the source's parameters and tying are the
                # bundle's less these
                **({"untied_parameters": self.untied} if self.untied else {})}


def check_adapter(adapter: LoraAdapter) -> str:
    """The form of ``adapter``'s path ("peft" or "gguf"), refusing a missing path, a whole model, a file of
    another kind, a scale that is not a finite number, and what a PEFT adapter's adapter_config.json or a GGUF
    adapter's header sets that edgesdk does not merge (DoRA, another PEFT type, adapter.type not lora, ...): checked
    before the model is fetched or loaded. What needs the model (the factors' modules and shapes, a GGUF adapter's
    architecture) is checked when the adapter is merged."""
    from edgesdk.models.sources import lfs_pointer, lfs_pointer_error

    path = Path(adapter.path).expanduser()
    where = adapter.named
    if not isinstance(adapter.scale, (int, float)) or not math.isfinite(adapter.scale):
        raise ModelSourceError(f"--lora-scaled {adapter.path} {adapter.scale}: the scale is not a finite number",
                               "pass a number such as 0.5 or 1 (llama.cpp's --lora-scaled FNAME SCALE)")
    if path.is_dir():
        if is_mlx_adapter(path):
            raise ModelSourceError(
                f"{where}: {path} is an mlx-lm adapter ({MLX_WEIGHTS}, lora_parameters in {PEFT_CONFIG}), not a PEFT "
                "or GGUF LoRA adapter: its tensor names, factor layout and scale are mlx-lm's own",
                f"fuse it into its base with mlx-lm (mlx_lm.fuse --model BASE --adapter-path {shlex.quote(str(path))} "
                "--save-path fused --de-quantize) and pass the fused directory with --model")
        if (path / PEFT_CONFIG).is_file():
            if not any((path / name).is_file() for name in PEFT_WEIGHTS):
                raise ModelSourceError(f"{where}: the PEFT adapter directory has {PEFT_CONFIG} but no weights "
                                       f"({' or '.join(PEFT_WEIGHTS)})",
                                       "copy the adapter's weights file beside its adapter_config.json")
            pointers = [path / name for name in PEFT_WEIGHTS if lfs_pointer(path / name)]
            if pointers:  # a clone without Git LFS: safetensors would stop on "header too large"
                raise lfs_pointer_error(where, pointers)
            _peft_config(adapter, path)
            return "peft"
        if (path / "config.json").is_file():
            raise ModelSourceError(f"{where}: {path} is a whole model (config.json), not a LoRA adapter",
                                   f"pass it with --model, or pass the adapter directory (with {PEFT_CONFIG}) with "
                                   f"{adapter.option}")
        if (path / "snapshots").is_dir() or (path.name.startswith("models--") and (path / "blobs").is_dir()):
            # huggingface_hub's cache entry (models--org--name), which --model reads at the snapshot refs/main names;
            # the adapter's files are in that snapshot, and the build key and the manifest record the path given
            from edgesdk.models.sources import _hub_cache_snapshot

            snapshot = _hub_cache_snapshot(path, option=adapter.option, given=adapter.given)
            ggufs = sorted(snapshot.glob("*.gguf")) if not (snapshot / PEFT_CONFIG).is_file() else []
            raise ModelSourceError(f"{where}: the directory is a Hugging Face Hub cache entry, not the adapter's own "
                                   f"directory: its files are in the snapshot {snapshot.name} (refs/main, or its only "
                                   "snapshot)",
                                   f"pass the snapshot's GGUF adapter: {adapter.given(shlex.quote(str(ggufs[0])))}"
                                   if ggufs else f"pass the snapshot: {adapter.given(shlex.quote(str(snapshot)))}")
        weights = [name for name in PEFT_WEIGHTS if (path / name).is_file()]
        if weights:  # a PEFT adapter copied without its config, which gives the factors' rank and lora_alpha
            raise ModelSourceError(f"{where}: the directory holds the PEFT adapter weights {weights[0]} but no "
                                   f"{PEFT_CONFIG}, whose r and lora_alpha give the scale (alpha / r) of its factors",
                                   f"copy the adapter's {PEFT_CONFIG} (PeftModel.save_pretrained writes it beside the "
                                   f"weights) into {path}")
        inside = sorted((found.parent.name for found in path.glob(f"*/{PEFT_CONFIG}")),  # checkpoint-500 first
                        key=lambda name: [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)])
        if inside:  # PeftModel.save_pretrained writes an adapter not named "default" to <dir>/<name>/, a Trainer
            # its checkpoints to <dir>/checkpoint-<step>/
            raise ModelSourceError(f"{where}: the directory has no {PEFT_CONFIG} itself, but its subdirectories "
                                   f"{', '.join(inside[:6])}{' ...' if len(inside) > 6 else ''} hold PEFT adapters",
                                   f"pass the adapter's own directory, e.g. "
                                   f"{adapter.given(shlex.quote(str(path / inside[-1])))}")
        ggufs = sorted(path.glob("*.gguf"))
        if ggufs:  # a downloaded GGUF adapter repository: llama.cpp's --lora takes the adapter file, not its directory
            raise ModelSourceError(f"{where}: the directory has no {PEFT_CONFIG}, so it is no PEFT LoRA adapter, but "
                                   f"it holds the GGUF file(s) {', '.join(found.name for found in ggufs[:6])}"
                                   f"{' ...' if len(ggufs) > 6 else ''}",
                                   f"pass the GGUF adapter file itself, e.g. "
                                   f"{adapter.given(shlex.quote(str(ggufs[0])))}")
        raise ModelSourceError(f"{where}: the directory has no {PEFT_CONFIG}, so it is no PEFT LoRA adapter",
                               "pass a PEFT adapter directory (save_pretrained of a PeftModel) or a GGUF LoRA "
                               "adapter (llama.cpp's convert_lora_to_gguf.py)")
    if not path.is_file():
        raise ModelSourceError(f"{where}: no such file or directory",
                               "pass a PEFT adapter directory or a GGUF LoRA adapter file" + _hub_id_hint(adapter))
    if path.name in (*PEFT_WEIGHTS, PEFT_CONFIG) and (path.parent / PEFT_CONFIG).is_file():
        # llama.cpp's --lora takes a file; a PEFT adapter is its directory, whose adapter_config.json gives the factors'
        # rank and alpha (the scale alpha / r), which its weights file alone does not
        raise ModelSourceError(f"{where}: the file is the {path.name} of the PEFT adapter directory {path.parent}, "
                               f"which is read whole ({PEFT_CONFIG} gives the rank and lora_alpha that scale the "
                               "factors)", f"pass the adapter's directory with --lora: {shlex.quote(str(path.parent))}"
                               if adapter.option == "--lora" else
                               f"pass the adapter's directory: {adapter.given(shlex.quote(str(path.parent)))}")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF" and lfs_pointer(path):
        raise lfs_pointer_error(where, [path])
    if magic != b"GGUF":
        raise ModelSourceError(f"{where}: the file is not GGUF (first bytes {magic!r}, expected b'GGUF')",
                               "pass a GGUF LoRA adapter (llama.cpp's convert_lora_to_gguf.py writes one) or a PEFT "
                               f"adapter directory (with {PEFT_CONFIG})")
    # a whole model's GGUF, or an adapter that is no plain LoRA, is refused here, not after the base model loads
    _gguf_adapter_alpha(adapter, _gguf_adapter_reader(adapter, path))
    return "gguf"


def _hub_id_hint(adapter: LoraAdapter) -> str:
    """The rest of the fix for an adapter path that is not there but reads as a Hugging Face Hub id ("org/name"),
    which --lora, like llama.cpp's --lora and like --model, does not download: its cached copy where
    huggingface_hub's cache holds one (the snapshot refs/main names), else the download command; "" otherwise."""
    from edgesdk.models.sources import _hub_cache_snapshot, hub_cache_dir, looks_like_hub_id

    spec = adapter.path
    if not looks_like_hub_id(spec) or spec.endswith(".gguf"):
        return ""
    entry = hub_cache_dir() / f"models--{spec.replace('/', '--')}"
    if entry.is_dir():
        try:
            cached = _hub_cache_snapshot(entry, option=adapter.option, given=adapter.given)
        except ModelSourceError:
            cached = entry  # the cache entry's own refusal names the snapshot to pick
        return (f"; '{spec}' looks like a Hugging Face Hub id, which edgesdk does not download: pass its cached copy, "
                f"{adapter.given(shlex.quote(str(cached)))}")
    return (f"; '{spec}' looks like a Hugging Face Hub id, which edgesdk does not download: download it first (hf "
            f"download {spec} --local-dir {shlex.quote(spec.split('/')[1])}) and pass that directory, "
            f"{adapter.given(shlex.quote(spec.split('/')[1]))}")


def _gguf_adapter_reader(adapter: LoraAdapter, path: Path):
    """The GGUFReader of a GGUF file given with --lora, refusing one that cannot be read or whose ``general.type``
    is not ``adapter`` (a whole model: llama.cpp's ``llama_adapter_lora_init_impl`` refuses it the same way,
    "expect general.type to be 'adapter'")."""
    from gguf import GGUFReader

    where = adapter.named
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # gguf raises ValueError and struct errors for damaged files
        raise ModelSourceError(f"{where}: cannot read the GGUF file: {type(exc).__name__}: {exc}",
                               "check that the file is complete (convert the adapter again)") from exc
    found = reader.fields.get("general.type")
    kind = None if found is None else found.contents()
    if kind != "adapter" and _is_control_vector(reader):
        raise ModelSourceError(
            f"{where}: the GGUF file is a control vector (general.architecture 'controlvector', tensors "
            "direction.<layer>), not a LoRA adapter: llama.cpp's --control-vector adds its direction to each layer's "
            "output at run time, and it holds no low-rank factors to merge into the weights",
            "pass a LoRA adapter with --lora (llama.cpp's convert_lora_to_gguf.py writes one); edgesdk does not "
            "apply control vectors")
    if kind != "adapter":
        told = f"general.type is {kind!r}" if kind is not None else "has no general.type"
        raise ModelSourceError(f"{where}: the GGUF file {told}, not 'adapter': it holds a model, not a LoRA adapter",
                               "pass a whole model with --model, and a LoRA adapter (llama.cpp's "
                               "convert_lora_to_gguf.py writes one) with --lora")
    return reader


def _gguf_adapter_alpha(adapter: LoraAdapter, reader) -> float:
    """A GGUF LoRA adapter's ``adapter.lora.alpha`` (0 where absent, as llama.cpp reads it: no alpha / r scaling),
    refusing an ``adapter.type`` other than lora, an activated LoRA (``adapter.alora.invocation_tokens``) and an
    alpha that is no finite number >= 0."""
    where = adapter.named

    def field(key: str):
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    adapter_type = field("adapter.type")
    if adapter_type != "lora":
        raise ModelSourceError(f"{where}: adapter.type is {adapter_type!r}, expected 'lora'",
                               "pass a LoRA adapter (llama.cpp's convert_lora_to_gguf.py writes one)")
    if field("adapter.alora.invocation_tokens") is not None:
        raise ModelSourceError(f"{where}: the adapter is an activated LoRA (adapter.alora.invocation_tokens), which "
                               "applies only after its invocation tokens and cannot be merged into the weights",
                               "use a plain LoRA adapter")
    alpha = field("adapter.lora.alpha") or 0.0  # llama.cpp: absent reads as 0, and 0 means no alpha / r
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
        raise ModelSourceError(f"{where}: adapter.lora.alpha is {alpha!r:.60}, expected a finite number >= 0 (0 or "
                               "absent: no alpha / r scaling, as llama.cpp reads it)",
                               "convert the adapter again with llama.cpp's convert_lora_to_gguf.py")
    return float(alpha)


def _is_control_vector(reader) -> bool:
    """Whether a GGUF file is a control vector as llama.cpp's cvector-generator (and repeng's export_gguf) writes
    one: ``general.architecture`` controlvector, one ``direction.<layer>`` tensor per layer, no ``general.type``."""
    found = reader.fields.get("general.architecture")
    if found is not None and found.contents() == "controlvector":
        return True
    return bool(reader.tensors) and all(re.fullmatch(r"direction\.\d+", tensor.name) for tensor in reader.tensors)


def is_mlx_adapter(directory: Path) -> bool:
    """Whether ``directory`` holds an mlx-lm adapter (``mlx_lm.lora --adapter-path DIR``): its weights file
    adapters.safetensors, or an adapter_config.json of mlx-lm's fields."""
    return (directory / MLX_WEIGHTS).is_file() or _mlx_config(directory)


def _mlx_config(directory: Path) -> bool:
    """Whether ``directory``'s adapter_config.json is mlx-lm's (``mlx_lm.lora`` writes ``fine_tune_type`` and
    ``lora_parameters`` {rank, scale, dropout, keys}; PEFT's LoraConfig has neither)."""
    try:
        config = json.loads((directory / PEFT_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "peft_type" not in config and (
        "lora_parameters" in config or "fine_tune_type" in config)


def gguf_architecture(source, model) -> str | None:
    """The GGUF architecture of the base model: a GGUF source's ``general.architecture``, else the one
    llama.cpp's converter writes for the model's type (None for a type it has none for)."""
    if source is not None and source.kind == "gguf":
        from gguf import GGUFReader

        found = GGUFReader(str(source.path)).fields.get("general.architecture")
        if found is not None:
            return str(found.contents())
    return GGUF_ARCHITECTURES.get(getattr(model.config, "model_type", None))


def merge_adapters(model, adapters, base_architecture: str | None = None) -> list[dict]:
    """Merge each adapter into ``model``'s weights in place (float32, no autograd), in order, and return what
    the manifest records of them. ``base_architecture``: the base's GGUF architecture (gguf_architecture),
    which a GGUF adapter must name."""
    import torch

    records = []
    for adapter in adapters:
        form = check_adapter(adapter)
        read = (_read_peft(adapter, model) if form == "peft" else
                _read_gguf(adapter, model, base_architecture or gguf_architecture(None, model)))
        with torch.no_grad():
            _apply(model, read)
        records.append(read.record())
    return records


def left_out_warning(record: dict, recorded_in: str | None = "the manifest") -> str | None:
    """The warning ``edgesdk build`` and ``edgesdk eval --reference`` print as their own line for a merged adapter's
    record (:func:`merge_adapters`) whose ``ignored`` modules its adapter_config.json leaves out (not merged, as
    PEFT does not load them; the merge's LoraMergeNote, which both silence), naming the first three; None where it
    has none. ``recorded_in``: where all of them are listed (None: nowhere the caller knows of)."""
    ignored = record.get("ignored") or []
    if not ignored:
        return None
    shown = ", ".join(ignored[:3]) + (f" and {len(ignored) - 3} more" if len(ignored) > 3 else "")
    return (f"warning: {len(ignored)} module(s) whose LoRA factors {record['path']} holds are not merged: its "
            f"{PEFT_CONFIG}'s target_modules / layers_to_transform / exclude_modules leave them out, and PEFT does "
            f"not load them ({shown}" + (f"; {recorded_in} records them all)" if recorded_in else ")"))


def _apply(model, read: ReadAdapter) -> None:
    import torch

    touched = {f"{update.module}.weight" for update in read.updates} | set(read.replaced)
    read.untied = _untie_if_touched(model, touched)
    parameters = dict(model.named_parameters(remove_duplicate=False))
    for name, value in read.replaced.items():
        parameters[name].copy_(value.to(torch.float32))
    scale = float(read.adapter.scale)
    for update in read.updates:
        # W + s * (left @ right) in float32 by one addmm (no dense delta is made), rounded once to the weight's
        # dtype: a bfloat16 / float16 weight is widened for the sum and written back, one module at a time
        weight = parameters[f"{update.module}.weight"]
        merged = weight if weight.dtype == torch.float32 else weight.to(torch.float32)
        merged.addmm_(update.left.to(torch.float32), update.right.to(torch.float32), alpha=scale * update.factor)
        if merged is not weight:
            weight.copy_(merged)
        del merged


def _untie_if_touched(model, touched: set[str]) -> int:
    """A model whose output layer shares the embedding's weight (tie_word_embeddings) gets its own output
    weight where an adapter changes one of the two: a LoRA on ``lm_head`` (or a replaced ``embed_tokens``)
    changes that module only in the fine-tuned model (PEFT wraps the module, not the shared tensor), while an
    in-place merge into the shared tensor would change both. Returns the parameters that adds (0: nothing was
    untied), which the build says and subtracts again to record the source as it was (tied, its own count)."""
    import torch

    output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if output is None or embedding is None or output.weight is not embedding.weight:
        return 0
    names = {name for name, parameter in model.named_parameters(remove_duplicate=False)
             if parameter is embedding.weight}
    if not names & touched:
        return 0
    output.weight = torch.nn.Parameter(embedding.weight.detach().clone(),
                                       requires_grad=embedding.weight.requires_grad)
    model.config.tie_word_embeddings = False
    text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    if text_config is not None and text_config is not model.config:
        text_config.tie_word_embeddings = False
    return output.weight.numel()


# ---------------------------------------------------------------------------------------------------- PEFT


_LORA_KEY = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_A|lora_B)(?:\.(?P<name>[^.]+))?\.weight$")
_EMBEDDING_KEY = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_embedding_A|lora_embedding_B)(?:\.(?P<name>[^.]+))?$")
_SAVED_KEY = re.compile(r"^(?P<module>.+?)\.modules_to_save(?:\.(?P<name>[^.]+))?\.(?P<param>weight|bias)$")
_PLAIN_KEY = re.compile(r"^(?P<module>.+)\.(?P<param>weight|bias)$")


def _pattern_value(patterns: dict | None, module: str, default):
    """PEFT's ``get_pattern_key`` (peft/utils/other.py): the first key of ``rank_pattern`` / ``alpha_pattern``,
    in their order, that the module name ends with as a regular expression after a dot
    (``re.match(rf"(.*\\.)?({key})$", name)``), else the default. ``module``: the name PEFT matched, the module's
    path in the model it wrapped (``LoraModel._create_and_replace``'s ``current_key``), which is the adapter key's
    path under ``base_model.model.``."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def _peft_config(adapter: LoraAdapter, directory: Path) -> dict:
    where = adapter.named
    try:
        config = json.loads((directory / PEFT_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(f"{where}: cannot read {directory / PEFT_CONFIG}: {exc}",
                               "check that the file is complete JSON as PEFT writes it") from exc
    if not isinstance(config, dict):
        raise ModelSourceError(f"{where}: {PEFT_CONFIG} holds {type(config).__name__}, expected a JSON object",
                               "pass the directory PeftModel.save_pretrained wrote")
    peft_type = config.get("peft_type", "LORA")
    refused = []
    if peft_type != "LORA":
        refused.append((f"peft_type {peft_type!r}", "only LoRA adapters (peft_type LORA) are merged"))
    task_type = config.get("task_type")
    if isinstance(task_type, str) and task_type in HEAD_TASK_TYPES:
        refused.append((f"task_type {task_type!r}",
                        f"it was trained with a task head on the base ({HEAD_TASK_TYPES[task_type]}, which PEFT adds to "
                        "modules_to_save) in place of its language-model head, and edgesdk builds the causal LM, "
                        "whose output is the next token",
                        f"pass an adapter trained for text generation (LoraConfig(task_type=\"CAUSAL_LM\")) with "
                        f"{adapter.option}"))
    for option, why in (("use_dora", "DoRA rescales each merged row by a learned magnitude"),
                        ("lora_bias", "its lora_B bias is not merged"),
                        ("use_qalora", "QALoRA pools the input in groups before lora_A"),
                        ("layer_replication", "it repeats decoder layers, changing the model's structure"),
                        ("alora_invocation_tokens", "an activated LoRA applies only after its invocation tokens"),
                        ("trainable_token_indices", "its trainable token rows are not merged"),
                        ("target_parameters", "it adapts parameters, not nn.Linear modules"),
                        ("kasa_config", "KaSA truncates the base weight's smallest singular components and scales "
                         "B @ A by a learned diagonal (lora_diag)")):
        value = config.get(option)
        if value:
            refused.append((f"{option}: {json.dumps(value)[:60]}", why))
    arrow = config.get("arrow_config")
    if arrow:  # PEFT's ArrowLinearVariant.merge_safe / merge_unsafe: "Cannot merge an active Arrow router adapter"
        tasks = arrow.get("task_adapter_names") if isinstance(arrow, dict) else None
        tasks = [name for name in tasks if isinstance(name, str) and name] if isinstance(tasks, list) else []
        saved = [directory.parent / name for name in tasks if (directory.parent / name / PEFT_CONFIG).is_file()]
        refused.append((f"arrow_config: {json.dumps(arrow)[:60]}",
                        "it is the router of PEFT's Arrow, which picks among its task adapters"
                        + (f" ({', '.join(tasks[:6])})" if tasks else "") + " token by token, a choice no merged "
                        "weight makes; its own factors are untrained (lora_B zero), and PEFT refuses to merge it too "
                        "('Cannot merge an active Arrow router adapter')",
                        f"pass the task adapter of the task the bundle is for with {adapter.option}"
                        + (f", e.g. {adapter.given(shlex.quote(str(saved[0])))}" if saved else
                           " (PeftModel.save_pretrained writes each beside the router, in a directory of its name)")))
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(BASE_CHANGING_INITS):
        refused.append((f"init_lora_weights {init!r}", "the adapter is relative to a base model its initialisation "
                        "changed, not to the base model",
                        "save it converted to a plain LoRA (PEFT's peft_model.save_pretrained(dir, "
                        "path_initial_model_for_weight_conversion=<the adapter saved before training>)) and pass dir "
                        f"with {adapter.option}, or merge it in the session that trained it (peft_model.merge_and_unload()"
                        ".save_pretrained(dir)) and pass that directory with --model"))
    if refused:
        what, why, *fix = refused[0]
        raise ModelSourceError(
            f"{where}: the adapter sets {what}, which edgesdk does not merge: {why}",
            fix[0] if fix else "merge it with PEFT on the host (PeftModel.from_pretrained(base, adapter)"
            ".merge_and_unload().save_pretrained(dir)) and pass that directory with --model")
    for name in ("r", "lora_alpha"):
        value = config.get(name, 8)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ModelSourceError(f"{where}: {PEFT_CONFIG} gives {name} {value!r}, expected a positive number",
                                   "pass the adapter_config.json PEFT wrote with the adapter")
    for name, what in (("r", "rank"), ("lora_alpha", "alpha")):
        _check_setting(where, name, config.get(name, 8), what)
    for name, what in (("rank_pattern", "rank"), ("alpha_pattern", "alpha")):
        patterns = config.get(name)
        if patterns is None:
            continue
        if not isinstance(patterns, dict):
            raise ModelSourceError(
                f"{where}: {PEFT_CONFIG} gives {name} {json.dumps(patterns)[:60]}, expected a JSON object of module "
                f"name patterns and their {what}s, e.g. {{\"q_proj\": 8}}",
                "pass the adapter_config.json PEFT wrote with the adapter ({} where no module has its own)")
        for key, value in patterns.items():
            _check_pattern_key(where, name, key)
            _check_setting(where, f"{name}[{key!r}]", value, what)
    _check_module_names(where, config)
    return config


# adapter_config.json's module selections as PEFT reads them (LoraConfig; tuners_utils.check_target_module_exists):
# each a list of module names, a string (a regular expression matched against the whole module name; for
# modules_to_save one name), or null, with an example of the list form
MODULE_NAME_FIELDS = {"target_modules": '["q_proj", "v_proj"]', "exclude_modules": '["lm_head"]',
                      "modules_to_save": '["lm_head"]', "layers_pattern": '["layers"]'}
PEFT_BIASES = ("none", "all", "lora_only")  # LoraConfig.bias; _mark_only_adapters_as_trainable refuses others


def _check_module_names(where: str, config: dict) -> None:
    """adapter_config.json's target_modules, exclude_modules, modules_to_save, layers_pattern (a list of names, a
    string or null), layers_to_transform (a layer index, a list of them or null) and bias (none, all or lora_only),
    or the refusal naming the field and its value: a wrong type stopped the merge with a bare TypeError after the
    model had loaded, or selected modules no PEFT would."""
    fix = "pass the adapter_config.json PEFT wrote with the adapter"
    for name, example in MODULE_NAME_FIELDS.items():
        value = config.get(name)
        if value is None or (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            continue
        if not isinstance(value, str):
            raise ModelSourceError(
                f"{where}: {PEFT_CONFIG} gives {name} {json.dumps(value)[:60]}, expected a list of module names "
                f"(e.g. {example}), a string or null",
                f"correct {name} in {PEFT_CONFIG} (e.g. \"{name}\": {example}), or {fix}")
        if name != "modules_to_save":  # PEFT matches the others as regular expressions (re.fullmatch, re.match)
            try:
                re.compile(value)
            except re.error as exc:
                raise ModelSourceError(
                    f"{where}: {PEFT_CONFIG} gives {name} {json.dumps(value)[:80]}, which is not a regular "
                    f"expression ({exc}); PEFT matches a string {name} as one against the module names",
                    f"correct {name} in {PEFT_CONFIG} (a list such as {example}), or {fix}") from exc
    layers = config.get("layers_to_transform")
    if layers is not None and not _whole(layers) and not (isinstance(layers, list) and all(map(_whole, layers))):
        raise ModelSourceError(
            f"{where}: {PEFT_CONFIG} gives layers_to_transform {json.dumps(layers)[:60]}, expected a layer index, a "
            "list of layer indices (e.g. [0, 1]) or null",
            f"correct layers_to_transform in {PEFT_CONFIG} (null adapts every layer), or {fix}")
    bias = config.get("bias", "none")
    if bias not in PEFT_BIASES:
        raise ModelSourceError(
            f"{where}: {PEFT_CONFIG} gives bias {json.dumps(bias)[:60]}, expected one of "
            f"{', '.join(map(json.dumps, PEFT_BIASES))} (PEFT refuses other values too)",
            f"correct bias in {PEFT_CONFIG} (\"none\" where the adapter trained no biases), or {fix}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_pattern_key(where: str, name: str, key: str) -> None:
    """A ``rank_pattern`` / ``alpha_pattern`` key as PEFT's ``get_pattern_key`` uses it, a regular expression in
    ``(.*\\.)?({key})$``, or the refusal naming it: one that does not compile stopped the merge with a bare re.error
    after the model had loaded."""
    try:
        re.compile(rf"(.*\.)?({key})$")
    except re.error as exc:
        raise ModelSourceError(f"{where}: {PEFT_CONFIG} gives the {name} key {json.dumps(key)[:80]}, which is not a "
                               f"regular expression ({exc}); PEFT matches each key as one against the module names",
                               f"correct the key in {PEFT_CONFIG} (a module name such as \"q_proj\" or "
                               "\"layers\\\\.0\\\\.self_attn\\\\.q_proj\"), or pass the adapter_config.json PEFT "
                               "wrote with the adapter") from exc


def _check_setting(where: str, name: str, value, what: str) -> None:
    """A rank (a whole number >= 1) or an alpha (a finite number > 0) of adapter_config.json, or the refusal naming
    it: ``int()`` and ``float()`` failed on a text or null value with a bare ValueError or TypeError, a NaN alpha
    merged NaN weights, and a rank of 4.5 was read as 4."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if number and value > 0 and (what != "rank" or float(value).is_integer()):
        return
    expected = "a whole number >= 1" if what == "rank" else "a finite number > 0"
    raise ModelSourceError(f"{where}: {PEFT_CONFIG} gives {name} {json.dumps(value)[:60]}, expected {expected} "
                           f"(the LoRA {what})", "pass the adapter_config.json PEFT wrote with the adapter")


def _check_finite(where: str, key: str, tensor) -> None:
    """Refuse an adapter tensor holding NaN or infinity: merged, it made the model's logits NaN, which the export
    then blamed on a compression stage."""
    import numpy as np
    import torch

    if isinstance(tensor, np.ndarray):  # a GGUF adapter's dequantized factor (read-only: no torch view of it)
        finite = np.isfinite(tensor) if np.issubdtype(tensor.dtype, np.floating) else None
        bad, total = (int((~finite).sum()) if finite is not None else 0), int(tensor.size)
    else:
        finite = torch.isfinite(tensor) if tensor.is_floating_point() else None
        bad, total = (int((~finite).sum()) if finite is not None else 0), tensor.numel()
    if bad:
        raise ModelSourceError(f"{where}: {key} holds {bad} NaN or infinite value(s) of {total}: merged, "
                               "they would make every output NaN",
                               "pass an adapter saved from a training run that did not diverge (check its loss), "
                               "or save it again")


def _peft_tensors(adapter: LoraAdapter, directory: Path) -> tuple[Path, dict]:
    where = adapter.named
    weights = next(directory / name for name in PEFT_WEIGHTS if (directory / name).is_file())
    try:
        if weights.suffix == ".safetensors":
            from safetensors.torch import load_file

            return weights, load_file(str(weights), device="cpu")
        import torch

        tensors = torch.load(str(weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # safetensors and torch raise many types for damaged files
        raise ModelSourceError(f"{where}: cannot read {weights}: {type(exc).__name__}: {exc}",
                               "check that the file is complete (save the adapter again), or use safetensors "
                               "(PeftModel.save_pretrained(dir, safe_serialization=True))") from exc
    if not isinstance(tensors, dict):
        raise ModelSourceError(f"{where}: {weights} holds {type(tensors).__name__}, expected a state dict",
                               "save the adapter with PeftModel.save_pretrained")
    return weights, tensors


def _find_module(model, name: str):
    """The model's module ``name`` (a PEFT key's path under ``base_model.model.``), also where the adapter was
    made on the decoder without its head (``layers.0...`` for ``model.layers.0...``); (None, None) if none."""
    modules = dict(model.named_modules())
    for candidate in (name, f"model.{name}"):
        if candidate in modules and candidate:
            return candidate, modules[candidate]
    return None, None


def _bdlora_blocks(config: dict, name: str, a, b, rank: int, in_size: int, out_size: int):
    """A block-diagonal LoRA's factors (PEFT's ``use_bdlora``, BdLoraLinearVariant) as the full (r, in) A and
    (out, r) B: the module whose name holds a ``target_modules_bd_a`` pattern stores A's ``nblocks`` diagonal blocks
    stacked, (r, in / nblocks), one holding a ``target_modules_bd_b`` pattern B's, (out, r / nblocks); PEFT's
    ``BlockDiagonalLinear.weight_as_blockdiagonal_matrix`` puts them back on the diagonal (``torch.block_diag`` of
    the row chunks) for its merge. Other factors are returned as they are."""
    import torch

    settings = config.get("use_bdlora")
    if not isinstance(settings, dict) or not isinstance(settings.get("nblocks"), int) or settings["nblocks"] < 1:
        return a, b
    blocks = settings["nblocks"]

    def matches(option: str) -> bool:  # BdLoraLinearVariant.init: `pattern in target_name`
        return any(isinstance(pattern, str) and pattern in name for pattern in settings.get(option) or [])

    if matches("target_modules_bd_a") and in_size % blocks == 0 and tuple(a.shape) == (rank, in_size // blocks):
        a = torch.block_diag(*torch.chunk(a, blocks, dim=0))
    elif matches("target_modules_bd_b") and rank % blocks == 0 and tuple(b.shape) == (out_size, rank // blocks):
        b = torch.block_diag(*torch.chunk(b, blocks, dim=0))
    return a, b


def _peft_targets(config: dict, model, path: str) -> bool:
    """Whether PEFT puts a LoRA layer on the module ``path`` (the adapter key's path under ``base_model.model.``, the
    name PEFT matched), as ``tuners_utils.check_target_module_exists`` decides from adapter_config.json: not where
    exclude_modules names it; a string target_modules matched whole as a regular expression ("all-linear": every
    linear layer's last name but the output layer's, ``_maybe_include_all_linear_layers``); a list matching the name
    or its last dotted parts, and then, with layers_to_transform, only in those layers (the index after
    layers_pattern, or after any name). A null or empty target_modules leaves every factor in: PEFT fills in its
    per-architecture default when the adapter is made and saves that, and finds no module for an empty one."""
    import torch

    excluded = config.get("exclude_modules")
    if isinstance(excluded, str) and re.fullmatch(excluded, path):
        return False
    if isinstance(excluded, list) and (path in excluded or any(path.endswith(f".{name}") for name in excluded)):
        return False
    targets = config.get("target_modules")
    if not targets:
        return True
    if isinstance(targets, str) and targets.lower() == "all-linear":
        output = model.get_output_embeddings()
        head = {name for name, module in model.named_modules() if output is not None and module is output}
        targets = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                          if isinstance(module, torch.nn.Linear)} - head)
    if isinstance(targets, str):
        return re.fullmatch(targets, path) is not None
    if path in targets:
        return True
    if not any(path.endswith(f".{name}") for name in targets):
        return False
    layers = config.get("layers_to_transform")
    if layers is None or layers == []:
        return True
    patterns = config.get("layers_pattern") or [r"[^.]*"]
    found = next((match for pattern in ([patterns] if isinstance(patterns, str) else patterns)
                  if (match := re.match(rf".*\.{pattern}\.(\d+)\.", path))), None)
    if found is None:
        return False
    return int(found.group(1)) == layers if isinstance(layers, int) else int(found.group(1)) in layers


def _read_peft(adapter: LoraAdapter, model) -> ReadAdapter:
    """A PEFT LoRA adapter directory, checked against ``model``: each lora_A / lora_B pair on an nn.Linear
    (lora_embedding_A / B on an nn.Embedding) of the shapes that module takes and the rank the config gives
    it, and the modules_to_save weights of the module's shapes."""
    import torch

    directory = Path(adapter.path).expanduser()
    where = adapter.named
    config = _peft_config(adapter, directory)
    weights_file, tensors = _peft_tensors(adapter, directory)
    read = ReadAdapter(adapter=adapter, form="peft", weights_file=weights_file, alpha=float(config.get("lora_alpha", 8)))
    saved_modules = config.get("modules_to_save") or []
    if isinstance(saved_modules, str):
        saved_modules = [saved_modules]
    pairs: dict[str, dict[str, tuple[str, Any]]] = {}
    fix_base = ("pass with --model the base model the adapter was trained on"
                + (f" ({config['base_model_name_or_path']}, as its {PEFT_CONFIG} names it)"
                   if config.get("base_model_name_or_path") else ""))

    embeddings = {name for name, module in model.named_modules()
                  if module is model.get_input_embeddings() or module is model.get_output_embeddings()}

    def check_vocabulary(key: str, name: str, module, rows: int) -> None:
        vocabulary = module.weight.shape[0]
        if rows != vocabulary:
            raise ModelSourceError(
                f"{where}: {key} has {rows} token rows, but '{name}' of the model has {vocabulary}: the adapter was "
                "trained on the base with its vocabulary resized (tokens added, e.g. by TRL's setup_chat_format or "
                "tokenizer.add_tokens and resize_token_embeddings)",
                f"resize the base and merge with PEFT on the host (base.resize_token_embeddings({rows}); "
                "PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(dir), the fine-tuned "
                "tokenizer saved to dir too) and pass that directory with --model")

    def module_of(key: str, path: str):
        name, module = _find_module(model, path)
        if module is None:
            raise ModelSourceError(f"{where}: {weights_file.name} holds {key} for a module '{path}' the model has "
                                   "not", fix_base)
        return name, module

    for key, tensor in tensors.items():
        path = key[len("base_model.model."):] if key.startswith("base_model.model.") else key
        lora = _LORA_KEY.match(path) or _EMBEDDING_KEY.match(path)
        if lora:
            pair = pairs.setdefault(lora["module"], {})
            if lora["part"][-1] in pair:  # one factor twice: factors of several adapters (lora_A.<name>) in one file
                raise ModelSourceError(
                    f"{where}: {weights_file.name} holds two {lora['part']} factors of '{lora['module']}': "
                    f"{pair[lora['part'][-1]][0]} and {key}, the factors of more than one adapter",
                    "save each adapter on its own (PeftModel.save_pretrained(dir, selected_adapters=[name])) and pass "
                    "each with its own --lora")
            pair[lora["part"][-1]] = (key, tensor)
            continue
        state = next((option for part, option in TRAINING_ONLY_STATE.items()
                      if f".{part}" in path and config.get(option)), None)
        if state:  # a training-only parameter of a LoRA variant the config sets: not part of the merged model
            continue
        if path.endswith(".base_layer.bias") and config.get("bias", "none") != "none":
            # bias "all" / "lora_only": PEFT trains the biases and get_peft_model_state_dict saves the bias of an
            # adapted layer under the layer it wraps (<module>.base_layer.bias); loading it replaces the bias
            path = path[:-len(".base_layer.bias")] + ".bias"
        elif path.endswith(".base_layer.weight") or path.endswith(".base_layer.bias"):
            # the frozen base weight itself, which llama.cpp's convert_lora_to_gguf.py also skips; PEFT saves it
            # for a LoRA-adapted embedding or lm_head (save_embedding_layers), whose rows tell a resized vocabulary
            name, module = _find_module(model, path.rsplit(".base_layer.", 1)[0])
            if name in embeddings and path.endswith(".weight"):
                check_vocabulary(key, name, module, tensor.shape[0])
            continue
        saved = _SAVED_KEY.match(path)
        plain = _PLAIN_KEY.match(path)
        # a plain weight of the input or output embedding: PEFT's save_embedding_layers ("auto" where the
        # vocabulary was resized, or True) saves them whole, and loading the adapter puts them in the model
        # modules_to_save names match as PEFT's _set_trainable matches them: every module whose name ends with one
        # (``key.endswith(target_key)``, no dot needed: "norm" wraps input_layernorm and post_attention_layernorm too)
        target = saved or (plain if plain and (
            any(isinstance(m, str) and plain["module"].endswith(m) for m in saved_modules)
            or (plain["param"] == "bias" and config.get("bias", "none") != "none")
            or (plain["param"] == "weight" and _find_module(model, plain["module"])[0] in embeddings)) else None)
        if target is None:
            raise ModelSourceError(
                f"{where}: {weights_file.name} holds {key}, which is neither a LoRA factor (lora_A / lora_B) nor a "
                f"module its {PEFT_CONFIG} saves whole (modules_to_save: {saved_modules or 'none'})",
                "pass a PEFT LoRA adapter as PeftModel.save_pretrained writes it")
        name, module = module_of(key, target["module"])
        parameter = getattr(module, target["param"], None)
        if not isinstance(parameter, torch.nn.Parameter):
            raise ModelSourceError(f"{where}: {key} replaces the {target['param']} of '{name}', which has none",
                                   fix_base)
        if name in embeddings and target["param"] == "weight":
            check_vocabulary(key, name, module, tensor.shape[0])
        if tuple(tensor.shape) != tuple(parameter.shape):
            raise ModelSourceError(f"{where}: {key} has shape {tuple(tensor.shape)}, but '{name}.{target['param']}' "
                                   f"of the model has shape {tuple(parameter.shape)}", fix_base)
        if torch.equal(tensor.to(parameter.dtype), parameter.detach()):
            continue  # the base's own value (an embedding saved unchanged): nothing to replace, nothing to untie
        _check_finite(where, key, tensor)
        read.replaced[f"{name}.{target['param']}"] = tensor

    for path, pair in sorted(pairs.items()):
        if not _peft_targets(config, model, path):
            # factors of a module target_modules / layers_to_transform / exclude_modules leave out (lora_A / B of a
            # linear, lora_embedding_A / B of an embedding alike): PEFT puts no LoRA layer on it, and
            # set_peft_model_state_dict loads the file with strict=False, dropping them as unexpected keys
            # (transformers' load_adapter warns of them), so its merged model has none of them
            read.ignored.append(path)
            continue
        if len(pair) != 2:
            (key, _), = pair.values()
            missing = key.replace("lora_A", "lora_B") if "lora_A" in key else key.replace("lora_B", "lora_A")
            missing = missing.replace("embedding_A", "embedding_B") if "embedding_A" in key else \
                missing.replace("embedding_B", "embedding_A")
            raise ModelSourceError(f"{where}: {weights_file.name} holds {key} but not {missing}",
                                   "save the adapter again (both factors of every LoRA module are needed)")
        (key_a, a), (key_b, b) = pair["A"], pair["B"]
        name, module = module_of(key_a, path)
        embedding = "lora_embedding" in key_a
        expected_type = torch.nn.Embedding if embedding else torch.nn.Linear
        if not isinstance(module, expected_type):
            raise ModelSourceError(f"{where}: {key_a} adapts '{name}', a {type(module).__name__}, where its factors "
                                   f"fit an nn.{expected_type.__name__}",
                                   "edgesdk merges LoRA on the model's nn.Linear layers and its nn.Embedding")
        out_size, in_size = module.weight.shape
        if embedding:
            check_vocabulary(key_a, name, module, a.shape[-1])
        # matched against the module's name in the model PEFT wrapped (its current_key: the key's path), not the
        # name found here, which is "model."-prefixed for an adapter made on the decoder without its head
        rank = int(_pattern_value(config.get("rank_pattern"), path, config.get("r", 8)))
        alpha = float(_pattern_value(config.get("alpha_pattern"), path, config.get("lora_alpha", 8)))
        if not embedding:
            a, b = _bdlora_blocks(config, name, a, b, rank, in_size, out_size)
        if embedding:  # PEFT's Embedding: lora_embedding_A (r, num_embeddings), lora_embedding_B (dim, r)
            expected = {key_a: (rank, out_size), key_b: (in_size, rank)}
        else:  # nn.Linear(in, r) and nn.Linear(r, out): A (r, in), B (out, r)
            expected = {key_a: (rank, in_size), key_b: (out_size, rank)}
        for key, tensor in ((key_a, a), (key_b, b)):
            if tuple(tensor.shape) != expected[key]:
                raise ModelSourceError(
                    f"{where}: {key} has shape {tuple(tensor.shape)}, but '{name}' of the model "
                    f"({tuple(module.weight.shape)}) with rank {rank} ({PEFT_CONFIG}'s r"
                    + (", rank_pattern" if config.get("rank_pattern") else "") + f") takes {expected[key]}",
                    fix_base)
        for key, tensor in ((key_a, a), (key_b, b)):
            _check_finite(where, key, tensor)
        factor = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
        # PEFT's Embedding.get_delta_weight: transpose(B @ A); its Linear: B @ A (fan_in_fan_out is set to False
        # for an nn.Linear target when the adapter is made, so it does not transpose)
        left, right = (a.T, b.T) if embedding else (b, a)
        read.updates.append(_Update(module=name, key=key_a, left=left, right=right, factor=factor, rank=rank))
    lacking = _targets_without_factors(config, model, set(pairs) - set(read.ignored))
    if lacking and read.updates:
        adapted = sorted({path.rsplit(".", 1)[-1] for path in set(pairs) - set(read.ignored)})
        warnings.warn(f"{where}: its {PEFT_CONFIG}'s target_modules names {', '.join(lacking)}, but "
                      f"{weights_file.name} holds no LoRA factors of {'it' if len(lacking) == 1 else 'them'} (only "
                      f"of {', '.join(adapted)}): those modules keep the base model's weights, as in PEFT, which "
                      "warns of missing adapter keys; the config and the weights file may be of different adapters",
                      LoraMissingFactors, stacklevel=3)
    if read.ignored:
        left_out = _left_out(read.ignored)
        if not read.updates and not read.replaced:
            raise ModelSourceError(
                f"{where}: {weights_file.name} holds LoRA factors only of modules its {PEFT_CONFIG} leaves out "
                f"({left_out}; {_selection(config)}), which PEFT does not load: nothing would be merged",
                f"correct target_modules / layers_to_transform in {PEFT_CONFIG} to the modules the adapter was "
                "trained on, or pass the adapter_config.json PEFT wrote with the adapter")
        warnings.warn(f"{where}: {weights_file.name} holds LoRA factors of {len(read.ignored)} module(s) its "
                      f"{PEFT_CONFIG} leaves out ({left_out}; {_selection(config)}): they are not merged, as PEFT "
                      "does not load them (it adapts only the modules the config selects)", LoraMergeNote,
                      stacklevel=3)
    if not read.updates and not read.replaced:
        raise ModelSourceError(f"{where}: {weights_file.name} holds no LoRA factors and no saved modules",
                               "pass the directory PeftModel.save_pretrained wrote after training")
    return read


def _targets_without_factors(config: dict, model, adapted: set[str]) -> list[str]:
    """The entries of a list target_modules (or "all-linear"'s linear layer names) that name modules the model has
    but none of the ``adapted`` module paths (those with factors PEFT loads): PEFT wraps those modules and finds no
    factors for them (set_peft_model_state_dict: "Found missing adapter keys"). A regular expression names no
    module kinds, and an entry naming no module of the model is left to the factors' own checks."""
    import torch

    targets = config.get("target_modules")
    names = [name for name, _ in model.named_modules()]
    if isinstance(targets, str) and targets.lower() == "all-linear":
        output = model.get_output_embeddings()
        targets = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                          if isinstance(module, torch.nn.Linear) and module is not output})
    if not isinstance(targets, list):
        return []

    def names_one(target: str, name: str) -> bool:
        return name == target or name.endswith(f".{target}")

    return [target for target in targets if isinstance(target, str)
            and any(names_one(target, name) for name in names)
            and not any(names_one(target, path) for path in adapted)]


def _left_out(modules: list[str]) -> str:
    return ", ".join(modules[:6]) + (f" and {len(modules) - 6} more" if len(modules) > 6 else "")


def _selection(config: dict) -> str:
    """The adapter_config.json fields that select a PEFT adapter's modules, as a note quotes them."""
    return ", ".join(f"{name} {json.dumps(config[name])[:80]}" for name in
                     ("target_modules", "layers_to_transform", "layers_pattern", "exclude_modules")
                     if config.get(name) not in (None, []))


# ---------------------------------------------------------------------------------------------------- GGUF


def _read_gguf(adapter: LoraAdapter, model, base_architecture: str | None) -> ReadAdapter:
    """A GGUF LoRA adapter (llama.cpp's ``llama_adapter_lora_init_impl`` checks, in its order where they
    overlap), checked against ``model``."""
    import numpy as np
    import torch
    from gguf import dequantize

    path = Path(adapter.path).expanduser()
    where = adapter.named
    reader = _gguf_adapter_reader(adapter, path)

    def field(key: str):
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    arch = field("general.architecture")
    if arch != base_architecture:
        raise ModelSourceError(f"{where}: the adapter's architecture is {arch!r} (general.architecture), the base "
                               f"model's is {base_architecture!r}; llama.cpp refuses such an adapter too "
                               "(model arch and LoRA arch mismatch)",
                               "pass with --model the base model the adapter was converted for")
    alpha = _gguf_adapter_alpha(adapter, reader)
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next(key for key, value in MODEL_ARCH_NAMES.items() if value == arch)
    name_map = get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    modules, others = {}, {}  # GGUF name -> the model's linear / embedding layer; -> its other weighted layers
    for name, module in model.named_modules():
        mapped = name_map.get_name(name) if name else None
        if mapped is not None and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            modules.setdefault(f"{mapped}.weight", (name, module))
        elif mapped is not None and isinstance(getattr(module, "weight", None), torch.nn.Parameter):
            others.setdefault(f"{mapped}.weight", (name, module))
    pairs: dict[str, dict] = {}
    for tensor in reader.tensors:
        name = tensor.name
        part = name.rsplit(".", 1)[-1]
        if part not in ("lora_a", "lora_b"):
            why = ("a norm weight (mergekit's extracted LoRA carries them), which llama.cpp's --lora skips and edgesdk "
                   "does not merge" if name.endswith("_norm.weight") else "llama.cpp refuses this suffix too")
            raise ModelSourceError(f"{where}: the adapter holds the tensor {name}, not a .lora_a / .lora_b factor: "
                                   f"{why}", "convert the adapter with llama.cpp's convert_lora_to_gguf.py from a "
                                   "PEFT LoRA adapter")
        pairs.setdefault(name[:-len(".lora_a")], {})[part] = tensor
    read = ReadAdapter(adapter=adapter, form="gguf", weights_file=path, alpha=alpha or None)
    fix_base = "pass with --model the base model the adapter was converted for"
    for base_name, pair in sorted(pairs.items()):
        if len(pair) != 2:
            raise ModelSourceError(f"{where}: the adapter holds {next(iter(pair.values())).name} without its "
                                   f"{'lora_b' if 'lora_a' in pair else 'lora_a'}",
                                   "convert the adapter again (llama.cpp refuses a pair missing one component)")
        if base_name in others:  # llama.cpp finds the tensor, then refuses its shape: a norm's weight is a vector
            module_name, module = others[base_name]
            raise ModelSourceError(
                f"{where}: the adapter adapts {base_name}, which the base model has ({module_name}, a "
                f"{type(module).__name__} of weight shape {tuple(module.weight.shape)}) but which is no linear or "
                "embedding layer: a LoRA product B @ A is merged only into a weight matrix (llama.cpp applies one only "
                "to its matrix multiplications, llm_build_lora_mm, and the token embedding), and llama.cpp refuses "
                f"this pair too (tensor '{base_name}' has incorrect shape)",
                f"leave the {base_name}.lora_a / .lora_b pair out: convert the adapter again with llama.cpp's "
                "convert_lora_to_gguf.py from a PEFT LoRA adapter of the model's linear layers")
        if base_name not in modules:
            raise ModelSourceError(f"{where}: the adapter adapts {base_name}, which the base model does not have",
                                   fix_base)
        module_name, module = modules[base_name]
        a = np.asarray(dequantize(pair["lora_a"].data, pair["lora_a"].tensor_type), dtype=np.float32)
        b = np.asarray(dequantize(pair["lora_b"].data, pair["lora_b"].tensor_type), dtype=np.float32)
        out_size, in_size = module.weight.shape
        embedding = base_name == "token_embd.weight"
        rank = b.shape[-1]  # llama.cpp's rank: lora_b's ne[0]
        if embedding:  # llm_build_inp_embd: a (vocab, r) gathered by token, b (dim, r) applied after
            expected = {"lora_a": (out_size, rank), "lora_b": (in_size, rank)}
        else:
            expected = {"lora_a": (rank, in_size), "lora_b": (out_size, rank)}
        for part, value in (("lora_a", a), ("lora_b", b)):
            _check_finite(where, f"{base_name}.{part}", value)
            if value.shape != expected[part]:
                raise ModelSourceError(f"{where}: {base_name}.{part} has shape {value.shape}, but the base model's "
                                       f"{base_name} ({module_name}, {tuple(module.weight.shape)}) with rank {rank} "
                                       f"takes {expected[part]}", fix_base)
        if arch in PAIRWISE_ROPE_ARCHITECTURES and (".attn_q." in base_name or ".attn_k." in base_name):
            from edgesdk.models.loader import unpermute_llama_cpp_rows

            heads = model.config.num_attention_heads if ".attn_q." in base_name else model.config.num_key_value_heads
            b = unpermute_llama_cpp_rows(b, heads)
        left, right = (a, b.T) if embedding else (b, a)
        read.updates.append(_Update(module=module_name, key=f"{base_name}.lora_a",
                                    left=torch.from_numpy(np.array(left, dtype=np.float32, order="C")),
                                    right=torch.from_numpy(np.array(right, dtype=np.float32, order="C")),
                                    factor=alpha / rank if alpha else 1.0, rank=int(rank)))
    if not read.updates:
        raise ModelSourceError(f"{where}: the adapter holds no LoRA tensors", "convert the adapter again")
    return read
