"""Stage registry: each compression stage is ``stage(model, config, ctx) -> model`` registered
with its config class and ordering rules, which are checked before any compute runs.

Modelled on ModelOpt's mode descriptors (``opt/mode.py``): a stage names the stages that must
come before it when both are present, so "prune before qat" is refused up front.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from edgesdk.build.checkpoint import said
from edgesdk.errors import BuildError, closest, did_you_mean


@dataclass
class BuildContext:
    """What a stage may use besides the model and its config."""

    profile: Any  # edgesdk.profile.TargetProfile
    work_dir: Path
    tokenizer: Any = None  # transformers tokenizer of the source model
    teacher: Any = None  # the model as loaded, before any stage (for distillation)
    progress: bool = True
    metrics: dict = field(default_factory=dict)  # the running stage writes its measurements here
    data_config: Any = None  # edgesdk.compress.data.DataConfig: training text for the stages
    # whose names the training text's refusals give the build's options: "cli" edgesdk build's flags (--data),
    # "python" build_bundle()'s arguments (data=...); BuildConfig.terms
    terms: str = "cli"
    _data: Any = None
    _eval_ids: Any = None

    @property
    def has_training_data(self) -> bool:
        """Whether the training text is loaded: the first stage that asks :meth:`training_data` loads it."""
        return self._data is not None

    def training_data(self):
        """The token pool the training stages draw from (loaded, and teacher text generated, once). Inside a build
        the stage that loads it says so, in its name, before it does (edgesdk/compress/train.py ``setting_up``): the
        teacher's text takes seconds to minutes to sample, with no bar under --no-progress."""
        if self._data is None:
            from edgesdk.compress.data import DataConfig, TokenData
            from edgesdk.compress.train import current_progress, loading_text, setting_up

            config = self.data_config or DataConfig()
            keeper = current_progress()
            before = (keeper.doing, keeper.losing) if keeper is not None else None
            setting_up(*loading_text(config, self.teacher is not None, self.terms))  # a stop in it names it
            self._data = TokenData.load(config, self.tokenizer, self.teacher, self.progress, self.terms)
            if keeper is not None:  # loaded: a stop from here on is no longer while the text loads
                keeper.doing, keeper.losing = before
        return self._data

    def eval_ids(self):
        """Held-out tokens for the per-stage perplexity: the skipped head of the first data file
        (never trained on), at most 8,192 tokens, in windows that start with BOS where the tokenizer
        adds one (as ``edgesdk eval`` scores them); None without data files. The text is read as plain
        text, a special token's text in it as its characters (``split_special_tokens``), as ``edgesdk eval``
        and llama-perplexity read it (edgesdk/runtime/text.py ``ChatTokenizer.plain_text``)."""
        if self._eval_ids is None and self.data_config is not None and self.data_config.files:
            import torch

            from edgesdk.compress.data import heldout_text
            from edgesdk.compress.measure import windows_after_bos
            from edgesdk.evaluate import leading_bos

            text = heldout_text(self.data_config)
            if text:
                plain = self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
                ids = windows_after_bos(plain, leading_bos(self.tokenizer))
                self._eval_ids = torch.tensor(ids[:8192], dtype=torch.long)
        return self._eval_ids


StageFn = Callable[[Any, Any, BuildContext], Any]


@dataclass(frozen=True)
class StageSpec:
    name: str
    config_class: type
    run: StageFn
    after: tuple[str, ...] = ()  # stages that must come earlier whenever both are in a recipe
    description: str = ""


STAGES: dict[str, StageSpec] = {}


def register_stage(name: str, config_class: type, after: tuple[str, ...] = (), description: str = ""):
    """Decorator registering ``fn(model, config, ctx) -> model`` as a build stage."""
    if not is_dataclass(config_class):
        raise TypeError(f"stage {name}: config_class must be a dataclass, got {config_class!r}")

    def decorate(fn: StageFn) -> StageFn:
        if name in STAGES:
            raise ValueError(f"stage '{name}' is registered twice")
        STAGES[name] = StageSpec(name, config_class, fn, tuple(after), description or (fn.__doc__ or "").strip())
        return fn

    return decorate


def make_config(name: str, values: dict | None, terms: str = "cli") -> Any:
    """Build a stage's config from a dict, rejecting unknown fields with the allowed set. ``terms``: whose names
    the fix gives an override, ``edgesdk build``'s (``--set``) or build_bundle()'s (``overrides``)."""
    spec = stage_spec(name)
    values = dict(values or {})
    allowed = {f.name for f in fields(spec.config_class)}
    unknown = sorted(set(values) - allowed, key=str)  # YAML reads a bare 1 or yes as an int or a bool key
    if unknown:
        close = [f"'{match}'" + (f" for {key!r}" if len(unknown) > 1 else "") for key in unknown
                 if (match := closest(str(key).lower(), sorted(allowed)))]
        raise BuildError(f"stage '{name}' has no option(s) {unknown}; allowed: {sorted(allowed)}"
                         f"{'; did you mean ' + ', '.join(close) + '?' if close else ''}",
                         "fix the recipe or the --set override" if terms != "python" else
                         "fix the recipe or the override in build_bundle()'s overrides")
    values = {key: _typed_value(name, spec.config_class, key, value, terms) for key, value in values.items()}
    try:
        return spec.config_class(**values)
    except (TypeError, ValueError) as exc:
        raise _refused_config(name, spec.config_class, values, exc, terms) from exc


def _refused_config(stage: str, config_class: type, values: dict, exc: Exception, terms: str = "cli") -> BuildError:
    """The refusal of a stage config its own check (``__post_init__``) failed: the options it fails on, each with
    its value (those without which it passes; all given where none alone does), the stage's words for what they take,
    a close match for a mistyped name where those words list the names, and where each is set. Not the whole config:
    ``--set qat.activations=blok`` is refused as activations='blok', not as the seven options the recipe gives qat."""
    blamed = [key for key in values if _passes_without(config_class, values, key)] or list(values)
    said_values = ", ".join(f"{key}={values[key]!r}" for key in blamed)
    given = f"option{'s' if len(blamed) > 1 else ''} {said_values}" if blamed else "defaults"
    close = next((f"; did you mean '{match}'?" for key in blamed if isinstance(values[key], str)
                  and (match := closest(values[key].lower(), _names_in(str(exc))))), "")
    keys = [f"{stage}.{key}" for key in blamed]
    if terms != "python":  # the shortcut option standing for a key (--ffn-ratio for prune.ffn_ratio) sets it too
        from edgesdk.build.pipeline import SHORTCUTS

        shortcut = {key: option for option, key in SHORTCUTS.items()}
        ways = [said("--set", terms, f"{key}=...") + (f" (or {shortcut[key]})" if key in shortcut else "")
                for key in keys]
    else:
        ways = [said("--set", terms, f"{key}=...") for key in keys]
    fix = (f"change {' or '.join(keys)} where it is given: {' or '.join(ways)}, or in the recipe" if keys else
           "fix the stage's defaults")
    return BuildError(f"stage '{stage}' {given}: {exc}{close}", fix)


def _passes_without(config_class: type, values: dict, key: str) -> bool:
    """The stage config takes ``values`` with ``key`` left at its default."""
    try:
        config_class(**{other: value for other, value in values.items() if other != key})
    except (TypeError, ValueError):
        return False
    return True


def _names_in(message: str) -> list[str]:
    """The names a stage's refusal lists as what it takes ("activations must be none, block or tensor, got ...",
    "must be one of kl, block-influence, got ..."); none where it lists no names (a range, a number)."""
    found = re.search(r"must be (?:one of )?(.+?), got ", message)
    names = re.split(r",\s*|\s+or\s+", found[1]) if found else []
    return names if names and all(re.fullmatch(r"[A-Za-z][\w.:-]*", name) for name in names) else []


def _typed_value(stage: str, config_class: type, key: str, value: Any, terms: str = "cli") -> Any:
    """``value`` checked against the config field's annotation, in pydantic's lax mode: an int
    where a float is expected becomes a float, and so does a numeric string (YAML 1.1, which
    PyYAML speaks, reads ``1e-4`` without a dot as a string). Anything else that does not fit is
    refused here, naming the option, instead of failing later inside the stage."""
    from pydantic import TypeAdapter, ValidationError
    from pydantic.errors import PydanticSchemaGenerationError

    annotation = get_type_hints(config_class)[key]
    try:
        adapter = TypeAdapter(annotation)
    except PydanticSchemaGenerationError:  # a type pydantic cannot check: the stage checks it
        return value
    # a generic alias's __name__ is its origin's alone ("tuple"): the whole type says what the items must be
    expected = (getattr(annotation, "__name__", None) if not get_args(annotation) else None) or str(annotation)
    fix = f"fix the recipe or the override, e.g. {said('--set', terms, f'{stage}.{key}=<{expected}>')}"
    if value is None and not _takes_none(annotation):  # `--set qat.steps=` or a recipe's `steps:`, nothing after
        raise BuildError(f"stage '{stage}' option {key} has no value ({said('--set', terms, f'{stage}.{key}=')} with "
                         f"nothing or null after the =, or '{key}:' with nothing after it in the recipe), where it takes "
                         f"a{'n' if expected[0] in 'aeiou' else ''} {expected}", fix)
    if get_origin(annotation) in (tuple, list):  # a YAML list, quoted on a shell's command line
        fix += (f" (a YAML list: --set '{stage}.{key}=[...]')" if terms != "python" else
                f" (a YAML list: {said('--set', terms, f'{stage}.{key}=[...]')})")
    try:
        checked = adapter.validate_python(value)
    except ValidationError as exc:
        raise BuildError(f"stage '{stage}' option {key}={value!r} is not a valid {expected} "
                         f"({_first_problem(exc)})", fix) from exc
    flag = None if _takes_bool(annotation) else _bool_at(value)
    if flag is not None:  # pydantic's lax mode reads true as 1, in a list as well: YAML's yes, on, true
        where = f"item {' of item '.join(map(str, reversed(flag)))} is " if flag else ""
        raise BuildError(f"stage '{stage}' option {key}={value!r} is not a valid {expected} ({where}a true/false "
                         "value where a number or a name is expected)", fix)
    if not _finite(checked):
        raise BuildError(f"stage '{stage}' option {key}={value!r} holds NaN or infinity, which would reach the "
                         "training as it is", fix)
    return checked


def _takes_none(annotation: Any) -> bool:
    """``annotation`` accepts None (``int | None``, ``Optional[str]``, ``Any``)."""
    return annotation is Any or annotation is type(None) or any(_takes_none(arg) for arg in get_args(annotation))


def _takes_bool(annotation: Any) -> bool:
    """``annotation`` is bool or has bool in it (``bool | None``, ``tuple[bool, ...]``)."""
    return annotation is bool or any(_takes_bool(arg) for arg in get_args(annotation))


def _bool_at(value: Any, where: tuple[int, ...] = ()) -> tuple[int, ...] | None:
    """Where the first true/false value in ``value`` is: ``()`` for ``value`` itself, the list item's index
    (outermost first) for one in a list or a list of lists; None where it holds none."""
    if isinstance(value, bool):
        return where
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            found = _bool_at(item, (*where, index))
            if found is not None:
                return found
    return None


def _first_problem(exc) -> str:
    """A pydantic ValidationError's first problem, with the list item it is in: ``[0.5, 0.5]`` for a
    ``tuple[float, float, float]`` is "item 2 is missing", not pydantic's bare "Field required", and
    ``[1, "a", 3]`` names item 1 (items counted from 0; in a list of lists, "item 2 of item 0")."""
    first = exc.errors()[0]
    where = " of item ".join(str(part) for part in reversed(first["loc"]))
    if not where:
        return first["msg"]
    if first["type"] == "missing":
        return f"item {where} is missing"
    return f"item {where}: {first['msg']}"


def _finite(value: Any) -> bool:
    """No NaN or infinity in ``value`` (a number, or a tuple or list of them)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, (tuple, list)):
        return all(_finite(item) for item in value)
    return True


def _load_shipped_stages() -> None:
    """Import the modules registering the shipped stages (lazily: they import torch)."""
    import edgesdk.build.stages  # noqa: F401


def stage_spec(name: str) -> StageSpec:
    if name not in STAGES:
        _load_shipped_stages()
    if name not in STAGES:
        known = ", ".join(sorted(STAGES)) or "none registered yet"
        raise BuildError(f"unknown build stage '{name}'; known stages: {known}{did_you_mean_stage(name)}",
                         "fix the recipe's stage list")
    return STAGES[name]


def did_you_mean_stage(name: object) -> str:
    """'; did you mean 'qat'?' naming the registered stage closest to a mistyped ``name`` (``qatt``, ``Prune``),
    else ''."""
    return did_you_mean(str(name).lower(), sorted(STAGES))


def check_order(names: list[str]) -> None:
    """Refuse unknown stages, duplicates and order violations before any compute. A duplicate is named before
    any order rule: in ``[qat, smooth, qat]`` the problem is the second qat, not that smooth follows the first."""
    seen: set[str] = set()
    for name in names:
        stage_spec(name)
        if name in seen:
            raise BuildError(f"stage '{name}' appears twice in the recipe {names}", "list each stage once")
        seen.add(name)
    for position, name in enumerate(names):
        later = set(names[position + 1:])
        for required in stage_spec(name).after:
            if required in later:
                raise BuildError(
                    f"stage '{name}' must come after '{required}', but the recipe orders {names}",
                    f"move '{required}' before '{name}'",
                )
