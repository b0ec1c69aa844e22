"""``edgesdk build``: load -> stages (checkpointed) -> export + validate -> bundle.

Each step is recorded in the work directory when it finishes; ``resume=True`` skips the steps
already done.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from edgesdk import __version__
from edgesdk.build.checkpoint import (
    TERMS,
    WorkDir,
    check_work_dir,
    disk_full,
    disk_refused,
    file_fingerprint,
    first_stage_only,
    load_checkpoint,
    part_named,
    remove_work_dir,
    said,
    said_sets,
    save_checkpoint,
    sync_step_files,
)
from edgesdk.build.package import write_bundle
from edgesdk.build.recipes import ExportSection, load_recipe, override_key, pick_a_recipe_with
from edgesdk.build.registry import BuildContext, stage_spec
from edgesdk.build.sparse_step import check_kernel_sm
from edgesdk.bundle import Bundle, _bundle_holding, check_replaceable
from edgesdk.compress.data import DataConfig, no_training_text
from edgesdk.compress.measure import measured_as_exported
from edgesdk.compress.train import PROGRESS_ONLY_FIELDS, TrainingProgress, keeping_progress
from edgesdk.errors import BuildError, EdgeSDKError
from edgesdk.export.onnx_export import (
    MIN_CONTEXT,
    ExportConfig,
    bundle_context,
    check_exportable,
    export_model,
)
from edgesdk.export.validate import ValidationConfig, check_fits_context, validate_export, validate_fused
from edgesdk.models.lora import LoraAdapter, check_adapter
from edgesdk.models.sources import DEFAULT_MODEL, resolve_model
from edgesdk.profile import get_profile


@dataclass(frozen=True)
class BuildConfig:
    """One build: what model, for which board, with which recipe, written where."""

    target: str  # profile name, alias or YAML path
    model: str = DEFAULT_MODEL  # alias, Hugging Face directory or .gguf file
    # LoRA adapters merged into the model's weights right after it loads, before any stage (--lora, --lora-scaled)
    adapters: tuple[LoraAdapter, ...] = ()
    out: Path | None = None  # bundle directory; default bundles/<model>-<target>
    recipe: str | None = None  # shipped recipe name or YAML path; None: the target's default recipe
    overrides: tuple[str, ...] = ()  # "stage.field=value" changes to the recipe (--set)
    weight_bits: int | None = None  # the layers' weight bits (--weight-bits): QAT and a quantized export
    data: DataConfig = field(default_factory=DataConfig)  # training text for the compression stages
    # max_context; every other field set to other than its default is the recipe's export setting of that name, as
    # --set export.FIELD=VALUE (applied before weight_bits and ``overrides``, which may still change it)
    export: ExportConfig = field(default_factory=ExportConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    resume: bool = False  # continue a killed build from its work directory
    keep_work: bool = False  # keep checkpoints after a successful build
    progress: bool = True
    # whose names the build's messages give its options: "cli" edgesdk build's flags (--max-context 16), "python"
    # build_bundle()'s arguments (max_context=16), which is what a Python caller passed (edgesdk/api.py)
    terms: Literal["cli", "python"] = "cli"

    def __post_init__(self):
        if self.terms not in TERMS:
            raise BuildError(f"BuildConfig terms is {self.terms!r}; expected one of {', '.join(map(repr, TERMS))}",
                             "pass terms='cli' (edgesdk build's option names) or terms='python' (build_bundle()'s)")


def default_out(model: str, target: str, adapters: tuple[LoraAdapter, ...] = ()) -> Path:
    """bundles/<model>-<target>: a GGUF file's name without its suffix, a directory's whole name (dots are part
    of model names, as in Qwen2.5-0.5B: two models must not share one bundle directory), an alias as it is;
    ``+<adapter>`` added for each merged LoRA adapter, so a fine-tuned build does not replace the base's bundle."""
    stem = _model_stem(model)
    for adapter in adapters:
        stem += f"+{_model_stem(adapter.path)}"
    return Path("bundles") / f"{stem}-{target}"


def check_default_out(out: Path, source, terms: str = "cli") -> None:
    """Without --out, the bundle directory ``out`` (:func:`default_out`) is named after the model directory's name
    alone, so two models in directories of the same name (``runs/a/checkpoint-500`` and ``runs/b/checkpoint-500``,
    two ``merged`` or ``output`` folders) share it, and the second build replaced the first one's bundle unasked.
    A bundle there whose manifest records another model source (``model.before.source``: the alias, or the
    absolute path) is refused, before the model loads; --out given replaces a bundle as it always did. ``terms``:
    whose option names the message uses (edgesdk.build.checkpoint.said)."""
    try:
        recorded = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["model"]["before"]["source"]
    except (OSError, ValueError, KeyError, TypeError):  # no bundle there (check_replaceable refused anything else)
        return
    if recorded != source.name:
        raise BuildError(f"no {said('--out', terms)} given, and the default bundle directory {out} holds the bundle "
                         f"of another model, {recorded}, not {source.name} (their directories have the same name): "
                         "the build would replace it",
                         f"pass {said('--out', terms)} a directory for this model's bundle, or "
                         f"{said('--out', terms, out)} to replace that bundle")


def _model_stem(model: str) -> str:
    path = Path(model).expanduser()
    if model.lower().endswith(".gguf"):
        return path.stem
    if "/" in model or path.is_dir():
        return _hub_cache_name(path.resolve()) or path.resolve().name
    return model


def _hub_cache_name(path: Path) -> str | None:
    """The model's name for a Hugging Face Hub cache entry (``models--org--name``) or one of its snapshots
    (``models--org--name/snapshots/<commit>``), whose own names are no model's name; None for other paths. A
    repository without an organisation (``gpt2``) is cached as ``models--name``: that name is taken for an entry only
    where it holds the cache's ``snapshots`` folder (any other directory keeps its whole name)."""
    entry = path.parent.parent if path.parent.name == "snapshots" else path
    parts = entry.name.split("--", 2)  # ["models", org, name] or ["models", name]
    if parts[0] != "models" or not parts[-1]:
        return None
    if len(parts) == 3:
        return parts[2]
    return parts[1] if len(parts) == 2 and (entry / "snapshots").is_dir() else None


def export_overrides(export_config: ExportConfig) -> tuple[str, ...]:
    """The ``export.FIELD=VALUE`` recipe overrides that ``BuildConfig.export`` stands for: each field of a recipe's
    export section (every one but max_context) that is set to other than its default. The recipe's export section
    replaces those fields whole (``replace(config.export, **recipe.export...)`` in :func:`build`), so without these
    a caller's ``ExportConfig(weights="int8")`` built fp32 weights, saying nothing. Values are written as JSON, which the
    override's YAML reads back as they were (a string quoted, None as null)."""
    defaults = ExportConfig()
    return tuple(f"export.{name}={json.dumps(value)}" for name, value in asdict(export_config).items()
                 if name in ExportSection.model_fields and value != getattr(defaults, name))


def check_max_context(export_config: ExportConfig, terms: str = "cli") -> None:
    """--max-context is refused before any stage runs; the export would refuse it only after them."""
    if export_config.max_context != 0 and export_config.max_context < MIN_CONTEXT:
        raise BuildError(f"{said('--max-context', terms)} is {export_config.max_context}, but a bundle needs a "
                         f"context of at least {MIN_CONTEXT} tokens",
                         f"pass {said('--max-context', terms, MIN_CONTEXT)} or more (the default is 4096), or "
                         f"{said('--max-context', terms, 0)} for the model's own context (its "
                         "max_position_embeddings)")


def model_context(model_config, export_config: ExportConfig, terms: str = "cli") -> ExportConfig:
    """``export_config`` with a --max-context of 0 made the model's own context, as ``-c 0`` is in edgesdk run and
    eval (and llama.cpp): its ``max_position_embeddings``, the bound :func:`bundle_context` puts on any other value,
    or where the model's config has none the default, 4096. A note says which."""
    if export_config.max_context != 0:
        return export_config
    positions = getattr(model_config, "max_position_embeddings", None)
    if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0:
        own, why = positions, "the model's max_position_embeddings"
    else:
        own = ExportConfig().max_context
        why = "the default: the model's config has no max_position_embeddings"
    _log(f"  {said('--max-context', terms, 0)}: the bundle's context is {own} tokens, {why}")
    return replace(export_config, max_context=own)


def check_out_location(out: Path, terms: str = "cli") -> None:
    """The bundle ``out`` and its work directory can be created: the nearest existing directory above
    ``out`` is a directory this process may write. Checked before the model is fetched or loaded."""
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise BuildError(f"{said('--out', terms, out)}: {parent} is a file, so no bundle directory can be made "
                         "under it", f"pass {said('--out', terms)} a path whose parent is a directory (or does not "
                         "exist yet)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BuildError(f"{said('--out', terms, out)}: the directory {parent} is not writable, and the build "
                         f"writes the bundle and its work directory {out.name}.build there",
                         f"pass {said('--out', terms)} a path in a writable directory, or make {parent} writable")


def check_out_outside_bundles(out: Path, terms: str = "cli") -> None:
    """The bundle ``out`` and its work directory ``<out>.build`` are not written inside another bundle, which
    would then fail verification (files its manifest does not list); ``out`` itself may be a bundle (it is
    replaced). Checked before the model is fetched or loaded."""
    holder = _bundle_holding(out.parent)
    if holder is not None:
        raise BuildError(f"{said('--out', terms, out)} lies in the bundle {holder}: the new bundle and its work "
                         f"directory {out.name}.build would be files that bundle's manifest does not list, and it "
                         "would then fail verification",
                         f"pass {said('--out', terms)} a path outside every bundle, e.g. {holder.parent / out.name}")


def recipe_for(recipe_name: str | None, profile, terms: str = "cli"):
    """The recipe --recipe names, else the target profile's ``default_recipe``; a default that cannot be
    loaded is named as the profile's (the user gave no recipe)."""
    if recipe_name:
        return load_recipe(recipe_name)
    try:
        return load_recipe(profile.default_recipe)
    except BuildError as exc:
        raise BuildError(f"no {said('--recipe', terms)} given, and the default_recipe of target profile "
                         f"'{profile.name}' cannot be used: {exc.problem}",
                         f"pass {said('--recipe', terms, 'NAME')}, or fix default_recipe in the profile ({exc.fix})") \
            from exc


# The build command's shortcut options and the recipe setting each one stands for.
SHORTCUTS = {"--ffn-ratio": "prune.ffn_ratio", "--prune-layers": "prune.layers_removed", "--distill-steps": "distill.steps",
             "--density": "sparsify.density"}


def shortcut_overrides(target: str, recipe_name: str | None, values: dict[str, object],
                       sets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The ``stage.field=value`` overrides that the shortcut options given (``values``: option -> value or
    None) stand for. A shortcut whose stage the recipe lacks is refused naming the option, and the shipped
    recipes that have that stage; so is one that an override of ``sets`` (``--set``) sets too, which would
    silently win over it."""
    given = {option: value for option, value in values.items() if value is not None}
    if not given:
        return ()
    for option, value in given.items():
        for item in sets:
            if override_key(item) == SHORTCUTS[option]:
                raise BuildError(f"{option} {value} and --set {item} both set {SHORTCUTS[option]}",
                                 f"give one of them (--set {SHORTCUTS[option]}=... or {option} ...)")
    recipe = recipe_for(recipe_name, get_profile(target))
    stages = [entry.stage for entry in recipe.stages]
    for option, value in given.items():
        stage = SHORTCUTS[option].partition(".")[0]
        if stage not in stages:
            raise BuildError(f"{option} {value}: recipe '{recipe.name}' has no {stage} stage "
                             f"(stages: {', '.join(stages) or 'none'})", f"drop {option}" + pick_a_recipe_with(stage))
    return tuple(f"{SHORTCUTS[option]}={value}" for option, value in given.items())


def check_weight_bits_sets(bits: int, implied: list[str], overrides: tuple[str, ...], terms: str = "cli") -> None:
    """--weight-bits stands for recipe settings (``implied``: qat.weight_bits, and export.weights where the recipe
    stores quantized fused weights); a --set of one of them to another value was applied after it and won silently
    (``--weight-bits 4 --set qat.weight_bits=8 --set export.weights=int8`` built INT8 layers), as a shortcut option
    and a --set of the same key are refused (:func:`shortcut_overrides`). The same value twice is taken."""
    import yaml

    from edgesdk.build.recipes import _override_value

    wanted = {key: value for key, _, value in (item.partition("=") for item in implied)}
    for item in overrides:
        key, raw = override_key(item), item.partition("=")[2]
        if key not in wanted:
            continue
        try:
            same = _override_value(raw) == _override_value(wanted[key])
        except yaml.YAMLError:  # a value that is not YAML: with_overrides names it
            same = False
        if not same:
            raise BuildError(f"{said('--weight-bits', terms, bits)} sets {key}={wanted[key]}, and "
                             f"{said('--set', terms, item)} sets it otherwise (the {said('--set', terms)} would "
                             "win, silently)",
                             f"give one of them: {said('--weight-bits', terms)} alone (it sets {', '.join(implied)}),"
                             f" or {said('--set', terms)} without {said('--weight-bits', terms)}")


def model_facts_after(model, facts_before: dict) -> dict:
    """The loaded model's facts with what the stages changed: parameters, and the FFN widths, query
    heads and KV heads that pruning leaves per layer (the largest, plus the per-layer list where they differ),
    and the layers that depth pruning leaves. ``architecture`` is the model the bundle holds: for a model loaded as
    the Llama it computes (a Phi-3, a Granite; ``loaded_as`` in the facts before) that Llama, which GGUF export
    writes as llama.cpp's llama."""
    layers = list(model.model.layers)
    head_dim = facts_before["hidden_size"] // facts_before["attention_heads"]
    head_dim = getattr(model.config, "head_dim", None) or head_dim
    widths = [layer.mlp.up_proj.out_features for layer in layers]
    kv_heads = [layer.self_attn.k_proj.out_features // head_dim for layer in layers]
    heads = [layer.self_attn.q_proj.out_features // head_dim for layer in layers]
    facts = {**{key: value for key, value in facts_before.items() if key != "loaded_as"},
             "architecture": model.config.model_type,
             "parameters": sum(p.numel() for p in model.parameters()), "layers": len(layers),
             "intermediate_size": max(widths), "attention_heads": max(heads), "kv_heads": max(kv_heads)}
    if len(set(widths)) > 1:
        facts["intermediate_sizes"] = widths
    if len(set(heads)) > 1:
        facts["attention_heads_per_layer"] = heads
    if len(set(kv_heads)) > 1:
        facts["kv_heads_per_layer"] = kv_heads
    return facts


def check_depth_pruning(stages: list[tuple[str, object]], layer_count: int | None = None, terms: str = "cli") -> None:
    """Depth pruning the recipe and the model cannot take, refused before any stage runs (``layer_count``: the
    loaded model's decoder layers, once known)."""
    prune = next((config for name, config in stages if name == "prune"), None)
    removed = getattr(prune, "layers_removed", 0)
    if not removed:
        return
    names = [name for name, _ in stages]
    if "power" in names and names.index("power") < names.index("prune"):
        # power after prune trains its adapters on the layers left; before it, they scale layers prune would remove
        raise BuildError(f"prune.layers_removed is {removed} in a recipe whose power stage runs before prune: its "
                         "adapters scale the next layer's attention heads, so its layers cannot be removed",
                         "put prune before power in the recipe, prune depth in a recipe without the power stage, "
                         "or leave prune.layers_removed at 0")
    if layer_count is not None and removed >= layer_count:
        raise BuildError(f"prune.layers_removed is {removed}, but the model has {layer_count} decoder layers: "
                         "removing them all leaves no model",
                         f"remove at most {layer_count - 1} ("
                         f"{f'--prune-layers {layer_count - 1}, or ' if terms != 'python' else ''}"
                         f"{said('--set', terms, f'prune.layers_removed={layer_count - 1}')})")


def check_width_pruning(stages: list[tuple[str, object]], model, terms: str = "cli") -> None:
    """Width ratios the loaded model's structure cannot carry out (edgesdk.compress.prune.check_width_ratios),
    refused before any stage runs rather than when the prune stage starts, after QAT's training. With layers
    removed first the widths are those of the shortened model: checked here where the layers' shapes alone tell
    them (edgesdk.compress.prune.check_width_ratios_after_depth), else by the prune stage once it has picked them."""
    prune = next((config for name, config in stages if name == "prune"), None)
    if prune is None:
        return
    from edgesdk.compress.prune import check_width_ratios, check_width_ratios_after_depth

    if prune.layers_removed:
        check_width_ratios_after_depth(model, prune, terms)
    else:
        check_width_ratios(model, prune, terms)


def check_power_stage(stages: list[tuple[str, object]], model_config, terms: str = "cli") -> None:
    """The power stage's adapters scale each attention head's query before softmax (edgesdk/power/adapter.py);
    a model that normalises every query head (Qwen3's q_norm) would divide that factor out again, so its
    recipe is refused before any stage runs."""
    if any(name == "power" for name, _ in stages) and model_config.model_type == "qwen3":
        raise BuildError("the power stage scales each attention head's query, which Qwen3 normalises per head "
                         "right after (q_norm), undoing the scale: its gates cannot be trained on this model",
                         "build this model with a recipe without the power stage (e.g. "
                         f"{said('--recipe', terms, 'default')})")


def check_gemma_stages(stages: list[tuple[str, object]], export_config: ExportConfig, model_config) -> None:
    """What a Gemma 3 model cannot go through yet, refused before any stage: sparsify's reorder, which permutes
    the residual stream through norms it takes for Llama's (a weight that scales, one norm before attention and
    one before the FFN; Gemma 3's scale by 1 + weight and its layers also normalise the attention's and the
    FFN's outputs), and the power stage's adapters. ``smooth`` folds into Gemma 3's 1 + weight and its pre-FFN
    norm (edgesdk/compress/smooth.py), and the block-sparse decoder computes its norms, windows and rotary
    tables (edgesdk/runtime/sparse_decoder.py), so the jetson recipes build it."""
    if model_config.model_type != "gemma3_text":
        return
    refused = [name for name, _ in stages if name == "power"]
    refused += [f"{name} (reorder)" for name, config in stages if name == "sparsify" and getattr(config, "reorder", False)]
    if refused:
        raise BuildError(f"a Gemma 3 model cannot go through {', '.join(refused)}: they assume Llama's layers (a norm "
                         "weight that scales, one norm before attention and one before the FFN)",
                         "build it with a recipe without them: jetson (the Jetson targets' default), int8-qdq, "
                         "default, int8-head, int4, int4-prune, fp32-fused or fp32-standard, or set "
                         "sparsify.reorder=false")


def stage_positions(name: str, config) -> list[tuple[str, list[tuple[str, int, int]]]]:
    """What a stage puts through the model at once: per read, what the stage does with it and the settings whose
    sum is the positions it reaches, each ``(setting, value, least the stage takes)``; a read the settings leave
    out (no training steps, no calibration) is not listed. The blocks of training text are ``sequence_length``
    tokens as drawn (edgesdk/compress/data.py ``TokenData.batches``: a BOS replaces the first token, none is
    added); the power stage's are its prompts with the continuations it generates (``prompt_tokens`` +
    ``new_tokens``; one that stops at EOS is shorter) and its weight sweep's teacher-forced decode of
    ``sweep_tokens`` held-out tokens; distill's teacher reads its ``soft_prompt_tokens`` prefix before each block
    (edgesdk.compress.distill.check_soft_prompt words its refusal)."""
    if name == "smooth":
        return [("calibrate its scales on sequences", [("smooth.sequence_length", config.sequence_length, 1)])]
    if name == "sparsify":
        least = 2 if config.importance == "fisher" else 1
        return [("rank its weight blocks on sequences", [("sparsify.sequence_length", config.sequence_length, least)])]
    if name == "qat":
        from edgesdk.compress.qat import reads_text

        return [("train on sequences", [("qat.sequence_length", config.sequence_length, 2)])] if reads_text(config) \
            else []
    if name == "prune":
        reads = config.layers_removed or config.ffn_ratio or config.kv_group_ratio
        return [("score its layers and channels on sequences", [("prune.sequence_length", config.sequence_length, 2)])] \
            if reads else []
    if name == "power":
        from edgesdk.power.distribution import WINDOW

        reads = [("decode its weight sweep's held-out tokens", [("power.sweep_tokens", config.sweep_tokens, WINDOW)])]
        if config.rounds:
            reads.insert(0, ("train on prompts and the continuations it generates",
                             [("power.prompt_tokens", config.prompt_tokens, 1),
                              ("power.new_tokens", config.new_tokens, WINDOW)]))
        return reads
    if name == "distill":
        return [("train the student on the teacher's outputs over sequences",
                 [("distill.sequence_length", config.sequence_length, 2),
                  ("distill.soft_prompt_tokens", config.soft_prompt_tokens, 0)])] if config.steps else []
    return []


def positions_past(name: str, what: str, settings: list[tuple[str, int, int]], positions: int,
                   terms: str = "cli") -> tuple[int, str] | None:
    """Where one read of stage ``name`` (:func:`stage_positions`: ``what`` it does, its ``settings``) reaches past
    the model's ``positions``: the positions it reaches and the fix in ``terms``, one setting lowered with the others
    kept (the last first), else each at its least but the first, else a recipe without the stage. None where it
    fits. :func:`check_stage_positions` and edgesdk.compress.distill.check_soft_prompt both refuse by it."""
    reached = sum(value for _, value, _ in settings)
    if reached <= positions:
        return None
    lowered = next(([f"{setting}={positions - reached + value}"] for setting, value, least in reversed(settings)
                    if positions - reached + value >= least), None)
    floor = sum(least for _, _, least in settings[1:])
    if lowered is None and positions - floor >= settings[0][2]:
        lowered = [f"{settings[0][0]}={positions - floor}", *(f"{setting}={least}" for setting, _, least in settings[1:])]
    return reached, (f"{said_sets(terms, *lowered)} or less" if lowered else
                     f"build this model with a recipe without the {name} stage: to {what} it needs at least "
                     f"{floor + settings[0][2]} positions")


def check_stage_positions(name: str, config, model_config, terms: str = "cli") -> None:
    """Refuse a stage whose reads (:func:`stage_positions`) reach past the model's ``max_position_embeddings``:
    the stage would calibrate or train where the model was never trained, on positions the bundle, whose context
    stops at them, never runs (a Llama's rotary table extends without a word; nothing failed). distill's refusal
    names its soft prompt (edgesdk.compress.distill.check_soft_prompt, by the same :func:`positions_past`)."""
    if name == "distill":
        from edgesdk.compress.distill import check_soft_prompt

        check_soft_prompt(config, model_config, terms)
        return
    positions = getattr(model_config, "max_position_embeddings", None)
    if not isinstance(positions, int):
        return
    for what, settings in stage_positions(name, config):
        past = positions_past(name, what, settings, positions, terms)
        if past is None:
            continue
        reached, fix = past
        said_value = (f"{settings[0][0]} is {reached}" if len(settings) == 1 else
                      f"{' + '.join(f'{setting} {value}' for setting, value, _ in settings)} make {reached} positions")
        raise BuildError(f"{said_value}, more than the model's max_position_embeddings {positions}: the {name} stage "
                         f"would {what} reaching past the model's trained context, positions the bundle never runs", fix)


def check_stage_sizes(stages: list[tuple[str, object]], model, profile, terms: str = "cli") -> None:
    """Sizes a stage would find past the loaded model, refused before any stage runs rather than when that stage
    starts, after QAT's training: the positions each stage puts through the model (:func:`check_stage_positions`,
    distill's soft prompt beside its sequence among them), sparsify's block edge
    (edgesdk.compress.sparsify.check_block_fits) and that its density's budget holds the ``min_density`` floors,
    which either allocation keeps (check_floor_budget; with prune before it the widths are the pruned model's,
    which the sparsify stage checks itself)."""
    from edgesdk.compress.sparsify import block_counts, check_block_fits, check_floor_budget

    names = [name for name, _ in stages]
    for name, config in stages:
        if config is not None:
            check_stage_positions(name, config, model.config, terms)
        if name == "sparsify" and "prune" not in names[:names.index("sparsify")]:
            block = config.block_size or profile.sparsity_block
            check_block_fits(model, block, None if config.block_size else profile.name, terms)
            check_floor_budget(block_counts(model, block), config, terms)


def check_sparse_block(stages: list[tuple[str, object]], export_config: ExportConfig, profile,
                       terms: str = "cli") -> None:
    """A sparse export stores the profile's sparsity_block blocks, and compiles kernels for the profile's GPU SM;
    a sparsify stage that drops other blocks, or an SM the kernels have no launch settings for, would fail at
    export, after every stage. Checked before any."""
    if not export_config.sparse:
        return
    check_kernel_sm(profile)
    for name, stage_config in stages:
        block = getattr(stage_config, "block_size", None) if name == "sparsify" else None
        if block is not None and block != profile.sparsity_block:
            raise BuildError(
                f"sparsify.block_size is {block}, but {profile.name}'s block-sparse weights and kernels use its "
                f"sparsity_block, {profile.sparsity_block} x {profile.sparsity_block}",
                f"leave sparsify.block_size unset (or "
                f"{said('--set', terms, f'sparsify.block_size={profile.sparsity_block}')}), or use a profile whose "
                "sparsity_block matches")


def check_target_support(recipe, stages: list[tuple[str, object]], export_config: ExportConfig, profile,
                         terms: str = "cli") -> None:
    """A recipe may only export what the target profile says its board runs: the precisions of its stored weights
    (``export.weights``, ``export.embedding_bits``, and the INT8 blocks of ``export.sparse``) must be in the
    profile's ``precisions``, and a block-sparse layout (a ``sparsify`` stage, ``export.sparse``) needs "block" in
    its ``sparsity`` (targets/README.md; reference targets-thermal.md §1d and §4: a Pi's CPU runs no fp16, and no
    2:4 kernel exists for the CPU). Checked before the model is loaded."""
    precisions, sparsity = set(profile.precisions), set(profile.sparsity)
    used: list[tuple[str, str, str]] = [("export.weights", export_config.weights, "precision")]
    if export_config.embedding_bits is not None:
        used.append(("export.embedding_bits", f"int{export_config.embedding_bits}", "precision"))
    if export_config.sparse:
        used += [("export.sparse", "int8", "precision"), ("export.sparse", "block", "sparsity")]
    used += [(f"the {name} stage", "block", "sparsity") for name, _ in stages if name == "sparsify"]
    for setting, value, kind in used:
        offered = precisions if kind == "precision" else sparsity
        if value in offered:
            continue
        listed = ", ".join(getattr(profile, "precisions" if kind == "precision" else "sparsity")) or "none"
        if kind == "precision":
            fix = (f"pick a recipe that exports {' or '.join(sorted(precisions & {'fp32', 'int8', 'int4'}))} "
                   f"weights ({said('--recipe', terms)}; the target's default is {profile.default_recipe}), change "
                   f"the setting ({said('--set', terms, f'{setting}=...')}), or add {value} to the profile's "
                   "precisions if the board runs it")
        else:
            fix = (f"pick a recipe without block sparsity (no sparsify stage, export.sparse false; the target's "
                   f"default is {profile.default_recipe}), or add {value} to the profile's sparsity if the board "
                   "runs it")
        raise BuildError(f"recipe '{recipe.name}' {setting} uses {value} {kind}"
                         f"{' weights' if kind == 'precision' else ''}, which target '{profile.name}' does not "
                         f"support (its {'precisions' if kind == 'precision' else 'sparsity'}: {listed})", fix)


def memory_budget_warning(bundle: Bundle, profile) -> str | None:
    """The warning for a bundle that takes more memory than the target profile's ``memory_budget_mb``: edgesdk
    deploy refuses such a bundle on that board (edgesdk.deploy.probe.check_memory), so the build says so when it
    writes it, with the same figure (:func:`edgesdk.deploy.probe.memory_bytes`: the bundle's files, an
    entropy-coded weights file at its inflated size); None when it fits."""
    from edgesdk.deploy.probe import MB, memory_bytes
    from edgesdk.deploy.transfer import bundle_files

    needed = memory_bytes(bundle.manifest, bundle_files(bundle))
    if needed <= profile.memory_budget_mb * MB:
        return None
    return (f"warning: the bundle takes {needed / MB:.0f} MB in memory, more than target '{profile.name}''s "
            f"memory_budget_mb ({profile.memory_budget_mb} MB): edgesdk deploy will refuse it on that board; build a "
            "smaller bundle (a smaller model, or a recipe that prunes or quantises more, e.g. int4), or target a "
            "board with a larger memory budget")


def stage_keys(stages: list[tuple[str, object]]) -> dict:
    """The build key's part of each stage, ``stage:NAME``: its config and those of the stages before it, what its
    checkpoint is made from besides the model, data, target and export settings. A resumed build with other settings
    for a stage takes the checkpoints of the stages before it, and makes that stage and the ones after it again."""
    keys, configs = {}, []
    for name, config in stages:  # how often a stage keeps its training in flight changes none of its weights
        configs.append([name, {k: v for k, v in asdict(config).items() if k not in PROGRESS_ONLY_FIELDS}])
        keys[f"stage:{name}"] = list(configs)
    return keys


# The export settings that no build step reads, only the bundle writer (write_bundle) once every step is done: the
# weights file's entropy coding. A resumed build with another value takes every finished step and writes its bundle
# with it, rather than refuse the work directory and lose the trained stages.
PACKAGING_EXPORT_FIELDS = ("weights_codec",)


# The export settings that the export step alone reads: the block-sparse copy of the weights and its block order. No
# stage's figures depend on them (compress/measure.py reads the form, weights, block_size and embedding_bits), so a
# resumed build with other values takes the finished stages and exports again (their own build key part, with the
# target's GPU that the block-sparse kernels are compiled for: :func:`sparse_export_key`).
EXPORT_STEP_FIELDS = ("sparse", "sparse_layout")


def export_key(export_config: ExportConfig) -> dict:
    """The build key's export part: the export settings that the stages' figures (measured as exported) and the export
    step read; not the context nor :data:`EXPORT_STEP_FIELDS` (their own parts, which the export alone depends on),
    nor :data:`PACKAGING_EXPORT_FIELDS`."""
    left_out = ("max_context", *EXPORT_STEP_FIELDS, *PACKAGING_EXPORT_FIELDS)
    return {name: value for name, value in asdict(export_config).items() if name not in left_out}


def sparse_export_key(export_config: ExportConfig, profile) -> dict:
    """The build key's sparse_export part: :data:`EXPORT_STEP_FIELDS` of ``export_config``, and the target profile's
    ``gpu``, whose SM the block-sparse kernels are compiled for (edgesdk/build/sparse_step.py) and no stage reads."""
    return {**{name: getattr(export_config, name) for name in EXPORT_STEP_FIELDS},
            **profile.model_dump(mode="json", include={"gpu"})}


# The target profile's settings the stages read (the bundle copies the whole profile when it is written, after the last
# step): sparsify's and the block-sparse export's block edge, and the power stage's entropy target. The GPU whose SM
# the block-sparse kernels are compiled for is read by the export alone: the sparse_export part (sparse_export_key).
PROFILE_KEY_FIELDS = ("sparsity_block", "power")


def profile_key(profile) -> dict:
    """The build key's target part: :data:`PROFILE_KEY_FIELDS` of ``profile``. The rest of a profile (its thermal
    limits, memory budget, runtime threads, description) changes no checkpoint, and a resumed build whose board YAML
    was corrected there takes the finished stages."""
    return profile.model_dump(mode="json", include=set(PROFILE_KEY_FIELDS))


def _export_disk_full(exc: OSError, export_dir: Path, work: WorkDir, terms: str) -> BuildError:
    """The error for an export the disk had no room for (:func:`edgesdk.build.checkpoint.disk_full`): the export
    directory and the space left, not a bare ``[Errno 28] No space left on device`` naming no file. The half-written
    export is removed, so that the space it took is free again."""
    shutil.rmtree(export_dir, ignore_errors=True)  # a full disk keeps no half export
    then = (f", then run the build again with {said('--resume', terms)}: the finished steps are kept there"
            if work.state["done"] else
            f", or pass {said('--out', terms)} a path on a disk with more room, then run the build again")
    return disk_refused(exc, f"the exported model in {export_dir}", work.path, then,
                        named=f"the build's work directory {work.path}")


def reads_training_text(name: str, config) -> bool:
    """Whether stage ``name`` with ``config`` reads the training text: every read :func:`stage_positions` lists is
    of it (a QAT without steps or static scales, a prune that removes nothing, a distill without steps read none)."""
    return bool(stage_positions(name, config))


def check_training_text(recipe: str, stages: list[tuple[str, object]], data: DataConfig, terms: str = "cli") -> None:
    """Stages that read training text have some: a --data file or teacher-generated text. Checked before the model
    loads; the first stage to read the text would find none only after the load and the baseline figures."""
    if data.files or data.generated_sequences:
        return
    reading = [name for name, config in stages if reads_training_text(name, config)]
    if reading:
        raise no_training_text(terms, f"recipe '{recipe}' has {'stages' if len(reading) > 1 else 'a stage'} that "
                               f"read{'' if len(reading) > 1 else 's'} it ({', '.join(reading)}), and there is no "
                               f"{said('--data', terms)} and {said('--generated-sequences', terms, 0)}")


def warn_unused_data(recipe: str, data: DataConfig, terms: str = "cli") -> None:
    """Warn of the training text options given to a recipe with no training stages, which nothing reads: --data,
    and a --generated-sequences other than the default (0 asks for none, which is what such a build generates)."""
    unused = []
    if data.files:
        unused.append(said("--data", terms, ", ".join(data.files) if terms != "python" else
                           [str(file) for file in data.files]))
    if data.generated_sequences not in (0, DataConfig().generated_sequences):
        unused.append(said("--generated-sequences", terms, data.generated_sequences))
    for given in unused:
        _log(f"warning: {given} is not used: recipe '{recipe}' has no training stages (pass a recipe with stages, "
             f"e.g. {said('--recipe', terms, 'default')}, to train on "
             f"{'it' if given.startswith(said('--data', terms)) else 'teacher-generated text'})")


def _log(message: str) -> None:
    print(f"edgesdk build: {message}", file=sys.stderr, flush=True)


def build(config: BuildConfig) -> Bundle:
    """Run the whole pipeline and return the verified bundle."""
    terms = config.terms  # the messages name the options as the caller gave them: flags, or build_bundle()'s
    profile = get_profile(config.target, terms)
    recipe = recipe_for(config.recipe, profile, terms)
    recipe = recipe.with_overrides(export_overrides(config.export), terms)
    if config.weight_bits is not None:  # before --set, refused where it sets one of the same settings otherwise
        # read on the export the --set leaves (a --set of export.form / export.weights may make the graph one that
        # stores these bits)
        exported = recipe.with_overrides([item for item in config.overrides
                                          if override_key(item).startswith("export.")], terms)
        implied = exported.weight_bits_overrides(config.weight_bits, terms)
        check_weight_bits_sets(config.weight_bits, implied, config.overrides, terms)
        recipe = recipe.with_overrides(implied, terms)
    recipe = recipe.with_overrides(config.overrides, terms)
    stages = recipe.validated(terms)  # order and configs checked before any compute
    export_config = replace(config.export, **recipe.export.model_dump())
    check_target_support(recipe, stages, export_config, profile, terms)
    check_max_context(export_config, terms)
    check_sparse_block(stages, export_config, profile, terms)
    check_depth_pruning(stages, terms=terms)
    if stages:
        config.data.check_files(terms)
        check_training_text(recipe.name, stages, config.data, terms)  # before the model loads, as the files
    else:
        warn_unused_data(recipe.name, config.data, terms)
    out = (Path(config.out) if config.out else default_out(config.model, profile.name, config.adapters)).resolve()
    check_replaceable(out, terms=terms)
    check_out_outside_bundles(out, terms)
    check_out_location(out, terms)
    check_work_dir(out.with_name(out.name + ".build"), terms)
    for adapter in config.adapters:  # before the model is fetched or loaded
        check_adapter(adapter)
    source = resolve_model(config.model, progress=config.progress, terms=terms)
    if not config.out:
        check_default_out(out, source, terms)
    data_key = None
    if stages:
        data_key = {**asdict(config.data), "files": [file_fingerprint(f) for f in config.data.files]}
    build_key = {
        "model": file_fingerprint(source.path), "target": profile_key(profile),
        "recipe": [name for name, _ in stages], **stage_keys(stages),  # a stage's settings: that stage on, again
        # the context apart from the other export settings: a resume with another one exports again, keeping the stages
        "export": export_key(export_config), "sparse_export": sparse_export_key(export_config, profile),
        "context": export_config.max_context, "data": data_key,
        "edgesdk": __version__,
    }
    if config.adapters:  # a checkpoint of the model with other adapters, or other scales, is not this build's
        build_key["adapters"] = [{**file_fingerprint(Path(adapter.path).expanduser()), "scale": adapter.scale}
                                 for adapter in config.adapters]
    work_path = out.with_name(out.name + ".build")
    work = WorkDir(work_path, build_key, config.resume, terms)
    if work.discarded or work.discarded_training:  # a killed build's checkpoints and training in flight, gone: say
        # so, and how they are kept the next time
        lost = ([f"the finished steps ({', '.join(work.discarded)})"] if work.discarded else []) + \
            work.discarded_training
        many = bool(work.discarded) or len(lost) > 1  # "the finished steps" are many, even one
        resumable = (f"with it, it goes on from {'them' if many else 'it'}" if work.discarded_resumable else
                     f"{'they belong' if many else 'it belongs'} to a build with other arguments, which "
                     f"{said('--resume', terms)} would refuse")
        _log(f"starting over: {' and '.join(lost)} an earlier build left in {work.path} "
             f"{'are' if many else 'is'} discarded (a build without {said('--resume', terms)} starts from the "
             f"beginning; {resumable})")
    if work.redone:
        changed = " and ".join(part_named(part, terms) for part in first_stage_only(work.redone))
        settings, training = work.resume_changes.changed_settings, work.resume_changes.discarded_training
        what = f" ({'; '.join(settings)})" if settings else ""
        lost = (f"; {' and '.join(training)} {'are' if len(training) > 1 else 'is'} discarded: "
                f"{'they were' if len(training) > 1 else 'it was'} made under the earlier settings") if training else ""
        _log(f"{said('--resume', terms)}: {changed} changed since the earlier build: the steps that depend on what "
             f"changed are made again, the others taken{what}{lost}")
    stopped_by = None  # the signal that stopped the build, delivered again once it has unwound
    try:  # the lock is this build's while it runs, however it ends (a failed stage in a process that goes on)
        with _stop_signals_unwind():
            if config.resume and not work.state["done"]:
                _log(f"{said('--resume', terms)}: no finished step of this build in {work.path}; starting from "
                     "the beginning")
            return _run_steps(config, profile, recipe, stages, export_config, source, out, work)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        if not work.state["done"]:  # nothing to resume: a half-written export is no one's (it may be GBs)
            remove_work_dir(work.path)
        if isinstance(exc, BuildStopped):
            _log(f"stopped ({exc.signal_name})")
            stopped_by = exc.signum
        if work.state["done"] and work.path.is_dir():  # say how not to lose them
            again = ("run the same command with --resume" if terms != "python" else
                     "call build_bundle() again with the same arguments and resume=True")
            _log(f"the finished steps ({', '.join(work.state['done'])}) are kept in {work.path}: {again} to go on "
                 "from there")
            if work.in_flight is not None and isinstance(exc, (KeyboardInterrupt, BuildStopped)):
                _log(work.in_flight.stopped_words())  # how far the stage it stopped in got
        raise
    finally:
        work.release()
        if stopped_by is not None:
            # The process ends by the signal, at its default action (restored as the build unwound), as it did
            # before the build took the signal over: the parent sees SIGTERM (systemd a clean stop, a shell 143),
            # and a Python API caller's own handlers and non-daemon threads do not keep it running.
            for stream in (sys.stdout, sys.stderr):  # what was printed is not lost with the process
                with contextlib.suppress(Exception):
                    stream.flush()
            os.kill(os.getpid(), stopped_by)


class BuildStopped(SystemExit):
    """A build ended by SIGTERM or SIGHUP (a service manager's or ``timeout``'s stop, ``docker stop``, a closed
    terminal), raised to unwind it; once it has, :func:`build` delivers the signal again at its default action, so
    the process ends by it (a shell reports 128 + the signal's number). Its code is that number too, for a process
    where the signal does not end it."""

    def __init__(self, signum: int):
        super().__init__(128 + signum)
        self.signum = signum
        self.signal_name = signal.Signals(signum).name


@contextlib.contextmanager
def _stop_signals_unwind():
    """While the build runs, SIGTERM and SIGHUP unwind it as Ctrl-C (SIGINT) does, raising :class:`BuildStopped`,
    instead of ending the process where it stands: the bundle being staged (``.<out>.partial``, a copy of the
    weights) is discarded, and the finished steps are named for --resume, as edgesdk run and serve do on the same
    signals (edgesdk/cli_options.py ``exit_on_stop_signals``). Only a signal at its default action is taken over
    (one ignored, as SIGHUP under nohup, or one the calling program handles stays so), only in the main thread
    (Python runs signal handlers there), and the handlers are put back when the build ends."""
    def stop(signum, frame):
        raise BuildStopped(signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if signum is not None and signal.getsignal(signum) is signal.SIG_DFL:
                previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _merge_adapters(adapters: tuple[LoraAdapter, ...], loaded, source) -> list[dict]:
    """Merge the --lora / --lora-scaled adapters into the loaded model (edgesdk/models/lora.py) and log each, with
    the modules whose factors a PEFT adapter holds but its adapter_config.json leaves out (not merged, as PEFT does
    not load them: the merge's LoraMergeNote, logged here as the build's own line, lora.left_out_warning), the
    module kinds its target_modules names without factors (LoraMissingFactors), and a tied LM head the merge gave
    its own weight (the record's ``untied_parameters``); the manifest's records of them."""
    if not adapters:
        return []
    import warnings

    from edgesdk.models.lora import (
        LoraMergeNote,
        LoraMissingFactors,
        gguf_architecture,
        left_out_warning,
        merge_adapters,
    )

    with warnings.catch_warnings(record=True) as caught:  # LoraMergeNote's text is in the records' "ignored"
        warnings.simplefilter("always", LoraMissingFactors)
        warnings.simplefilter("ignore", LoraMergeNote)
        records = merge_adapters(loaded.model, adapters, gguf_architecture(source, loaded.model))
    for record in records:
        _log(f"  merged LoRA adapter {record['path']} ({record['form']}, rank {record['rank']}, "
             f"{record['modules']} modules, scale {record['scale']:g})")
        warning = left_out_warning(record)
        if warning is not None:
            _log(f"  {warning}")
        if record.get("untied_parameters"):
            _log(f"  untied the LM head from the embedding (+{record['untied_parameters']:,} parameters): the "
                 "adapter changes one of them only, so the bundle holds both (the manifest's model.before records "
                 "the source as tied)")
    for message in caught:  # the merge's other warnings (LoraMissingFactors) as the build's own lines
        _log(f"  warning: {message.message}")
    return records


def _load_noting_own_code(source, config: BuildConfig):
    """The source loaded for the build (as_llama False: adapters merge into its own modules first), with the
    loader's ModelCodeNote (an auto_map whose code is not run) logged as the build's own note; its other warnings
    are warned again as they came."""
    import warnings

    from edgesdk.models.loader import ModelCodeNote, load_model

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ModelCodeNote)
        loaded = load_model(source, progress=config.progress, as_llama=False, terms=config.terms)
    for message in caught:
        if issubclass(message.category, ModelCodeNote):
            _log(f"  note: {message.message}")
        else:
            warnings.warn_explicit(message.message, message.category, message.filename, message.lineno)
    return loaded


def source_facts(loaded_facts: dict, adapters: list[dict]) -> dict:
    """The manifest's ``model.before``: the loaded model's facts (LoadedModel.facts, after the merge) as the source
    has them, with the adapters merged into it recorded beside them. A merge that gave a tied LM head its own weight
    (lora._untie_if_touched) changed the loaded model's tie_word_embeddings and parameter count; the source's are
    recorded, as the model it names has them (``model.after`` has the bundle's)."""
    facts = dict(loaded_facts)
    if adapters:
        facts["adapters"] = adapters
        untied = sum(int(record.get("untied_parameters") or 0) for record in adapters)
        if untied:
            facts.update(tie_word_embeddings=True, parameters=facts["parameters"] - untied)
    return facts


def _model_sampling(source) -> dict | None:
    """The model's own sampling settings (its generation_config.json, or a GGUF file's general.sampling keys), logged:
    what the bundle records, what it leaves out and why; the manifest's ``generation`` section, or None."""
    from edgesdk.models.generation_defaults import describe, read_model_sampling, source_words

    sampling = read_model_sampling(source.kind, source.path)
    for warning in sampling.warnings:
        _log(f"  warning: {warning}")
    if sampling.values:
        _log(f"  sampling defaults from {source_words(sampling.source)}: {describe(sampling.values)} (run, serve and "
             "load() use them where an option or request sets none)")
    if sampling.not_applied:
        shown = ", ".join(f"{key} {value!r}" for key, value in sampling.not_applied.items())
        _log(f"  not applied (edgesdk has no such sampler): {shown}")
    return sampling.record()


def _run_steps(config: BuildConfig, profile, recipe, stages: list, export_config: ExportConfig, source,
               out: Path, work: WorkDir) -> Bundle:
    """Load, the stages not done yet, export and package: the build from its work directory on."""
    steps = len(stages) + 3
    started = time.perf_counter()

    from edgesdk.models.as_llama import CONVERTED_ARCHITECTURES
    from edgesdk.models.loader import _progress_bars, load_as_llama
    from edgesdk.models.pooling import unapplied_modules
    from edgesdk.power.adapter import gating_off

    _log(f"[1/{steps}] loading {config.model} ({source.kind}: {source.path})")
    try:
        # adapters are merged into the model's own modules (Phi-3's qkv_proj), before it is loaded as a Llama
        loaded = _load_noting_own_code(source, config)
        adapters = _merge_adapters(config.adapters, loaded, source)
        architecture = loaded.model.config.model_type
        loaded = load_as_llama(loaded)
        if loaded.model.config.model_type != architecture:
            _log(f"  loaded the {architecture} model as the {loaded.model.config.model_type} decoder it computes "
                 f"({CONVERTED_ARCHITECTURES[architecture]})")
        export_config = model_context(loaded.model.config, export_config, config.terms)  # --max-context 0
        check_exportable(loaded.model.config, export_config)  # before any stage, not at export
        context = bundle_context(loaded.model.config, export_config)
        if context < export_config.max_context:  # the graph's rotary table covers the model's positions only
            _log(f"  the bundle's context is {context} tokens, not "
                 f"{said('--max-context', config.terms, export_config.max_context)}: the model's "
                 f"max_position_embeddings is {context}")
        check_fits_context(config.validation, context)  # the export's check, before the stages rather than after
        check_depth_pruning(stages, loaded.model.config.num_hidden_layers, config.terms)
        check_width_pruning(stages, loaded.model, config.terms)
        check_stage_sizes(stages, loaded.model, profile, config.terms)
        check_power_stage(stages, loaded.model.config, config.terms)
        check_gemma_stages(stages, export_config, loaded.model.config)
    except EdgeSDKError:
        if not work.state["done"]:  # nothing to resume: leave no empty work directory behind
            remove_work_dir(work.path)
        raise
    generation = _model_sampling(source)
    if loaded.pooling:
        _log(f"  the model declares {loaded.pooling} pooling for its embeddings; the bundle records it")
    elif loaded.pooling_note:
        _log(f"  note: {loaded.pooling_note}; embeddings pool with the runtime's default")
    unapplied = unapplied_modules(loaded.source.kind, loaded.source.path)
    if unapplied:
        _log(f"  warning: {unapplied}")
    facts_loaded = loaded.facts()  # the merged model's: the bundle's, before the stages change its shape
    facts_before = source_facts(facts_loaded, adapters)
    model = teacher = loaded.model
    ctx = BuildContext(profile=profile, work_dir=work.path, tokenizer=loaded.tokenizer, teacher=teacher,
                       progress=config.progress, data_config=config.data, terms=config.terms)
    # Stages finished by a killed run: skip them and continue from the last one's checkpoint.
    finished = 0
    while finished < len(stages) and work.done(f"stage:{stages[finished][0]}"):
        finished += 1
    recorded = finished
    while finished:  # a checkpoint damaged since its stage finished is not taken: the stage runs again
        name = stages[finished - 1][0]
        problem = work.damaged(f"stage:{name}", work.stage_checkpoint(finished - 1, name))
        if problem is None:
            break
        _log(f"{said('--resume', config.terms)}: the checkpoint of stage '{name}' is damaged ({problem}); the stage "
             "runs again")
        finished -= 1
    if finished < recorded:  # the stages after it, and the export, were made from the damaged model
        work.forget(*[f"stage:{name}" for name, _ in stages[finished:]], "export")
    stage_records = [work.done(f"stage:{name}") for name, _ in stages[:finished]]
    baseline = work.done("baseline")
    if config.resume and (baseline is not None or finished):  # what the killed build left that this one takes
        reused = (["the loaded model's figures (baseline)"] if baseline is not None else []) + \
            [f"stage '{name}'" for name, _ in stages[:finished]]
        _log(f"{said('--resume', config.terms)}: reusing {', '.join(reused)} from {work.path}")
    if stages and baseline is None:  # the loaded model's figures, for the report's first row
        from edgesdk.compress.measure import stage_metrics

        baseline = work.mark_done("baseline", stage_metrics(teacher, ctx.eval_ids()))
    if finished:
        last = stages[finished - 1][0]
        _log(f"resuming after stage '{last}' from its checkpoint ({finished} of {len(stages)} stages done)")
        with _progress_bars(config.progress):
            model = load_checkpoint(work.stage_checkpoint(finished - 1, last))
    elif stages:  # stages change the model in place; the teacher stays the model as loaded
        import copy

        model = copy.deepcopy(loaded.model)
    for index in range(finished, len(stages)):
        name, stage_config = stages[index]
        _log(f"[{index + 2}/{steps}] {name}: {stage_spec(name).description}")
        ctx.metrics = {}
        stage_start = time.perf_counter()
        # a stage after the power stage works on the function the runtime computes by default: gating off.
        # The stage's figures (compress/measure.py stage_metrics) are of the layout the export stores, counted and
        # measured once: its weight bytes (a QDQ graph's INT8 head, a quantized export without QAT), and a QDQ
        # graph's INT8 head's perplexity, which QAT left in float
        # a training stage keeps its training in flight there, and a resumed build's goes on from it
        work.in_flight = TrainingProgress(work.training_file(index, name), name, work.stage_identity(name), _log,
                                          config.terms)
        with gating_off(model) if name != "power" else contextlib.nullcontext(), measured_as_exported(export_config), \
                keeping_progress(work.in_flight):
            model = stage_spec(name).run(model, stage_config, ctx)
        with _progress_bars(config.progress):  # transformers' own bars, while it writes the checkpoint
            save_checkpoint(model, loaded.tokenizer, work.stage_checkpoint(index, name), config.terms)
        work.record_files(f"stage:{name}", work.stage_checkpoint(index, name))  # checked when resumed
        record = {"stage": name, "config": asdict(stage_config), "metrics": ctx.metrics,
                  "seconds": round(time.perf_counter() - stage_start, 1)}
        stage_records.append(work.mark_done(f"stage:{name}", record))
        work.in_flight.discard()  # the stage is recorded: its checkpoint holds what the training made
        work.in_flight = None

    export_dir = work.path / "export"
    record = work.done("export")
    problem = work.damaged("export", export_dir) if record is not None else None
    if problem:
        _log(f"{said('--resume', config.terms)}: the exported files in {export_dir} are damaged ({problem}); "
             "exporting again")
        work.forget("export")
        record = None
    # The export's check is not part of the build key (it changes no stage): a resumed build with other validation
    # settings exports and checks again, rather than take the earlier check's figures for its own.
    checked_with = json.loads(json.dumps(asdict(config.validation)))
    if record is not None and record.get("validation_settings") != checked_with:
        _log(f"{said('--resume', config.terms)}: the export was validated with other settings "
             f"({record.get('validation_settings')} -> {checked_with}); exporting and validating again")
        work.forget("export")
        record = None
    if record is None:
        if export_dir.exists():  # what a killed or damaged export left: none of it is this export's
            shutil.rmtree(export_dir)
        _log(f"[{steps - 1}/{steps}] exporting ONNX with KV cache and validating against PyTorch")
        try:
            spec = export_model(model, export_dir, export_config)
            if export_config.form == "standard":
                report = validate_export(model, export_dir / "model.onnx", spec, config.validation, config.progress)
            else:
                report = validate_fused(model, export_dir / "model.onnx", spec, export_config.fused(model),
                                        config.validation, config.progress)
            record = {"graph": spec.to_json(), "validation": report.to_json(), "validation_settings": checked_with}
            if export_config.sparse:
                from edgesdk.build.sparse_step import export_sparse_parts

                _log("  block-sparse INT8 weights" + (f" and kernels for sm_{profile.gpu.sm}" if profile.gpu else ""))
                record["sparse"] = export_sparse_parts(model, export_dir, export_config, profile, config.validation,
                                                       config.progress)
            sync_step_files(export_dir)  # on the disk before the state records it: a power cut keeps the export
        except OSError as exc:
            if not disk_full(exc):
                raise
            raise _export_disk_full(exc, export_dir, work, config.terms) from exc
        work.record_files("export", export_dir)  # checked when resumed
        record = work.mark_done("export", record)  # as a resumed build reads it: the same bundle either way
    else:
        _log(f"[{steps - 1}/{steps}] export: done in an earlier run")

    _log(f"[{steps}/{steps}] writing bundle {out}")
    facts_after = model_facts_after(model, facts_loaded)  # an LM head the merge untied is the bundle's own
    bundle = write_bundle(
        out, export_dir=export_dir, graph=record["graph"], validation=record["validation"], profile=profile,
        recipe=recipe, stages=stage_records, model=model, tokenizer=loaded.tokenizer,
        facts_before=facts_before, facts_after=facts_after, baseline=baseline, sparse=record.get("sparse"),
        weights_codec=export_config.weights_codec, generation=generation, terms=config.terms,
    )
    too_large = memory_budget_warning(bundle, profile)
    if too_large:
        _log(too_large)
    if not config.keep_work:
        remove_work_dir(work.path)
    _log(f"done in {time.perf_counter() - started:.0f}s: {out} (bundle id {bundle.bundle_id})")
    return bundle
