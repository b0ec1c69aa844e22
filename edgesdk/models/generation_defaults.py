"""The sampling settings a model's authors publish with it, read from a model source and recorded in its bundle.

A Hugging Face directory carries them in ``generation_config.json``, which transformers' ``generate()`` reads; a GGUF
file in its ``general.sampling.*`` keys (llama.cpp's ``src/llama-arch.cpp``), which llama.cpp's
``common_init_sampler_from_model`` (``common/common.cpp``) applies to every sampling option the user did not set.
llama.cpp's converter writes those keys from ``generation_config.json`` (``gguf-py/gguf/metadata.py``,
``Metadata.load``): ``temperature`` -> ``temp``, and ``top_k``, ``top_p``, ``min_p``, ``sequence``,
``penalty_last_n``, ``penalty_repeat`` ... under their own names. It does not read transformers' own
``repetition_penalty`` (Qwen2.5's 1.05 / 1.1), which ``generate()`` applies; edgesdk takes it as ``repeat_penalty``
where there is no ``penalty_repeat``, so a bundle penalises repeats as the model's authors set it (over llama.cpp's
last ``repeat_last_n`` tokens, where transformers penalises the whole sequence), and a GGUF file llama.cpp converted
from the same directory carries no penalty.

Only the keys the file itself holds are read, never transformers' ``GenerationConfig`` class defaults (its top_k
50 is no model's setting). The values are kept under :class:`edgesdk.runtime.generate.SamplingConfig`'s field names
(:data:`FIELDS`); those edgesdk does not carry (mirostat, xtc, typical_p ...) are named as not applied, and a value
out of SamplingConfig's range is a warning and left out, except a GGUF ``top_k`` below 0 (-1), which llama.cpp's
top-k sampler takes as off and edgesdk reads as top_k 0. A ``sequence`` name no sampler has is left out of the chain with
a warning, the other names kept, as llama.cpp's ``common_sampler_types_from_names`` skips it; an empty ``sequence``
is no setting (llama.cpp keeps its own chain: ``llama_model_meta_val_str`` gives it 0 characters).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

# SamplingConfig's fields a bundle records, in the order they are shown
FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "samplers")
GENERATION_CONFIG = "generation_config.json"
GGUF_SOURCE = "GGUF general.sampling"
# generation_config.json key -> SamplingConfig field (gguf-py's Metadata.load reads penalty_repeat only;
# transformers' repetition_penalty is taken where it is absent: both are listed, the first present wins)
CONFIG_KEYS = (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"), ("min_p", "min_p"),
               ("penalty_repeat", "repeat_penalty"), ("repetition_penalty", "repeat_penalty"),
               ("penalty_last_n", "repeat_last_n"), ("sequence", "samplers"))
# general.sampling.<key> -> SamplingConfig field (llama.cpp's LLM_KV_GENERAL_SAMPLING_*)
GGUF_KEYS = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
             "penalty_repeat": "repeat_penalty", "penalty_last_n": "repeat_last_n", "sequence": "samplers"}
# Settings edgesdk's sampler does not have, with the value at which they change nothing: present at another value
# they are named as not applied. ``None``: named whenever present (their sampler is on only where another key says).
NOT_CARRIED = {"mirostat": 0, "mirostat_tau": None, "mirostat_eta": None, "xtc_probability": 0.0,
               "xtc_threshold": None, "typical_p": 1.0, "no_repeat_ngram_size": 0, "epsilon_cutoff": 0.0,
               "eta_cutoff": 0.0, "num_beams": 1, "penalty_alpha": None, "diversity_penalty": 0.0,
               "encoder_repetition_penalty": 1.0, "top_h": None, "top_n_sigma": None}
# the keys a sampler that is off makes meaningless: named only where the sampler is on
ENABLED_BY = {"mirostat_tau": "mirostat", "mirostat_eta": "mirostat", "xtc_threshold": "xtc_probability"}
# the sampling settings that do_sample false leaves unused: transformers' generate() then decodes greedily
DRAW_FIELDS = ("temperature", "top_p", "top_k", "min_p")
# the temperature transformers' generate() samples at where do_sample is true and no temperature is set
TRANSFORMERS_TEMPERATURE = 1.0
FLOAT32_FIELDS = ("temperature", "top_p", "min_p", "repeat_penalty")
INT32_FIELDS = ("top_k", "repeat_last_n")
FLOAT32_MAX = 3.4028234663852886e38
INT32_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class ModelSampling:
    """The sampling settings read from a model source."""

    values: dict = field(default_factory=dict)  # SamplingConfig field -> value, in range
    source: str = ""  # GENERATION_CONFIG or GGUF_SOURCE
    not_applied: dict = field(default_factory=dict)  # the source's key -> value, for settings edgesdk does not carry
    warnings: tuple[str, ...] = ()  # values left out, each with why

    def record(self) -> dict | None:
        """The manifest's ``generation`` section, or None where the source sets none of the fields."""
        if not self.values:
            return None
        return {"sampling": dict(self.values), "source": self.source}


def sampling_value_problem(name: str, value) -> str | None:
    """Why ``value`` cannot be the sampling field ``name`` (SamplingConfig's own refusal), None where it can."""
    if name not in FIELDS:
        return f"is not a sampling setting edgesdk carries ({', '.join(FIELDS)}), got {value!r:.80}"
    if name == "samplers" and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        return f"must be a list of sampler names, got {value!r:.80}"
    from edgesdk.runtime.generate import SamplingConfig

    float32_bound = f"{name} must be at most {FLOAT32_MAX:g} (a float32, as a GGUF file holds it), got {value!r:.80}"
    try:
        SamplingConfig(**{name: value})
    except ValueError as exc:
        return str(exc)
    except OverflowError:  # a JSON integer past any float (1e400 written out): math.isfinite cannot take it
        return float32_bound
    # the bounds of the GGUF types llama.cpp reads them as (general.sampling.*: FLOAT32, INT32), which export writes
    if name in FLOAT32_FIELDS and abs(value) > FLOAT32_MAX:
        return float32_bound
    if name in INT32_FIELDS and value > INT32_MAX:
        return f"{name} must be at most {INT32_MAX} (an int32, as a GGUF file holds it), got {value!r:.80}"
    return None


def _canonical(name: str, value, skipped: list | None = None):
    """``value`` as the manifest records the field ``name``: samplers as their canonical names (llama.cpp's
    ``sequence`` is a string of names separated by ';'), a top_k or repeat_last_n written as 20.0 as the whole
    number it is. A sampler name llama.cpp does not know is left out and appended to ``skipped``, as
    ``common_init_sampler_from_model`` reads the sequence (``common_sampler_types_from_names`` skips it, "unable to
    match sampler by name", and keeps the others)."""
    if name == "samplers":
        from edgesdk.runtime.generate import sampler_chain

        names = [part for part in value.split(";") if part] if isinstance(value, str) else value
        return list(sampler_chain(names, skipped))
    if name in ("top_k", "repeat_last_n") and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _sets(key: str, value) -> bool:
    """Whether the source's ``key`` holding ``value`` sets its field: not where it is null, nor where it is an empty
    ``sequence``, which llama.cpp's ``common_init_sampler_from_model`` passes over (``llama_model_meta_val_str``
    returns 0 characters for it), keeping its own sampler chain rather than running none."""
    return value is not None and not (key == "sequence" and value == "")


def _collect(found: dict[str, tuple[str, object]], source: str, shown: str) -> tuple[dict, list[str]]:
    """(the fields in range, a warning for each one that is not). ``found``: field -> (the source's key, value);
    ``shown`` names the source in a warning."""
    values, warnings = {}, []
    for name in FIELDS:
        if name not in found:
            continue
        key, raw = found[name]
        skipped: list = []
        try:
            value = _canonical(name, raw, skipped)
        except (ValueError, TypeError) as exc:
            warnings.append(f"{shown} {key} {raw!r:.80} is not used: {exc}; edgesdk's default stays")
            continue
        if skipped:
            warnings.append(f"{shown} {key} {raw!r:.80} names {', '.join(repr(item) for item in skipped)[:80]}, no "
                            "sampler llama.cpp knows: left out of the chain, as llama.cpp skips it")
        problem = sampling_value_problem(name, value)
        if problem is not None:
            warnings.append(f"{shown} {key} {raw!r:.80} is not used: {problem}; edgesdk's default stays")
            continue
        values[name] = float(value) if name in FLOAT32_FIELDS else value
    return values, warnings


def _not_applied(settings: dict) -> dict:
    """The settings of ``settings`` (a key -> value mapping, keys without a prefix) that edgesdk does not carry
    and that change the sampling at the value given."""
    listed = {}
    for key, neutral in NOT_CARRIED.items():
        value = settings.get(key)
        if value is None or (neutral is not None and value == neutral):
            continue
        enabler = ENABLED_BY.get(key)
        if enabler is not None and settings.get(enabler) in (None, NOT_CARRIED[enabler]):
            continue
        listed[key] = value
    return listed


def from_generation_config(config: dict) -> ModelSampling:
    """The sampling settings of a ``generation_config.json`` object, as llama.cpp's converter takes them; where it
    says ``"do_sample": false``, transformers' ``generate()`` decodes greedily and ignores temperature, top_p,
    top_k and min_p, so they are left out and the bundle stays greedy (llama.cpp's converter would still copy
    them into the GGUF file); where it says ``"do_sample": true`` and sets no temperature, the temperature is the 1
    ``generate()`` samples at."""
    found = {}
    for key, name in CONFIG_KEYS:
        if name not in found and _sets(key, config.get(key)):
            found[name] = (key, config[key])
    if config.get("do_sample") is True and "temperature" not in found:
        # transformers' generate() samples such a config at temperature 1 (Gemma 3's: do_sample, top_k 64, top_p
        # 0.95 and no temperature); left out, edgesdk's greedy default would make top_k and top_p change nothing
        found["temperature"] = ("do_sample true", TRANSFORMERS_TEMPERATURE)
    warnings = []
    greedy = config.get("do_sample") is False
    if greedy:
        dropped = [f"{found[name][0]} {found[name][1]!r}" for name in DRAW_FIELDS if name in found]
        if dropped:
            warnings.append(f"{GENERATION_CONFIG} sets do_sample false, so transformers decodes this model greedily: "
                            f"{', '.join(dropped)} not used")
        found = {name: entry for name, entry in found.items() if name not in DRAW_FIELDS}
    values, problems = _collect(found, GENERATION_CONFIG, GENERATION_CONFIG)
    return ModelSampling(values, GENERATION_CONFIG, _not_applied(config), tuple(warnings + problems))


def _as_llama_cpp_reads(name: str, value):
    """``value`` of the GGUF key for the field ``name`` as llama.cpp takes it: its top-k sampler is off at any k <= 0
    (src/llama-sampling.cpp), and a top_k below 0 (-1, vLLM's and others' "off") reads as edgesdk's off, 0."""
    if name == "top_k" and isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return 0
    return value


def from_gguf_fields(fields: dict) -> ModelSampling:
    """The sampling settings of a GGUF file's ``general.sampling.*`` keys (``fields``: the key without its
    ``general.sampling.`` prefix -> value), as llama.cpp's ``common_init_sampler_from_model`` reads them: a top_k
    below 0, which llama.cpp's top-k sampler takes as off, reads as top_k 0 (off), without a warning."""
    found = {name: (f"general.sampling.{key}", _as_llama_cpp_reads(name, fields[key]))
             for key, name in GGUF_KEYS.items() if _sets(key, fields.get(key))}
    values, warnings = _collect(found, GGUF_SOURCE, "GGUF key")
    not_applied = {f"general.sampling.{key}": value for key, value in _not_applied(fields).items()}
    return ModelSampling(values, GGUF_SOURCE, not_applied, tuple(warnings))


def _float32(value) -> float:
    """A GGUF FLOAT32 as the decimal it was written from (0.95, not 0.949999988079071)."""
    import numpy as np

    return float(str(np.float32(value)))


def read_gguf_sampling(path: Path) -> dict:
    """The ``general.sampling.*`` keys of the GGUF file at ``path``: key without the prefix -> value."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(str(path))
    fields = {}
    for key, found in reader.fields.items():
        if not key.startswith("general.sampling."):
            continue
        value = found.contents()
        if found.types and found.types[0] in (GGUFValueType.FLOAT32,) and isinstance(value, float) \
                and math.isfinite(value):
            value = _float32(value)
        fields[key.removeprefix("general.sampling.")] = value
    return fields


def read_model_sampling(kind: str, path: Path) -> ModelSampling:
    """The sampling settings of a resolved model source (``kind`` ``hf-dir`` or ``gguf``, :mod:`.sources`); a
    ``generation_config.json`` that is not a JSON object is a warning and reads as none."""
    path = Path(path)
    if kind == "gguf":
        return from_gguf_fields(read_gguf_sampling(path))
    file = path / GENERATION_CONFIG
    if not file.is_file():
        return ModelSampling(source=GENERATION_CONFIG)
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return ModelSampling(source=GENERATION_CONFIG,
                             warnings=(f"{file} cannot be read as JSON ({exc}): the model's sampling settings are "
                                       "not used",))
    if not isinstance(config, dict):
        return ModelSampling(source=GENERATION_CONFIG,
                             warnings=(f"{file} holds {type(config).__name__}, not an object: the model's sampling "
                                       "settings are not used",))
    return from_generation_config(config)


def describe(values: dict) -> str:
    """``temperature 0.6, top_p 0.95, top_k 20``: sampling fields as a line shows them (samplers joined by ';', an
    empty chain, a ``sequence`` of names no sampler has, as "samplers (none)")."""
    return ", ".join(f"{name} {_chain(values[name]) if name == 'samplers' else _number(values[name])}"
                     for name in FIELDS if name in values)


def _chain(samplers) -> str:
    return ";".join(samplers) or "(none)"


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def source_words(source: str) -> str:
    """How a line names where the settings came from: "the model's generation_config.json"."""
    return f"the model's {source}" + (" keys" if source == GGUF_SOURCE else "")


def model_defaults(manifest: dict, given, fields: tuple[str, ...] = FIELDS) -> tuple[dict, str | None]:
    """(the bundle's recorded sampling settings among ``fields`` that the user did not set, where they came from),
    as llama.cpp's ``common_init_sampler_from_model`` takes a model's settings for each option not given;
    ``given(name)`` says whether the user set the field ``name``. ({}, None) for a bundle that records none."""
    record = manifest.get("generation")
    if not record:
        return {}, None
    sampling = record["sampling"]
    applied = {name: (tuple(sampling[name]) if name == "samplers" else sampling[name])
               for name in fields if name in sampling and not given(name)}
    return applied, record["source"]


def applied_line(applied: dict, source: str, temperature: float, greedy_hint: str = "--temperature 0") -> str:
    """The line that says which of the model's settings a run or server took: "sampling: temperature 0.6, top_p
    0.95 from the model's generation_config.json; --temperature 0 for greedy". ``temperature``: the one the run or
    server then samples at; at 0 (greedy) the line says that the draw's settings wait for a temperature above 0.
    ``greedy_hint``: how the user asks for greedy decoding (the option, or load()'s keyword)."""
    line = f"sampling: {describe(applied)} from {source_words(source)}"
    if temperature > 0:
        return f"{line}; {greedy_hint} for greedy"
    waiting = [name for name in DRAW_FIELDS if name in applied and name != "temperature"]
    if waiting:
        verb = "apply" if len(waiting) > 1 else "applies"
        return f"{line}; greedy at temperature 0, so {', '.join(waiting)} {verb} only with a temperature above 0"
    return line


def with_model_defaults(settings, manifest: dict, given, greedy_hint: str = "--temperature 0"):
    """(``settings`` with the bundle's recorded sampling settings for each field ``given(name)`` says the user did
    not set, the line that says so or None where none applied). ``settings``: a frozen dataclass holding the
    sampling fields (:class:`~edgesdk.runtime.generate.SamplingConfig` for ``run``, ``ServeDefaults`` for ``serve``
    and ``load()``), as llama.cpp's ``common_init_sampler_from_model`` fills the options not given."""
    import dataclasses

    applied, source = model_defaults(manifest, given)
    if not applied:
        return settings, None
    settings = dataclasses.replace(settings, **applied)
    return settings, applied_line(applied, source, settings.temperature, greedy_hint)


__all__ = ["applied_line", "model_defaults", "with_model_defaults", "FIELDS", "GENERATION_CONFIG", "GGUF_SOURCE", "ModelSampling", "describe", "from_gguf_fields",
           "from_generation_config", "read_gguf_sampling", "read_model_sampling", "sampling_value_problem",
           "source_words"]
