"""The pooling a model source declares for its embeddings, recorded in the bundle manifest.

- A GGUF file: ``{arch}.pooling_type``, llama.cpp's ``llama_pooling_type`` (0 none, 1 mean, 2 cls, 3 last,
  4 rank), which ``convert_hf_to_gguf.py`` writes for embedding models (Qwen3-Embedding: last).
- A Hugging Face directory of a sentence-transformers model: ``modules.json`` lists a Pooling module
  (``sentence_transformers.models.Pooling`` as sentence-transformers 2-4 write it,
  ``sentence_transformers.sentence_transformer.modules.pooling.Pooling`` as 5 writes it) whose ``config.json`` (in
  its ``path``, usually ``1_Pooling``) names the mode: ``"pooling_mode": "lasttoken"`` (``mean``, ``cls`` ...) as
  sentence-transformers 5 saves it (Qwen3-VL-Embedding's), or one boolean a mode (``pooling_mode_lasttoken``,
  ``pooling_mode_mean_tokens``, ``pooling_mode_cls_token`` ...) as earlier versions did; where both are there,
  ``pooling_mode`` wins, as its ``Pooling.load_config`` reads them.

Anything else (a chat model, which declares none) gives None: the runtime then pools with its default
(``edgesdk.runtime.embedding.DEFAULT_POOLING``). A declaration edgesdk cannot follow (rank, max, weighted
mean, several modes at once) also gives None, with the reason, so the build can say so.

The modules a sentence-transformers model lists besides its Transformer, Pooling and Normalize (edgesdk normalises
with the Euclidean norm by default, as Normalize does) change its vectors after pooling: ``Dense`` layers
(``2_Dense/config.json``: ``in_features``, ``out_features``, ``activation_function``; EmbeddingGemma's two,
768 to 3072 to 768, which llama.cpp applies as its ``dense_2`` and ``dense_3`` tensors). A bundle holds the decoder's
graph only, so its embeddings are the pooled hidden states: :func:`unapplied_modules` names those modules, for the
build to warn that the bundle's vectors differ from the ones sentence-transformers gives.
"""

from __future__ import annotations

import json
import numbers
from pathlib import Path

# llama.cpp's enum llama_pooling_type (include/llama.h)
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last"}
GGUF_RANK = 4
SENTENCE_TRANSFORMERS_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean",
                               "pooling_mode_cls_token": "cls"}
SENTENCE_TRANSFORMERS_OTHER = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                               "pooling_mode_weightedmean_tokens")
# sentence-transformers 5's ``pooling_mode`` names (sentence_transformer/modules/pooling.py, Pooling.POOLING_MODES)
SENTENCE_TRANSFORMERS_MODE_NAMES = {"lasttoken": "last", "mean": "mean", "cls": "cls"}
# the modules whose work a bundle's embeddings do: the decoder, the pooling, and the Euclidean norm (normalize 2)
SENTENCE_TRANSFORMERS_APPLIED = ("Transformer", "Pooling", "Normalize")


def gguf_pooling(field) -> tuple[str | None, str | None]:
    """(pooling, why none) from a GGUF file's metadata, ``field(key)`` reading one value (None when absent)."""
    arch = field("general.architecture")
    value = field(f"{arch}.pooling_type") if arch else None
    if value is None:
        return None, None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        # llama.cpp reads the key as a uint32 and refuses a file holding another type; 3.0 or true is no pooling
        # (a list, unhashable, raised TypeError here)
        return None, (f"its GGUF declares pooling_type {json.dumps(value, default=str)[:60]} ({_gguf_kind(value)}), "
                      "not the whole number llama.cpp reads (0 none, 1 mean, 2 cls, 3 last, 4 rank)")
    if value in GGUF_POOLING:
        return GGUF_POOLING[value], None
    what = "rank (a reranker's classification head)" if value == GGUF_RANK else f"{value!r}"
    return None, f"its GGUF declares pooling_type {what}, which edgesdk's embeddings do not compute"


def _gguf_kind(value) -> str:
    """What a GGUF value read as Python is, for a refusal: ``an array`` (a list), ``a float``, ``a bool`` ..."""
    return {bool: "a bool", float: "a float", str: "a string", list: "an array"}.get(type(value),
                                                                                  type(value).__name__)


def sentence_transformers_pooling(directory: Path) -> tuple[str | None, str | None]:
    """(pooling, why none) from a sentence-transformers model directory's ``modules.json``; one that is there but
    cannot be read, or is no list of modules, is named (sentence-transformers itself would not load the model)."""
    file = directory / "modules.json"
    if not file.is_file():
        return None, None
    try:
        modules = json.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        return None, f"its modules.json cannot be read ({exc.strerror or exc})"
    except ValueError as exc:  # not UTF-8, or not JSON
        return None, f"its modules.json is not JSON text ({exc})"
    if not isinstance(modules, list):
        return None, f"its modules.json holds {json.dumps(modules)[:60]}, not a JSON list of the model's modules"
    pooling = next((module for module in modules if isinstance(module, dict)
                    and str(module.get("type", "")).rsplit(".", 1)[-1] == "Pooling"), None)
    if pooling is None:
        return None, None
    where = (Path(str(pooling.get("path") or "")) / "config.json").as_posix()  # 1_Pooling/config.json
    config_path = directory / where
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except OSError as exc:
        why = "there is no such file" if isinstance(exc, FileNotFoundError) else exc.strerror or str(exc)
        return None, f"its modules.json names a Pooling module whose {where} cannot be read ({why})"
    except ValueError as exc:  # not UTF-8, or not JSON
        return None, f"its modules.json names a Pooling module whose {where} is not JSON text ({exc})"
    if not isinstance(config, dict):
        return None, (f"its modules.json names a Pooling module whose {where} holds {json.dumps(config)[:60]}, "
                      "not a JSON object of the Pooling settings")
    if config.get("pooling_mode") is not None:
        return _pooling_mode(config["pooling_mode"])
    chosen = [name for key, name in SENTENCE_TRANSFORMERS_MODES.items() if config.get(key) is True]
    others = [key for key in SENTENCE_TRANSFORMERS_OTHER if config.get(key) is True]
    if len(chosen) == 1 and not others:
        return chosen[0], None
    if chosen or others:
        modes = ", ".join([key for key in SENTENCE_TRANSFORMERS_MODES if config.get(key) is True] + others)
        return None, f"its sentence-transformers Pooling sets {modes}, which edgesdk's embeddings do not compute"
    return None, None


def _pooling_mode(mode) -> tuple[str | None, str | None]:
    """(pooling, why none) from sentence-transformers 5's ``pooling_mode``: one mode name, or a list of them whose
    vectors it concatenates (a list of one is that mode). A name in any case ("LastToken", "CLS"), as ``Pooling``
    lowercases it before matching."""
    modes = [mode] if isinstance(mode, str) else mode
    if isinstance(modes, list) and len(modes) == 1 and isinstance(modes[0], str) \
            and modes[0].lower() in SENTENCE_TRANSFORMERS_MODE_NAMES:
        return SENTENCE_TRANSFORMERS_MODE_NAMES[modes[0].lower()], None
    return None, (f"its sentence-transformers Pooling sets pooling_mode {json.dumps(mode)[:80]}, which edgesdk's "
                  "embeddings do not compute")


def sentence_transformers_unapplied(directory: Path) -> str | None:
    """What a build warns of when a sentence-transformers model directory lists modules edgesdk's embeddings do not
    apply (see the module), naming each with its ``path`` (a Dense one with its sizes and activation); None where
    there are none, or no modules.json to read (:func:`sentence_transformers_pooling` names one that cannot be)."""
    try:
        modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(modules, list):
        return None
    unapplied = [module for module in modules if isinstance(module, dict)
                 and _module_type(module) not in SENTENCE_TRANSFORMERS_APPLIED]
    if not unapplied:
        return None
    # each Dense module's config.json read once, for its name and for the sizes
    configured = [(module, _dense_config(directory, module) if _module_type(module) == "Dense" else {})
                  for module in unapplied]
    named = [_module_named(module, config) for module, config in configured]
    sizes = [config.get("out_features") for module, config in configured if _module_type(module) == "Dense"]
    theirs = f" ({sizes[-1]} values each)" if sizes and isinstance(sizes[-1], int) else ""
    return (f"its modules.json lists {', '.join(named)}, which edgesdk's embeddings do not apply: the bundle's "
            "embeddings are the model's pooled hidden states, not the vectors sentence-transformers and llama.cpp "
            f"give after those modules{theirs}, so they cannot be compared with vectors those make of this model; "
            "compare them only with embeddings of this bundle, or build a model whose modules.json lists none")


def _module_type(module: dict) -> str:
    """A modules.json entry's class name: ``sentence_transformers.models.Dense`` -> ``Dense``."""
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _dense_config(directory: Path, module: dict) -> dict:
    """A Dense module's ``config.json`` (in its ``path``), or {} where it cannot be read as a JSON object."""
    try:
        config = json.loads((directory / str(module.get("path") or "") / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _module_named(module: dict, config: dict) -> str:
    """A module as the build's warning names it: ``2_Dense (Dense, 768 to 3072 values, torch.nn.modules.activation.Tanh)``;
    ``config`` a Dense module's :func:`_dense_config` ({} for other modules)."""
    kind = _module_type(module) or json.dumps(module.get("type"))[:40]
    where = str(module.get("path") or module.get("name") or kind)
    if kind != "Dense":
        return f"{where} ({kind})"
    sizes = (config.get("in_features"), config.get("out_features"))
    shown = [kind] + ([f"{sizes[0]} to {sizes[1]} values"] if all(isinstance(size, int) for size in sizes) else [])
    activation = str(config.get("activation_function") or "")
    if activation and activation.rsplit(".", 1)[-1] != "Identity":
        shown.append(activation)
    return f"{where} ({', '.join(shown)})"


def unapplied_modules(kind: str, path: Path) -> str | None:
    """:func:`sentence_transformers_unapplied` of a resolved model source; None for a GGUF file, which lists no
    modules (llama.cpp writes EmbeddingGemma's Dense layers as the ``dense_2`` / ``dense_3`` tensors of its
    gemma-embedding architecture, which edgesdk does not load)."""
    return sentence_transformers_unapplied(path) if kind != "gguf" else None


def declared_pooling(kind: str, path: Path) -> tuple[str | None, str | None]:
    """(pooling, why none) of a resolved model source: ``kind`` ``gguf`` (``path`` the file) or ``hf-dir``."""
    if kind != "gguf":
        return sentence_transformers_pooling(path)
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception:  # noqa: BLE001 - the model check has named a damaged file already
        return None, None

    def field(key: str):
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    return gguf_pooling(field)


__all__ = ["GGUF_POOLING", "declared_pooling", "gguf_pooling", "sentence_transformers_pooling",
           "sentence_transformers_unapplied", "unapplied_modules"]
