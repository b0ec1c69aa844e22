"""Recipes: named, validated lists of stages and their configs (YAML in edgesdk/recipes/)."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from edgesdk.build.checkpoint import said, said_sets, without
from edgesdk.build.registry import check_order, make_config
from edgesdk.errors import BuildError, ExportError, closest, did_you_mean, read_utf8
from edgesdk.profile import load_yaml_unique


class StageEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: str
    config: dict = Field(default_factory=dict)

    @field_validator("config", mode="before")
    @classmethod
    def _empty_config(cls, value):
        """``config:`` with nothing after it (YAML's null, e.g. every option commented out) is no options, as a
        stage without the key is: the stage runs with its defaults (edgesdk.build.registry.make_config)."""
        return {} if value is None else value


class ExportSection(BaseModel):
    """The graph the recipe exports (see export/onnx_export.py ExportConfig)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    form: Literal["standard", "ort-fused"] = "standard"
    weights: Literal["fp32", "int8", "int4"] = "fp32"
    block_size: int = Field(32, ge=16, le=4096)  # a power of two (checked below)
    # embedding / LM head (tied or not); None: ort-fused as the layers, standard float32 (8 = INT8 per row)
    embedding_bits: Literal[4, 8] | None = None
    sparse: bool = False  # also store block-compressed INT8 weights and AOT kernels (triton backend)
    sparse_layout: Literal["plain", "transposed"] = "plain"  # intra-block order of the stored blocks
    weights_codec: Literal["none", "zlib"] = "none"  # zlib: entropy-coded weights file (ort-fused form only)

    @field_validator("block_size", mode="before")
    @classmethod
    def _not_a_flag(cls, value):
        """``block_size: yes`` (YAML's true) is no block size: refused as what it is, where pydantic took it for 1
        and refused that as smaller than 16."""
        if isinstance(value, bool):
            raise ValueError(f"block_size must be a power of two (16, 32, 64 ...), got the true/false value {value}")
        return value

    @field_validator("block_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"block_size must be a power of two (16, 32, 64 ...), got {value}")
        return value


def _override_value(raw: str):
    """A --set value as a recipe's file reads it (:func:`edgesdk.profile.load_yaml_unique`): numbers as YAML 1.2's
    core schema reads them (yaml.org/spec/1.2.2 §10.3.2), so 010 is ten and 1:00 is text, where PyYAML's YAML 1.1
    read them as octal 8 and sexagesimal 60; 1e3 is the float 1000 and 0o17 the integer 15, which PyYAML read as
    text (``--set distill.steps=1e3`` was refused as the string '1e3'); a mapping giving one key twice is refused."""
    return load_yaml_unique(raw)


def override_key(item: str) -> str:
    """The ``section.field`` an override ``item`` (``stage.field=value``) sets, each part stripped as
    :meth:`Recipe.with_overrides` reads it: ``"qat . steps = 5"`` sets ``qat.steps``. The checks that compare
    overrides with the shortcut options read keys through this, so a spelling the recipe takes is never one they miss."""
    section, _, field_name = item.partition("=")[0].partition(".")
    return f"{section.strip()}.{field_name.strip()}"


class Recipe(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    stages: tuple[StageEntry, ...] = ()
    export: ExportSection = Field(default_factory=ExportSection)

    @field_validator("description", "stages", "export", mode="before")
    @classmethod
    def _empty_key(cls, value, info):
        """A key with nothing after it (YAML's null: ``stages:`` with every stage commented out, ``export:`` with
        every setting commented out) is the key left out, as a stage's empty ``config:`` is its defaults."""
        if value is not None:
            return value
        return cls.model_fields[info.field_name].get_default(call_default_factory=True)

    def with_overrides(self, overrides: tuple[str, ...] | list[str], terms: str = "cli") -> Recipe:
        """Apply ``stage.field=value`` (or ``export.field=value``) overrides; values are YAML. ``terms``: whose
        names a refusal gives them, ``edgesdk build``'s (``--set``) or build_bundle()'s (``overrides=[...]``;
        edgesdk.build.checkpoint.said)."""
        data = self.model_dump()
        for item in overrides:
            key, sep, raw = item.partition("=")
            section, dot, field_name = (part.strip() for part in key.partition("."))  # as override_key reads it
            if not sep or not dot or not section or not field_name:
                raise BuildError(f"override '{item}' is not of the form stage.field=value",
                                 f"write e.g. {said('--set', terms, 'prune.ffn_ratio=0.4')} or "
                                 f"{said('--set', terms, 'export.weights=int4')}")
            try:
                value = _override_value(raw)
            except yaml.YAMLError as exc:
                twice = re.match(r"found the key (.+) twice \(first", getattr(exc, "problem", None) or "")
                if twice:  # load_yaml_unique's refusal of a mapping giving one key twice, which no quoting mends
                    raise BuildError(f"override '{item}': the value {raw!r} gives the key {twice[1]} twice",
                                     "give each key once") from exc
                quoted = ("--set 'stage.field=\"text\"'" if terms != "python" else
                          said("--set", terms, 'stage.field="text"'))
                raise BuildError(f"override '{item}': the value {raw!r} is not valid YAML "
                                 f"({str(exc).splitlines()[0]})", f"quote it, e.g. {quoted}") from exc
            if section == "export" and field_name == "max_context":  # ExportConfig's one build-level field
                fix = (f"pass --max-context {raw.strip()} (build_bundle(max_context={raw.strip()}) in Python) instead "
                       "of this --set" if terms != "python" else
                       f"pass max_context={raw.strip()} to build_bundle() instead of this override")
                raise BuildError(f"override '{item}': the bundle's context is not a recipe setting (a recipe's export "
                                 f"keys: {', '.join(ExportSection.model_fields)}), it is the build's "
                                 f"{said('--max-context', terms)}", fix)
            if section == "export":
                data["export"][field_name] = value
                continue
            entries = [entry for entry in data["stages"] if entry["stage"] == section]
            if not entries:
                raise _no_such_stage(item, self.name, [e["stage"] for e in data["stages"]], section, field_name,
                                     raw, terms)
            entries[0]["config"][field_name] = value
        try:
            return Recipe.model_validate(data)
        except ValidationError as exc:
            given = said_sets(terms, *overrides)
            values = "the --set values" if terms != "python" else "those overrides"
            raise BuildError(f"{given} makes recipe '{self.name}' invalid: {_problems(exc)}",
                             f"fix {values} (export keys: {', '.join(ExportSection.model_fields)})") from exc

    def weight_bits_overrides(self, bits: int, terms: str = "cli") -> list[str]:
        """What ``--weight-bits N`` means for this recipe: QAT learns N-bit weights, and a recipe that
        exports quantized fused weights stores them at N bits. A recipe without a qat stage, and one whose
        standard INT8 (QDQ) graph stores 8-bit weights only, are refused naming the option (the override it
        stands for, ``qat.weight_bits=4``, is not what the caller gave). ``terms``: whose names the refusal
        gives the options, ``edgesdk build``'s or build_bundle()'s (edgesdk.build.checkpoint.said)."""
        stages = [entry.stage for entry in self.stages]
        option = said("--weight-bits", terms, bits)
        if "qat" not in stages:
            raise BuildError(f"{option}: recipe '{self.name}' has no qat stage to learn {bits}-bit weights "
                             f"(stages: {', '.join(stages) or 'none'})",
                             f"{without('--weight-bits', terms)}, or pick a recipe with a qat stage (e.g. "
                             f"{said('--recipe', terms, 'default')} or {said('--recipe', terms, 'int8-only')})")
        if self.export.form == "standard" and self.export.weights == "int8" and bits != 8:
            raise BuildError(f"{option}: recipe '{self.name}' exports the standard INT8 (QDQ) graph, which stores "
                             f"8-bit weights only ({bits}-bit weights need the fused ONNX Runtime form, export.form ort-fused)",
                             f"{without('--weight-bits', terms)}, or pick a recipe that stores {bits}-bit weights "
                             f"(e.g. {said('--recipe', terms, 'default')} or {said('--recipe', terms, 'int4')})")
        stored = self.export.form == "ort-fused" and self.export.weights in ("int4", "int8")
        return [f"qat.weight_bits={bits}", *([f"export.weights=int{bits}"] if stored else [])]

    def validated(self, terms: str = "cli") -> list[tuple[str, object]]:
        """(stage name, config object) pairs, order and configs checked. ``terms``: whose names a refusal's fix
        gives the settings, ``edgesdk build``'s (``--set``) or build_bundle()'s (``overrides=[...]``)."""
        names = [entry.stage for entry in self.stages]
        check_order(names)
        stages = [(entry.stage, make_config(entry.stage, entry.config, terms)) for entry in self.stages]
        self._check_export()
        self._check_block_size(stages, terms)
        self._check_qat_matches_export(stages, terms)
        self._check_reorder(stages, terms)
        self._check_power_form(stages, terms)
        self._check_sparse_grid(stages, terms)
        return stages

    def _check_export(self) -> None:
        """The export section's settings together, as the export reads them (ExportConfig: a standard graph with
        int4 weights, a codec on the standard form, ...), before the stages are compared with it: an export that no
        stage could match is refused as what it is, not as a qat stage that does not match it."""
        from edgesdk.export.onnx_export import ExportConfig

        try:
            ExportConfig(**self.export.model_dump())
        except ExportError as exc:
            raise ExportError(f"recipe '{self.name}': {exc.problem}", exc.fix) from exc

    def _check_sparse_grid(self, stages: list[tuple[str, object]], terms: str = "cli") -> None:
        """``export.sparse`` stores the weights as INT8 blocks with one scale per row (export/sparse_export.py), which
        it reads off the per-row INT8 grid a qat stage with weight_bits 8 and granularity channel bakes; without that
        stage the export refused the weights after every stage had run. Checked here, before any stage runs."""
        if not self.export.sparse:
            return
        qat = next((config for name, config in stages if name == "qat"), None)
        if qat is not None and qat.weight_bits == 8 and qat.granularity == "channel":
            return
        found = ("the recipe has no qat stage" if qat is None else
                 f"its qat stage has weight_bits {qat.weight_bits}, granularity {qat.granularity}")
        raise BuildError(
            f"recipe '{self.name}': export.sparse stores the weights as INT8 blocks with one scale per row, read off "
            f"the grid of a qat stage with weight_bits 8 and granularity channel, and {found}: the export would "
            "refuse the weights after every stage had run",
            f"{said_sets(terms, 'export.sparse=false')}, or pick a recipe whose qat stage trains that grid "
            f"({said('--recipe', terms, 'jetson')} or {said('--recipe', terms, 'jetson-sparse')})")

    def _check_power_form(self, stages: list[tuple[str, object]], terms: str = "cli") -> None:
        """The power gates export in the fused ONNX Runtime graph only (edgesdk/export/gated_graph.py): refused
        here, before the power stage trains, not at export after it."""
        if self.export.form != "ort-fused" and any(name == "power" for name, _ in stages):
            raise BuildError(
                f"recipe '{self.name}': the power stage's gates export to the fused ONNX Runtime form only, "
                f"and export.form is {self.export.form}",
                f"{said_sets(terms, 'export.form=ort-fused')}, or pick a recipe without the power stage")

    def _check_reorder(self, stages: list[tuple[str, object]], terms: str = "cli") -> None:
        """``sparsify.reorder`` permutes the hidden channels, which regroups the channels sharing a scale when QAT
        before it quantized in blocks along them (granularity block, or a block-quantized embedding and head):
        the stage refuses that (edgesdk/compress/sparsify.py), and so does the recipe, before any stage runs. It also
        refuses a reorder after the power stage, whose adapters read the hidden channels in their own order: the
        stage refuses that as well (``reorder_channels``), but only once the power stage has trained."""
        qat = None
        power = False
        for name, config in stages:
            if name == "qat":
                qat = config
            power = power or name == "power"
            if name == "sparsify" and config.reorder and power:
                raise BuildError(
                    f"recipe '{self.name}': sparsify.reorder cannot follow the power stage: it permutes the hidden "
                    "channels, which the power adapters read in their own order",
                    f"{said_sets(terms, 'sparsify.reorder=false')}, or list sparsify before power in the recipe")
            if name == "sparsify" and config.reorder and qat is not None and qat.scheme().groups_hidden_channels:
                raise BuildError(
                    f"recipe '{self.name}': sparsify.reorder cannot follow a qat stage that quantizes in blocks along "
                    f"the hidden channels (qat.granularity={qat.granularity}, qat.embedding_bits="
                    f"{qat.embedding_bits}): the permutation would regroup the channels sharing a scale",
                    f"{said_sets(terms, 'sparsify.reorder=false')}, or "
                    f"{said_sets(terms, 'qat.granularity=channel', 'qat.embedding_bits=null')} (the jetson recipes' "
                    "grid)")

    def _check_qat_matches_export(self, stages: list[tuple[str, object]], terms: str = "cli") -> None:
        """QAT bakes the weights onto one grid; the export must store that grid, or it re-rounds what QAT
        trained (or trains one form and ships another). Checked here, before any stage runs.

        * ort-fused int8/int4 (MatMulNBits): qat.weight_bits = the export's bits, granularity block,
          activations block (what accuracy level 4 computes), embedding_bits = the export's head bits
          (export.embedding_bits, or the layers' bits when that is unset);
        * standard int8 (QDQ, TensorRT): weight_bits 8, granularity channel, activations tensor or none (the
          graph has per-tensor activation Q/DQ or none), embedding_bits null (the graph stores the head in
          float or INT8 per row, never on QAT's blocks);
        * float32 exports ship the baked weights as they are: nothing to match.
        """
        export = self.export
        if export.weights == "fp32":
            return

        def sets(*items: str) -> str:
            return said_sets(terms, *items)

        for name, qat in stages:
            if name != "qat":
                continue
            if export.form == "ort-fused":
                bits = {"int8": 8, "int4": 4}[export.weights]
                head_bits = export.embedding_bits or bits
                wanted = {"weight_bits": (bits, f"{said('--weight-bits', terms, qat.weight_bits)} sets both, or "
                                                f"{sets(f'qat.weight_bits={bits}')} to match the export"),
                          "granularity": ("block", f"{sets('qat.granularity=block')} (channel is the standard form's "
                                                   "QDQ layout: "
                                                   f"{sets('export.form=standard', 'export.weights=int8')})"),
                          "activations": ("block", f"{sets('qat.activations=block')} (ONNX Runtime's MatMulNBits "
                                                   "quantizes activations per block at run time)"),
                          "embedding_bits": (head_bits, f"{sets(f'qat.embedding_bits={head_bits}')}, or "
                                                        f"{sets(f'export.embedding_bits={qat.embedding_bits}')}"
                                             if qat.embedding_bits else sets(f"qat.embedding_bits={head_bits}"))}
                form = f"ort-fused {export.weights} export (LM head at {head_bits} bits)"
            else:
                wanted = {"weight_bits": (8, f"{sets('qat.weight_bits=8')} (4-bit weights need "
                                             f"{sets('export.form=ort-fused', 'export.weights=int4')})"),
                          "granularity": ("channel", sets("qat.granularity=channel")),
                          "activations": (("tensor", "none"), f"{sets('qat.activations=tensor')} (TensorRT's static "
                                                              "per-tensor scales)"),
                          "embedding_bits": (None, sets("qat.embedding_bits=null"))}
                form = "standard int8 (QDQ) export"
            for option, (expected, fix) in wanted.items():
                value = getattr(qat, option)
                if value != expected and not (isinstance(expected, tuple) and value in expected):
                    shown = " or ".join(map(str, expected)) if isinstance(expected, tuple) else expected
                    raise BuildError(
                        f"recipe '{self.name}': qat.{option} is {value} but the {form} needs {shown}; QAT would "
                        "train one form and the bundle ship another",
                        f"{fix}, or pick a recipe whose export matches (edgesdk/recipes/)")

    def _check_block_size(self, stages: list[tuple[str, object]], terms: str = "cli") -> None:
        """QAT trains on the quantization grid of its block size; the fused export must store that grid."""
        export = self.export
        if export.form != "ort-fused" or export.weights == "fp32":
            return
        for name, config in stages:
            if name == "qat" and config.granularity == "block" and config.block_size != export.block_size:
                raise BuildError(
                    f"recipe '{self.name}': qat.block_size is {config.block_size} but export.block_size is "
                    f"{export.block_size}; the export would store weights on another grid than QAT trained",
                    "set both to the same value, e.g. "
                    f"{said_sets(terms, f'qat.block_size={export.block_size}', f'export.block_size={export.block_size}')}")


def _no_such_stage(item: str, recipe: str, stages: list[str], section: str, field_name: str, raw: str,
                   terms: str) -> BuildError:
    """The refusal of an override aimed at a section the recipe lacks. A misspelling of one of its stages or of
    ``export`` (``qatt.steps=5``, ``QAT.steps=5``, ``exports.weights=int4``) is told the override it meant; a
    stage the recipe does not run, the shipped recipes that do."""
    known = [*stages, "export"]
    close = closest(section.lower(), known)
    meant = did_you_mean(section.lower(), known)
    fix = (f"write {said_sets(terms, f'{close}.{field_name}={raw.strip()}')}" if close else
           "override a stage it has" + pick_a_recipe_with(section, terms))
    return BuildError(f"override '{item}': the recipe '{recipe}' has no stage '{section}' "
                      f"(stages: {', '.join(stages) or 'none'}){meant}", fix)


def _problems(exc: ValidationError) -> str:
    """Each of a validation error's problems on one line: the key, the value given and what was wrong (an
    unknown key with the keys allowed where it stands)."""
    problems = []
    for item in exc.errors():
        loc, kind, given = item["loc"], item["type"], item.get("input")
        key = ".".join(str(part) for part in loc) or "the recipe"
        if kind == "extra_forbidden":
            problems.append(f"{key} is not a known key{_allowed_keys(loc[:-1])}{_closest_key(loc)}")
        elif kind == "missing":
            problems.append(f"{key} is missing (a required key)")
        elif kind == "model_type":
            problems.append(f"{key}={given!r}: expected a mapping of keys{_allowed_keys(loc)}")
        elif kind == "tuple_type":
            problems.append(f"{key}={given!r}: expected a list")
        else:
            problems.append(f"{key}={given!r}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(problems)


def _allowed_keys(loc: tuple) -> str:
    """" (allowed keys: a, b)" for the recipe model whose keys stand at ``loc`` (``()`` the recipe,
    ``("export",)`` its export section, ``("stages", N)`` a stage entry); "" anywhere else."""
    model = _model_at(loc)
    return f" (allowed keys: {', '.join(model.model_fields)})" if model else ""


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """The recipe model whose keys stand at ``loc`` (``()`` the recipe, ``("export",)`` its export section,
    ``("stages", N)`` a stage entry); None anywhere else."""
    if len(loc) == 2 and loc[0] == "stages" and isinstance(loc[1], int):
        return StageEntry
    return {(): Recipe, ("export",): ExportSection}.get(loc)


def _closest_key(loc: tuple) -> str:
    """"; did you mean 'weights'?" for an unknown key (``export.weight``, a stage's ``confg``) close to one allowed
    where it stands; "" where none is."""
    model = _model_at(loc[:-1])
    return did_you_mean(str(loc[-1]), list(model.model_fields)) if model else ""


def shipped_recipes() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("edgesdk.recipes").iterdir() if p.name.endswith(".yaml"))


def pick_a_recipe_with(stage: str, terms: str = "cli") -> str:
    """", or pick a recipe with a STAGE stage: --recipe A, --recipe B" naming the shipped recipes that run
    ``stage`` (the end of a fix for a setting aimed at a stage the recipe lacks); "" when none does. ``terms``
    "python": build_bundle()'s ``recipe='A'`` instead (edgesdk.build.checkpoint.said)."""
    having = [name for name in shipped_recipes() if stage in [entry.stage for entry in load_recipe(name).stages]]
    return f", or pick a recipe with a {stage} stage: " + ", ".join(said("--recipe", terms, name) for name in having) \
        if having else ""


def _missing_file_fix(path: Path) -> str:
    """The fix for a recipe path that is no file: a shipped recipe's name given with the suffix (``jetson.yaml``,
    which names a file, not the shipped recipe) is that name without it; else the shipped names."""
    shipped = shipped_recipes()
    stem = path.name.rsplit(".", 1)[0]
    if stem in shipped and len(path.parts) == 1:
        return f"pass the shipped recipe's name without the suffix, {stem}, or the path of an existing recipe file"
    return f"pass one of the shipped recipes ({', '.join(shipped)}) or the path of an existing recipe file"


def load_recipe(name_or_path: str) -> Recipe:
    if name_or_path.lower().endswith((".yaml", ".yml")):  # r.YAML is a YAML file too (a name has no suffix)
        path = Path(name_or_path)
        if not path.is_file():
            state = "is a directory, not a file" if path.is_dir() else "does not exist"
            raise BuildError(f"recipe file {path} {state}", _missing_file_fix(path))
        text, source = read_utf8(path, "recipe file", BuildError), str(path)
    else:
        if name_or_path not in shipped_recipes():
            if Path(name_or_path).is_file():
                raise BuildError(f"recipe file {name_or_path} does not end in .yaml or .yml, so it was taken "
                                 f"for a recipe name; shipped: {', '.join(shipped_recipes())}",
                                 f"rename it to {name_or_path}.yaml and pass that path")
            raise BuildError(f"unknown recipe '{name_or_path}'; shipped: {', '.join(shipped_recipes())}"
                             f"{did_you_mean(name_or_path.lower(), shipped_recipes())}",
                             "pass one of those or the path of a recipe YAML (.yaml or .yml)")
        text = (resources.files("edgesdk.recipes") / f"{name_or_path}.yaml").read_text(encoding="utf-8")
        source = f"recipes/{name_or_path}.yaml"
    shipped = resources.files("edgesdk.recipes") / "default.yaml"
    try:
        data = load_yaml_unique(text)
    except yaml.YAMLError as exc:
        raise BuildError(f"recipe {source} is not valid YAML: {exc}",
                         f"fix the YAML syntax (each key once per mapping); compare it with a shipped recipe, e.g. {shipped}") from exc
    if not isinstance(data, dict):
        raise BuildError(f"recipe {source} must be a YAML mapping of keys ({', '.join(Recipe.model_fields)}), "
                         f"got {'an empty file' if data is None else f'a {type(data).__name__}: {data!r:.60}'}",
                         f"start it with 'name: <recipe>'; compare it with a shipped recipe, e.g. {shipped}")
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise BuildError(f"recipe {source} is invalid: {_problems(exc)}",
                         f"fix those keys; compare it with a shipped recipe, e.g. {shipped}") from exc
