"""Load a resolved model source into a PyTorch causal LM and its tokenizer (host only).

GGUF files are read with transformers' GGUF support (``gguf_file=``), which de-quantizes the
weights to float32; SmolLM3 files, for which it has no mapping, are read here with gguf-py (_read_smollm3_gguf). Only decoder architectures the ONNX exporter knows are accepted.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import math
import re
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgesdk.errors import ModelSourceError
from edgesdk.models.pooling import declared_pooling
from edgesdk.models.sources import DEQUANTIZED_METHODS, ModelSource, _with_model, download_again_command

# model_type -> why it is supported; the exporter (export/llama_graph.py) handles these.
SUPPORTED_ARCHITECTURES = {
    "llama": "Llama / SmolLM2 / TinyLlama: RMSNorm, rotary, GQA, SwiGLU (attention_bias, mlp_bias off)",
    "mistral": "Llama layout; sliding window must be off or longer than the context",
    "qwen2": "Llama layout with q/k/v biases",
    "qwen3": "Llama layout with an RMSNorm on each head's query and key (q_norm, k_norm) before rotary",
    "smollm3": "SmolLM3: Llama layout whose no_rope_layers (every fourth layer) apply no rotary (NoPE); "
               "sliding window must be off or longer than the context",
    "gemma3_text": "Gemma 3 (270M, 1B): query/key norms, norms around attention and FFN, sliding-window "
                   "layers, GeGLU FFN, embedding scaled by sqrt(width)",
}
# and the architectures loaded as the Llama they compute (edgesdk/models/as_llama.py: CONVERTED_ARCHITECTURES):
# Phi-3 / Phi-3.5-mini (rotary over the whole head; sliding window off or longer than the context) and Granite 3
# the FFN activation each architecture's graphs compute (transformers' names)
FFN_ACTIVATIONS = {"gemma3_text": ("gelu_pytorch_tanh",)}


@dataclass
class LoadedModel:
    """A host-side model ready for stages and export."""

    model: Any  # transformers PreTrainedModel (torch.nn.Module), in eval mode, float32
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    source: ModelSource
    pooling: str | None = None  # the embeddings' pooling the source declares (edgesdk/models/pooling.py)
    pooling_note: str | None = None  # why a pooling the source declares is not followed

    def facts(self) -> dict:
        """Facts recorded in the bundle manifest: a model loaded as the Llama it computes (as_llama) keeps its own
        architecture, and says what it was built as (``loaded_as``)."""
        from edgesdk.models.as_llama import SOURCE_ARCHITECTURE

        config = self.model.config
        source_architecture = getattr(config, SOURCE_ARCHITECTURE, None)
        positions = getattr(config, "max_position_embeddings", None)
        return {
            "source": self.source.name,
            "format": self.source.kind,
            "architecture": source_architecture or config.model_type,
            **({"loaded_as": config.model_type} if source_architecture else {}),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "layers": config.num_hidden_layers,
            "hidden_size": config.hidden_size,
            "attention_heads": config.num_attention_heads,
            "kv_heads": config.num_key_value_heads,
            "intermediate_size": config.intermediate_size,
            "vocab_size": config.vocab_size,
            # the model's positions, which cap a bundle's context ('edgesdk build --max-context'; run's -c hint)
            **({"max_position_embeddings": int(positions)} if positions else {}),
            "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
            # Gemma 3's local-attention window, which a GGUF export writes (Qwen2 configs carry one they may not use)
            **({"sliding_window": int(config.sliding_window)}
               if config.model_type == "gemma3_text" and getattr(config, "sliding_window", None) else {}),
            **({"pooling": self.pooling} if self.pooling else {}),
            # the model card's license, organization, name ... which a GGUF export writes back (general.*)
            **({"card": card} if (card := source_card(self.source)) else {}),
        }


# general.* keys of a GGUF file's model card that the manifest records (export/gguf_export.py CARD_KEYS writes them)
GGUF_CARD_KEYS = ("name", "basename", "finetune", "version", "size_label", "organization", "license", "license.name",
                  "license.link", "languages", "tags")
# a Hugging Face README's front matter field -> the general.* key it is (convert_hf_to_gguf.py's metadata reading)
README_CARD_FIELDS = {"license": "license", "license_name": "license.name", "license_link": "license.link",
                      "language": "languages"}


def source_card(source: ModelSource) -> dict:
    """The source model's card: general.* key (less ``general.``) -> a string or a list of strings. A GGUF file's
    general.* keys (license, organization, basename, size label ...), which a build from the file would otherwise
    drop; a Hugging Face directory's README.md front matter's license (and its name and link, for ``other``) and
    languages, as llama.cpp's converter reads them. Empty where there is none; a card that cannot be read is no card,
    never a failed build: it names the model, the weights do not depend on it."""
    card: dict = {}
    try:
        if source.kind == "gguf":
            fields = gguf_reader(source.path).fields
            for key in GGUF_CARD_KEYS:
                found = fields.get(f"general.{key}")
                card[key] = None if found is None else found.contents()
        else:
            import yaml

            # utf-8-sig: a README saved with a byte order mark (Windows editors) starts with U+FEFF, where the front
            # matter's opening "---" must be the first characters
            text = (Path(source.path) / "README.md").read_text(encoding="utf-8-sig")
            match = re.match(r"---\s*\n(.*?)\n---\s*(?:\n|$)", text, re.DOTALL)
            front = yaml.safe_load(match.group(1)) if match else None
            for name, key in README_CARD_FIELDS.items():
                card[key] = front.get(name) if isinstance(front, dict) else None
    except Exception:  # a README without front matter, YAML that does not parse, a field gguf cannot decode
        return {}
    if isinstance(card.get("languages"), str):
        card["languages"] = [card["languages"]]
    return {key: value for key, value in card.items()
            if (isinstance(value, str) and value.strip())
            or (isinstance(value, list) and value and all(isinstance(item, str) for item in value))}


# model_type -> what it is, for the architectures whose text decoder edgesdk exports inside a model it does not:
# transformers' Gemma3ForConditionalGeneration (gemma-3-4b and larger) wraps a gemma3_text decoder and a vision encoder
MULTIMODAL_WRAPPERS = {
    "gemma3": ("Gemma 3 with its vision encoder (Gemma3ForConditionalGeneration: gemma-3-4b and larger)", "gemma3_text",
               "gemma-3-270m, gemma-3-1b", "gemma3"),
}
# general.architecture -> the models llama.cpp's convert_hf_to_gguf.py writes under it that edgesdk reads
GGUF_ARCHITECTURES = {
    "gemma3": "Gemma 3's text decoder",
    "llama": "Llama, SmolLM2, TinyLlama, and Mistral, which llama.cpp's converter writes as llama",
    "phi3": "Phi-3 without longrope factors, e.g. Phi-3-mini-4k",
    "qwen2": "Qwen2, Qwen2.5",
    "qwen3": "Qwen3",
    "smollm3": "SmolLM3",
}


def check_model_type(model_type: str | None, where: str, auto_map: Any = None) -> None:
    """Refuse a model whose ``model_type`` edgesdk cannot build from. ``auto_map``: its config.json's, where the
    model brings its own code (trust_remote_code), which the refusal names: edgesdk runs transformers' built-in
    classes only, and a model type made up for such code is known to no one else."""
    from edgesdk.models.as_llama import CONVERTED_ARCHITECTURES

    if model_type not in SUPPORTED_ARCHITECTURES and model_type not in CONVERTED_ARCHITECTURES:
        wrapper = MULTIMODAL_WRAPPERS.get(model_type)
        files = auto_map_files(auto_map)
        fix = (f"use a {wrapper[1]} model ({wrapper[2]}), or this model's GGUF file: llama.cpp's convert_hf_to_gguf.py "
               f"writes its text decoder alone (general.architecture {wrapper[3]}), which edgesdk reads" if wrapper else
               "use a Llama-family decoder (Llama, SmolLM2, SmolLM3, TinyLlama, Qwen2, Qwen3, Mistral, Phi-3, Granite "
               "3) or a Gemma 3 text model")
        raise ModelSourceError(
            f"model {where} has architecture '{model_type}', which edgesdk cannot build from"
            + (f": its config.json's auto_map loads it with the model's own code ({', '.join(files)}; "
               "trust_remote_code), and edgesdk does not run a model's own code" if files else "")
            + f"; supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}; loaded as the Llama they compute: "
            f"{', '.join(sorted(CONVERTED_ARCHITECTURES))}"
            + (f". '{model_type}' is {wrapper[0]}; edgesdk builds its text decoder alone ({wrapper[1]}: {wrapper[2]})"
               if wrapper else ""),
            ("where that code only renames a supported architecture (its classes subclass e.g. Qwen2ForCausalLM "
             "unchanged), set model_type in config.json to that architecture's (e.g. qwen2) and remove auto_map; "
             "otherwise " + fix) if files else fix,
        )


def auto_map_files(auto_map: Any, model_only: bool = False) -> list[str]:
    """The Python files a config.json's ``auto_map`` loads the model's own code from (trust_remote_code): each
    reference ``module.Class`` is ``module.py`` beside config.json, ``repo--module.Class`` that file of another
    repository on the Hub. ``model_only``: leave out the tokenizer's and processor's code (AutoTokenizer ...), which
    a model of a built-in architecture may bring too."""
    if not isinstance(auto_map, dict):
        return []
    files = []
    for key, references in auto_map.items():
        if model_only and any(word in str(key) for word in ("Tokenizer", "Processor", "FeatureExtractor")):
            continue
        for reference in references if isinstance(references, (list, tuple)) else [references]:
            if not isinstance(reference, str) or "." not in reference:
                continue
            repo, _, module = reference.rpartition("--")
            name = f"{module.rsplit('.', 1)[0]}.py" + (f" of {repo}" if repo else "")
            if name not in files:
                files.append(name)
    return files


def check_gguf_architecture(arch: str | None, path: Path) -> None:
    """Refuse a GGUF file whose ``general.architecture`` edgesdk cannot build from, naming the GGUF architectures it
    reads (llama.cpp's names, which differ from transformers' model types: gemma3 for gemma3_text, Mistral written as
    llama, Granite read from its Hugging Face directory only), before transformers, which refuses architectures it
    lacks as if the file were damaged.

    ``deci``, which ``edgesdk export`` writes for a bundle whose layers were pruned to different shapes, is refused by
    that name: its head counts and FFN widths are per-layer arrays, which transformers' GGUF reader takes as one size
    (its deci mapping has no model behind it) and no transformers Llama config holds, so the pruned model cannot be
    loaded to build from."""
    from edgesdk.models.as_llama import CONVERTED_ARCHITECTURES

    if arch in SUPPORTED_ARCHITECTURES or arch in CONVERTED_ARCHITECTURES or arch in GGUF_ARCHITECTURES:
        return
    if arch == "deci":
        raise ModelSourceError(
            f"the GGUF file {path} holds architecture 'deci' (general.architecture): edgesdk writes 'deci' for "
            "pruned bundles (layers of different head counts and FFN widths) but cannot build from it, since "
            "transformers has no model with per-layer sizes to load it into",
            "build from the original model (the one the pruned bundle was built from), with the prune stage again "
            "if you want it pruned; run the pruned bundle itself with edgesdk, or the file with llama.cpp")
    raise ModelSourceError(
        f"the GGUF file {path} holds architecture '{arch}' (general.architecture), which edgesdk cannot build from; "
        "the GGUF architectures it reads: "
        + ", ".join(f"{name} ({models})" for name, models in sorted(GGUF_ARCHITECTURES.items()))
        + "; Granite 3 builds from its Hugging Face directory only",
        "use a GGUF file of one of those models (as llama.cpp's convert_hf_to_gguf.py writes them), or the "
        "Hugging Face directory of a Llama-family decoder (Llama, SmolLM2, SmolLM3, TinyLlama, Qwen2, Qwen3, "
        "Mistral, Phi-3, Granite 3) or a Gemma 3 text model",
    )


class ModelCodeNote(UserWarning):
    """A Hugging Face directory whose config.json's auto_map names the model's own code (trust_remote_code) for an
    architecture transformers has built in: edgesdk loads the built-in class, not that code. ``edgesdk build``
    prints it as its own line."""


def _warn_of_own_code(directory: Path, model) -> None:
    """Say (ModelCodeNote) that ``model``, loaded from ``directory`` with transformers' own class, is not what its
    config.json's auto_map names, which a fine-tune that changed the architecture's code would need; nothing where
    the config has no auto_map for the model (a tokenizer's own code is not the model's)."""
    try:
        declared = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    files = auto_map_files(declared.get("auto_map") if isinstance(declared, dict) else None, model_only=True)
    if files:
        warnings.warn(f"{Path(directory) / 'config.json'}'s auto_map names the model's own code ({', '.join(files)}), "
                      "which edgesdk does not run: the model is loaded with transformers' built-in "
                      f"{type(model).__name__} for model_type '{declared.get('model_type')}', which computes what "
                      "that code computes only where the code does not change it", ModelCodeNote, stacklevel=3)


def check_model_type_declared(directory: Path) -> None:
    """Refuse a Hugging Face directory whose config.json names an architecture edgesdk cannot build from before
    transformers reads it: one transformers does not know either it refuses as if the config were damaged, and
    tells the user to upgrade transformers. A config.json that cannot be read is left to transformers' reader."""
    path = Path(directory) / "config.json"
    try:
        declared = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # transformers' reader names the file and says it is not valid JSON
        return
    if not isinstance(declared, dict):  # transformers' "Unrecognized model ... Should have a `model_type` key"
        raise ModelSourceError(f"cannot read the model config of {directory}: {path.name} holds a JSON "
                               f"{type(declared).__name__}, expected an object of the model's settings (model_type, "
                               "hidden_size, num_hidden_layers ...)",
                               "use the config.json that came with the weights (e.g. download it again with "
                               f"'{download_again_command(directory, ('config.json',))}')")
    model_type = declared.get("model_type")
    if isinstance(model_type, str):
        check_model_type(model_type, str(directory), declared.get("auto_map"))


def ffn_activation_mismatch(config: Any) -> tuple[str, Any, str] | None:
    """(the config's field, its FFN activation, the one the exported graphs compute) where ``config``'s FFN
    activation (``hidden_act``, Gemma 3's ``hidden_activation``) is not one the graphs compute for its architecture
    (:data:`FFN_ACTIVATIONS`, else SiLU); None where it is. An absent field is taken as the architecture's own
    default, as transformers' config classes set it; a field set to None is no activation (transformers' configs
    refuse it: "Field 'hidden_act' expected str")."""
    model_type = getattr(config, "model_type", None)
    expected = FFN_ACTIVATIONS.get(model_type, ("silu", "swish"))
    field = "hidden_activation" if model_type == "gemma3_text" else "hidden_act"
    activation = getattr(config, field, expected[0])
    return None if activation in expected else (field, activation, expected[0])


def check_architecture(config: Any, where: str) -> None:
    from edgesdk.models.as_llama import check_convertible

    model_type = getattr(config, "model_type", None)
    check_model_type(model_type, where)
    check_convertible(config, where)
    # Llama's attention_bias adds a bias to o_proj as well as q/k/v, mlp_bias one to gate/up/down (Granite's too);
    # the exporter (export/decoder_weights.py) carries only q/k/v biases (Qwen2's layout).
    biased = [name for name in ("attention_bias", "mlp_bias") if getattr(config, name, False)]
    if model_type != "qwen2" and biased:
        raise ModelSourceError(
            f"model {where} sets {' and '.join(f'{name}: true' for name in biased)}: biases on "
            f"{'o_proj' if 'attention_bias' in biased else ''}{' and ' if len(biased) == 2 else ''}"
            f"{'the MLP projections' if 'mlp_bias' in biased else ''}, which the exporter does not emit "
            "(it carries Qwen2's q/k/v biases only)",
            "use a Llama-family model without those biases (attention_bias and mlp_bias false)",
        )
    # The graphs compute the FFN as SwiGLU (silu(gate) * up), Gemma's as GeGLU; another activation would export
    # without a word.
    mismatch = ffn_activation_mismatch(config)
    if mismatch:
        field, activation, expected = mismatch
        raise ModelSourceError(
            f"model {where} uses {field} {activation!r} in its FFN; the exported graphs compute "
            f"{expected}(gate) * up for a {model_type} model, so its answers would differ from the model's",
            f"use a {model_type} model whose FFN activation is {expected}",
        )
    # Gemma 2's logit soft-capping: Gemma3ForCausalLM applies final_logit_softcapping, which the graphs do not.
    # attn_logit_softcapping is not refused: transformers' Gemma3Attention reads it but never applies it (Gemma 3
    # replaced it with the query/key norms), so the graphs compute what the model does.
    if getattr(config, "final_logit_softcapping", None) is not None:
        raise ModelSourceError(f"model {where} sets final_logit_softcapping {config.final_logit_softcapping}, which "
                               "the exported graphs do not apply, so its logits would differ from the model's",
                               "use a model without final_logit_softcapping (Gemma 3 text models have none)")
    if getattr(config, "use_bidirectional_attention", False):
        raise ModelSourceError(f"model {where} attends bidirectionally (use_bidirectional_attention: true, an "
                               "embedding model); the exported graphs decode causally",
                               "use a causal language model")
    # A sliding attention window is checked against the bundle's context at export (check_exportable).


def gguf_reader(path: Path):
    """The GGUF file at ``path`` read with gguf's GGUFReader, once per file version (its size and mtime): parsing
    the header and the vocabulary's arrays costs about 2 s for SmolLM2, and a load reads the metadata up to three
    times (:func:`check_gguf_model`, the padding token, :func:`gguf_adds_bos_by_default`)."""
    stat = Path(path).stat()
    return _gguf_reader(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _gguf_reader(path: str, size: int, mtime_ns: int):
    from gguf import GGUFReader

    return GGUFReader(path)


# the general.type of the GGUF files that go beside a model and hold none (gguf-py's GGUFType), and what they hold
GGUF_COMPANION_TYPES = {
    "mmproj": ("a multimodal projector", "the vision encoder llama.cpp's llama-mtmd-cli takes beside a model with "
               "--mmproj"),
    "imatrix": ("an importance matrix", "what llama.cpp's llama-quantize takes with --imatrix to quantize a model"),
}


# gguf-py's GGUFReader meeting a tensor type id its GGMLQuantizationType lacks ("np.uint32(42) is not a valid
# GGMLQuantizationType"): a file from a newer llama.cpp than the installed gguf package
UNKNOWN_TENSOR_TYPE = re.compile(r"(\d+)\)? is not a valid GGMLQuantizationType")


def check_gguf_model(path: Path, terms: str = "cli") -> dict:
    """Refuse a GGUF that holds no whole model (a LoRA adapter, metadata only), a model of an
    architecture edgesdk cannot build from, or one without a size llama.cpp requires (:func:`_check_required_sizes`),
    before transformers reads it: for a file without its architecture's sizes it falls back to 7B defaults and
    fills the memory with a model of random weights.

    Returns the config values transformers' GGUF reader leaves out: the head size, as llama.cpp reads it
    (``{arch}.attention.key_length``, else width / heads), which Qwen3 sets apart from width / heads and
    transformers' Qwen3 mapping does not read (its config then takes Qwen3's default of 128, also for a
    file whose head size is width / heads and so has no key_length); and the rotary scaling it drops (Llama 3's
    rope_freqs, linear), as transformers' ``rope_parameters``. ``terms``: whose names the fixes give the model and
    the adapter, ``"cli"`` edgesdk build's flags (``--model``, ``--lora``), ``"python"`` build_bundle()'s arguments."""
    try:
        reader = gguf_reader(path)
    except Exception as exc:  # gguf raises ValueError and struct errors for damaged files
        try:
            size = f"{path.stat().st_size:,} bytes"
        except OSError:
            size = "size unknown"
        unknown = UNKNOWN_TENSOR_TYPE.search(str(exc)) if isinstance(exc, ValueError) else None
        if unknown:  # a type id newer than the installed gguf-py (GGMLQuantizationType), not damage
            from importlib.metadata import version

            raise ModelSourceError(
                f"cannot read the GGUF file {path} ({size}): it holds tensors of the type id {unknown[1]}, which the "
                f"installed gguf package ({version('gguf')}), through which edgesdk reads GGUF files, does not know "
                "(a quantization type newer than the package, else a damaged file)",
                "upgrade it (pip install -U gguf), or use a file of the model quantized to a type it reads (e.g. "
                "Q8_0, Q4_K_M or F16: llama.cpp's llama-quantize converts between them); where the file's size or "
                "sha256 differs from the source's, download it again") from exc
        why = (f"{exc.strerror or exc}" if isinstance(exc, OSError) else "its header, metadata or tensor table does "
               f"not fit the file, as in a truncated or damaged download ({type(exc).__name__}: {exc})")
        raise ModelSourceError(f"cannot read the GGUF file {path} ({size}): {why}",
                               "check that the file is complete: compare its size and sha256 with the source's, "
                               "and download it again if they differ") \
            from exc

    def field(key: str):
        found = reader.fields.get(key)
        return None if found is None else found.contents()

    parts = field("split.count")
    if isinstance(parts, int) and parts > 1:  # llama.cpp's gguf-split (LLM_KV_SPLIT_COUNT, LLM_KV_SPLIT_NO 0-based)
        from edgesdk.models.sources import SPLIT_GGUF_NAME

        part = field("split.no")
        first = SPLIT_GGUF_NAME.sub(f"-00001-of-{parts:05d}.gguf", path.name)
        raise ModelSourceError(
            f"the GGUF file {path} is "
            + (f"part {part + 1}" if isinstance(part, int) else "a part")
            + f" of a model split into {parts} files (split.count); transformers, which edgesdk loads GGUF "
            "files with, reads one whole file",
            f"merge the parts into one with llama.cpp's llama-gguf-split --merge {shlex.quote(str(path.with_name(first)))}"
            f" merged.gguf, and pass merged.gguf {_with_model(terms)}")
    kind, arch = field("general.type"), field("general.architecture")
    tensors = {tensor.name for tensor in reader.tensors}
    missing = [key for key in (f"{arch}.block_count", f"{arch}.embedding_length") if field(key) is None]
    if kind == "adapter":
        raise ModelSourceError(
            f"the GGUF file {path} holds a LoRA adapter (general.type adapter"
            + (f", architecture {arch!r}" if arch else "") + "), not a whole model",
            (f"pass the base model it was made for with --model and the adapter with --lora: edgesdk build --model "
             f"BASE --lora {shlex.quote(str(path))}" if terms != "python" else
             "pass the base model it was made for as model and the adapter as lora: build_bundle(target, "
             f"model=BASE, lora={str(path)!r})")
            + " (merged into the weights at build time, as llama.cpp's --lora applies it)")
    if kind in GGUF_COMPANION_TYPES:
        raise ModelSourceError(
            f"the GGUF file {path} holds {GGUF_COMPANION_TYPES[kind][0]} (general.type {kind}"
            + (f", architecture {arch!r}" if arch else "") + f"), {GGUF_COMPANION_TYPES[kind][1]}, not a language model",
            "pass the GGUF file of the language model itself (in a GGUF repository, the file without mmproj or "
            "imatrix in its name, e.g. MODEL-Q8_0.gguf)")
    if arch is None or missing or "token_embd.weight" not in tensors:
        what = (f"no whole model (architecture {arch!r}, {len(tensors)} tensors"
                + (f", no {', '.join(missing)}" if missing else "")
                + (", no token_embd.weight" if "token_embd.weight" not in tensors else "") + ")")
        raise ModelSourceError(f"the GGUF file {path} holds {what}", "pass the GGUF of a whole model")
    experts = field(f"{arch}.expert_count")  # llama.cpp's LLM_KV_EXPERT_COUNT: Mixtral's files are llama ones with it
    if isinstance(experts, int) and experts > 0:
        used = field(f"{arch}.expert_used_count")
        raise ModelSourceError(
            f"the GGUF file {path} holds a mixture-of-experts model ({arch}.expert_count {experts}"
            + (f", {used} used per token" if isinstance(used, int) else "") + ", as Mixtral's files are written): "
            "edgesdk's decoders have one dense FFN per layer and do not compute its expert FFNs (blk.N.ffn_*_exps)",
            "use a dense model (Llama, SmolLM2, TinyLlama, Qwen2, Qwen3, Mistral 7B, Phi-3, Granite 3, Gemma 3)")
    _check_tensor_types(path, reader)
    _check_bpe_pre_tokenizer(path)
    _check_special_token_ids(path, field)
    _check_unique_tokens(path, field)
    if arch == "gemma3":
        _check_required_sizes(path, arch, field)
        _check_size_types(path, arch, field)
        _check_one_size_per_model(path, arch, field)
        return {**_gguf_kv_heads(arch, field), **_gemma3_overrides(path, field, _gguf_head_dim(path, arch, field))}
    if arch == "smollm3":
        _check_size_types(path, arch, field)
        return _smollm3_config(path, field, reader, _gguf_head_dim(path, arch, field))
    if arch == "granite":
        raise ModelSourceError(
            f"the GGUF file {path} holds a Granite model (general.architecture granite), which transformers' GGUF "
            "reader, through which edgesdk loads GGUF files, does not read (it has no granite mapping, and would "
            "drop the attention, residual, embedding and logit scales llama.cpp reads from granite.*_scale)",
            "build from the model's Hugging Face directory instead (e.g. hf download ibm-granite/granite-3.3-2b-instruct "
            "--local-dir granite-3.3-2b-instruct, then edgesdk build --model granite-3.3-2b-instruct)")
    check_gguf_architecture(arch, path)  # before transformers, which refuses architectures it lacks as if damaged
    _check_required_sizes(path, arch, field)  # before the checks that read those sizes
    _check_size_types(path, arch, field)
    _check_one_size_per_model(path, arch, field)
    head_dim = _gguf_head_dim(path, arch, field)
    phi3 = _phi3_overrides(path, field, tensors, head_dim) if arch == "phi3" else {}
    _check_whole_head_rotary(path, arch, field, head_dim)
    if arch != "phi3":
        _check_tensors_read(path, arch, field, tensors)
    rope = _gguf_rope_overrides(path, arch, field, reader, head_dim)
    return {**head_dim, **_gguf_kv_heads(arch, field), **phi3, **rope}


def _gguf_kv_heads(arch: str, field) -> dict:
    """``{"num_key_value_heads": n}`` for a file without ``{arch}.attention.head_count_kv``: llama.cpp then takes
    one key-value head per query head (``llama_model::load_hparams``: "n_head_kv is optional, default to n_head";
    gguf.md: "if not present ... the model does not use GQA"), where transformers' GGUF reader leaves its config
    class's default (Qwen2Config's and Qwen3Config's 32, Gemma3TextConfig's 4), so the key / value weights failed
    to load as a damaged download, or loaded as other heads. {} where the file gives the key or the head count is
    not one number."""
    heads = field(f"{arch}.attention.head_count")
    if field(f"{arch}.attention.head_count_kv") is not None or not isinstance(heads, int) or heads <= 0:
        return {}
    return {"num_key_value_heads": heads}


# the {arch}.* keys llama.cpp needs beside block_count and embedding_length to load the architectures edgesdk reads
# through transformers (llama_model::load_hparams: context_length and the RMS epsilon are required keys; without
# head_count or feed_forward_length it takes 0 heads or an FFN of width 0, whose tensors then fail its shape check)
GGUF_REQUIRED_SIZES = ("context_length", "feed_forward_length", "attention.head_count",
                       "attention.layer_norm_rms_epsilon")


def _check_required_sizes(path: Path, arch: str, field) -> None:
    """Refuse a GGUF file without a size llama.cpp needs to load it (:data:`GGUF_REQUIRED_SIZES`), or with no
    attention heads (a head count <= 0; one that is no whole number is :func:`_check_size_types`'s to name):
    transformers' GGUF reader takes its config class's default for an absent key without a word (LlamaConfig's 32 heads, 2048 positions, RMS epsilon 1e-6, FFN width 11008), so a Llama of 4 heads of 16 loaded
    as 32 heads of 2 (the query / key weights have the same shape) and computed something other than its
    checkpoint, and an FFN of another width failed as a damaged download."""
    missing = [f"{arch}.{key}" for key in GGUF_REQUIRED_SIZES if field(f"{arch}.{key}") is None]
    if missing:
        raise ModelSourceError(
            f"the GGUF file {path} lacks {', '.join(missing)}, which llama.cpp needs to load a {arch} model (it "
            "refuses the file); transformers' GGUF reader, through which edgesdk loads GGUF files, would put its "
            f"config class's default{'s' if len(missing) > 1 else ''} in {'their' if len(missing) > 1 else 'its'} "
            "place, so the model would compute something other than its checkpoint: an incompletely converted file",
            "convert the model again with llama.cpp's convert_hf_to_gguf.py (it writes these keys), or build from "
            "its Hugging Face directory")
    heads = field(f"{arch}.attention.head_count")
    counts = heads if isinstance(heads, list) else [heads]  # llama.cpp's get_key_or_arr: one value, or one per layer
    # a count that is no whole number (text "8", a float) is left to _check_size_types, which names its type
    if not counts or any(isinstance(count, int) and not isinstance(count, bool) and count <= 0 for count in counts):
        raise ModelSourceError(
            f"the GGUF file {path} gives {heads!r:.60} attention heads ({arch}.attention.head_count), where each "
            f"layer of a {arch} model has at least one (llama.cpp refuses its attention tensors)",
            "convert the model again with llama.cpp's convert_hf_to_gguf.py, or build from its Hugging Face "
            "directory")


# the {arch}.* sizes llama.cpp reads as unsigned integers (llama_model::load_hparams), those it also takes as one
# value per layer (get_key_or_arr), and those it reads as float32
GGUF_INTEGER_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length",
                     "attention.head_count", "attention.head_count_kv", "attention.key_length",
                     "attention.value_length", "rope.dimension_count")
GGUF_PER_LAYER_KEYS = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")
GGUF_FLOAT_KEYS = ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.scaling.factor", "rope.scale_linear")


def _check_size_types(path: Path, arch: str, field) -> None:
    """Refuse a GGUF file whose ``{arch}.*`` sizes are not numbers of the type llama.cpp reads, whose context length
    is not positive, or whose key-value head count does not divide its query heads, naming the key. llama.cpp
    refuses a key of another type ("key llama.rope.freq_base has wrong type str but expected type f32",
    GGUFMeta::GKV::get_kv) and a file whose key / value tensors do not fit n_head_kv ("tensor 'blk.0.attn_k.weight'
    has wrong shape"); here a rotary base given as text failed with a bare "ValueError: could not convert string to
    float", an RMS epsilon given as an integer with transformers' config validation, both reported as a damaged
    download, and 0 (or 3 of 4) key-value heads with "ZeroDivisionError" (or "cannot reshape array")."""
    fix = ("convert the model again with llama.cpp's convert_hf_to_gguf.py (it writes these keys as numbers of "
           "their type), or build from its Hugging Face directory")
    for key in (*GGUF_INTEGER_KEYS, *GGUF_FLOAT_KEYS):
        value = field(f"{arch}.{key}")
        values = value if isinstance(value, list) and key in GGUF_PER_LAYER_KEYS else [value]
        integer = key in GGUF_INTEGER_KEYS
        if value is None or all(not isinstance(item, bool) and isinstance(item, int if integer else float)
                                for item in values):
            continue
        raise ModelSourceError(
            f"the GGUF file {path} gives {arch}.{key} as {type(value).__name__} {value!r:.60}, where llama.cpp reads "
            + ("a whole number" + (" (or one per layer)" if key in GGUF_PER_LAYER_KEYS else "") if integer
               else "a float32 number (e.g. 1e-05 or 10000.0)") + " and refuses the file (the key has the wrong type)",
            fix)
    _check_context_length(path, arch, field)
    base = field(f"{arch}.rope.freq_base")
    if base is not None and not _positive_number(base):
        raise ModelSourceError(f"the GGUF file {path} gives {arch}.rope.freq_base {base!r}, where the rotary base is "
                               "a number > 0 (e.g. 10000.0): the model's rotary angles would not be numbers", fix)
    heads, kv_heads = field(f"{arch}.attention.head_count"), field(f"{arch}.attention.head_count_kv")
    if kv_heads is None or heads is None:
        return
    layers = max(len(value) if isinstance(value, list) else 1 for value in (heads, kv_heads))
    per_layer = [(value if isinstance(value, list) else [value] * layers) for value in (heads, kv_heads)]
    if any(len(values) != layers for values in per_layer):
        return  # per-layer lists of other lengths: left to the block_count checks and transformers' reader
    for layer, (query, key_value) in enumerate(zip(*per_layer, strict=True)):
        if key_value <= 0 or query % key_value:
            where = f" in layer {layer}" if isinstance(heads, list) or isinstance(kv_heads, list) else ""
            raise ModelSourceError(
                f"the GGUF file {path} gives {key_value} key-value heads ({arch}.attention.head_count_kv) for "
                f"{query} attention heads ({arch}.attention.head_count){where}: each key-value head serves a whole "
                "group of query heads, so it is a number > 0 that divides the head count (llama.cpp refuses the "
                "file's key / value tensors)", fix)


def _check_context_length(path: Path, arch: str, field) -> None:
    """Refuse a GGUF file whose ``{arch}.context_length`` (llama.cpp's ``n_ctx_train``, read as
    max_position_embeddings) is 0 or negative: llama.cpp loads it but makes no context of it unless one is given
    ("n_ctx and model->hparams.n_ctx_train cannot both be zero", llama_init_from_model), and edgesdk bounds the
    bundle's context by it, so the model loaded and the build failed later naming a max_position_embeddings of 0
    and not the file's key."""
    context = field(f"{arch}.context_length")
    if not isinstance(context, int) or context > 0:
        return
    raise ModelSourceError(
        f"the GGUF file {path} gives {arch}.context_length {context}, where it is the number of positions the model "
        "was trained for, a whole number > 0: llama.cpp runs such a file only at a context given with --ctx-size, "
        "and edgesdk bounds the bundle's context (max_position_embeddings) by it",
        "set the model's trained context (its config.json's max_position_embeddings, e.g. 4096) in the file with "
        f"gguf-py's gguf-set-metadata (pip install gguf; it changes the file in place): gguf-set-metadata --force "
        f"{shlex.quote(str(path))} {arch}.context_length 4096, or build from the model's Hugging Face directory")


def _check_one_size_per_model(path: Path, arch: str, field) -> None:
    """Refuse a GGUF file that gives its head counts or FFN width one per layer (:data:`GGUF_PER_LAYER_KEYS`, a
    list llama.cpp's get_key_or_arr reads), naming the key and the values: transformers' GGUF reader, through
    which edgesdk loads GGUF files, put the list in the config, whose validation refused it ("expected int, got
    list"), reported as a damaged download; and edgesdk's decoders have one size for every layer. (A SmolLM3 file,
    which edgesdk reads itself, takes a list whose values are all the same: :func:`_smollm3_config`.)"""
    for key in GGUF_PER_LAYER_KEYS:
        values = field(f"{arch}.{key}")
        if not isinstance(values, list):
            continue
        if len(set(values)) > 1:
            raise ModelSourceError(
                f"the GGUF file {path} gives a different {arch}.{key} per layer ({values!r:.80}): edgesdk's "
                "decoders have the same attention heads and FFN width in every layer, so per-layer sizes (as "
                "OpenELM's files give them) are not supported",
                "use a model whose layers all have the same sizes (Llama, SmolLM2, Qwen2, Qwen3, Mistral, Phi-3, "
                "Gemma 3)")
        raise ModelSourceError(
            f"the GGUF file {path} gives {arch}.{key} as one value per layer ({values!r:.80})"
            + (", all the same," if values else "") + " where transformers' GGUF reader, through which edgesdk "
            "loads GGUF files, takes one value for the whole model: per-layer sizes are not supported (its config "
            "refuses a list)",
            f"convert the model again with llama.cpp's convert_hf_to_gguf.py (it writes {arch}.{key} as one number "
            "where every layer has the same), or build from its Hugging Face directory")


# the special tokens transformers' GGUF tokenizer looks up in tokenizer.ggml.tokens (its _SPECIAL_TOKENS)
GGUF_SPECIAL_TOKEN_KEYS = {"bos_token_id": "BOS", "eos_token_id": "EOS", "unknown_token_id": "unknown",
                           "padding_token_id": "padding"}
# gguf-py's gguf-new-metadata's names for them (--special-token-by-id)
GGUF_NEW_METADATA_TOKEN_NAMES = {"bos_token_id": "bos", "eos_token_id": "eos", "unknown_token_id": "unk",
                                 "padding_token_id": "pad"}


def _check_special_token_ids(path: Path, field) -> None:
    """Refuse a GGUF file whose BOS, EOS, unknown or padding token id is past its vocabulary
    (``tokenizer.ggml.tokens``), naming the key: transformers' GGUF tokenizer, through which edgesdk reads the
    vocabulary, looks each id up in the token list and failed with a bare "IndexError: list index out of range" (a
    padding id past the embedding failed the weights first, "Padding_idx must be within num_embeddings", reported as
    a damaged file). llama.cpp drops such an id ("bad special token: 'tokenizer.ggml.padding_token_id' = 4294967295,
    using default id -1", src/llama-vocab.cpp), as llama2.c's converted files write -1 as a uint32 for no token.
    An id that is no whole number (text, a float) is refused naming its type (:func:`_check_special_token_types`)."""
    _check_special_token_types(path, field)
    tokens = field("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return
    bad = [(key, value) for key in GGUF_SPECIAL_TOKEN_KEYS
           if isinstance(value := field(f"tokenizer.ggml.{key}"), int) and not 0 <= value < len(tokens)]
    if not bad:
        return
    named = ", ".join(f"{GGUF_SPECIAL_TOKEN_KEYS[key]} token {value} (tokenizer.ggml.{key})" for key, value in bad)
    removed = " ".join(f"--remove-metadata tokenizer.ggml.{key}" for key, _ in bad)
    raise ModelSourceError(
        f"the GGUF file {path} names the {named}, past its vocabulary of {len(tokens)} tokens "
        f"(tokenizer.ggml.tokens, ids 0 to {len(tokens) - 1}): llama.cpp ignores such an id, but transformers' "
        "GGUF tokenizer, through which edgesdk reads the vocabulary, cannot",
        f"write a copy without the key{'s' if len(bad) > 1 else ''} with gguf-py's gguf-new-metadata (pip install "
        f"gguf): gguf-new-metadata --force "
        f"{removed} {shlex.quote(str(path))} fixed.gguf, and pass fixed.gguf as the model")


def _check_special_token_types(path: Path, field) -> None:
    """Refuse a GGUF file whose BOS, EOS, unknown or padding token id is no whole number (text "1", a float 1.0),
    naming the key: llama.cpp reads a uint32 and refuses the file ("key tokenizer.ggml.bos_token_id has wrong
    type"); transformers' config validation failed ("expected int, got str"), reported as a damaged download."""
    for key in GGUF_SPECIAL_TOKEN_KEYS:
        value = field(f"tokenizer.ggml.{key}")
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        token_id = _whole_number(value)
        raise ModelSourceError(
            f"the GGUF file {path} gives tokenizer.ggml.{key} as {type(value).__name__} {value!r:.60}, where llama.cpp "
            "reads a token id (a whole number, uint32) and refuses the file (the key has the wrong type)",
            f"write a copy with the {GGUF_SPECIAL_TOKEN_KEYS[key]} token id as a number with gguf-py's "
            f"gguf-new-metadata (pip install gguf): gguf-new-metadata --force --special-token-by-id "
            f"{GGUF_NEW_METADATA_TOKEN_NAMES[key]} {token_id} {shlex.quote(str(path))} fixed.gguf, and pass "
            "fixed.gguf as the model")


def _whole_number(value) -> int | str:
    """``value`` (text or a float, as a GGUF key of the wrong type holds a token id) as the id it spells, else
    "ID"."""
    if isinstance(value, (str, float)):
        try:
            number = float(value)
        except ValueError:
            return "ID"
        if math.isfinite(number) and number.is_integer() and number >= 0:
            return int(number)
    return "ID"


def _check_unique_tokens(path: Path, field) -> None:
    """Refuse a GGUF file whose vocabulary (``tokenizer.ggml.tokens``) holds a token text twice, which llama.cpp does
    not load either (src/llama-vocab.cpp, llama_vocab::impl::load keys token_to_id by the text, after naming each
    empty token ``[EMPTY_<id>]``, and aborts on ``GGML_ASSERT(id_to_token.size() == token_to_id.size())``):
    transformers' GGUF tokenizer keys its vocabulary by the text, so it kept the last id of the two, the first was
    never made, and GPT-2's ``<|endoftext|>`` it adds took the id left over, one of the file's tokens."""
    tokens = field("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return
    first: dict[str, int] = {}
    for index, text in enumerate(tokens):
        text = text or f"[EMPTY_{index}]"
        if text in first:
            raise ModelSourceError(
                f"the GGUF file {path} holds the token {text!r:.80} twice in its vocabulary (tokenizer.ggml.tokens, "
                f"ids {first[text]} and {index}): llama.cpp stops loading such a file with 'GGML_ASSERT("
                "id_to_token.size() == token_to_id.size()) failed', and transformers' GGUF tokenizer, through which "
                "edgesdk reads it, keeps one id of the two, so text would become other ids than the model's own "
                "tokenizer makes",
                "convert the model again with llama.cpp's convert_hf_to_gguf.py, or build from its Hugging Face "
                "directory")
        first[text] = index


def _check_tensor_types(path: Path, reader) -> None:
    """Refuse a GGUF file holding tensors of a type gguf-py's ``quants.dequantize`` cannot read, before the weights
    load: transformers' reader (and :func:`_read_smollm3_gguf`) de-quantize every tensor with it, and it raises
    NotImplementedError for those (gguf 0.19: Q1_0, F64, the integer types), reported as a damaged file to download
    again. Each type is tried once, on one zero block."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES
    from gguf.quants import dequantize

    unread: dict[str, list[str]] = {}
    for kind in {tensor.tensor_type for tensor in reader.tensors}:
        _, size = GGML_QUANT_SIZES.get(kind, (1, 1))  # (block size, bytes per block)
        try:
            dequantize(np.zeros((1, size), dtype=np.uint8), kind)
        except NotImplementedError:
            unread[kind.name] = sorted(tensor.name for tensor in reader.tensors if tensor.tensor_type == kind)
    if unread:
        shown = "; ".join(f"{kind} ({len(names)} tensor(s): {', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
                          for kind, names in sorted(unread.items()))
        raise ModelSourceError(
            f"the GGUF file {path} holds tensors of a type the installed gguf package cannot de-quantize: {shown}; "
            "edgesdk reads GGUF weights through it (F32, F16, BF16, Q4_0 to Q8_0, the K-quants, the IQ types)",
            "use a file of the model quantized to a type gguf-py reads (e.g. Q8_0, Q4_K_M or F16: llama.cpp's "
            "llama-quantize converts between them), or build from the model's Hugging Face directory")


# llama.cpp's tensor names (gguf-py's MODEL_TENSORS for MODEL_ARCH.SMOLLM3, the converter's LlamaModel layout)
# -> SmolLM3ForCausalLM's parameter names, the per-layer ones under blk.N. / model.layers.N.
SMOLLM3_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                   "output.weight": "lm_head.weight"}
SMOLLM3_LAYER_TENSORS = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                         "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                         "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                         "ffn_down": "mlp.down_proj"}
# the marker of a config check_gguf_model read itself: transformers' GGUF reader has no mapping for the file
READ_BY_EDGESDK = "edgesdk_gguf_reader"


def _smollm3_hf_name(name: str, layers: int) -> str | None:
    """SmolLM3ForCausalLM's name for the GGUF tensor ``name``; None for a tensor llama.cpp's smollm3 does not read."""
    if name in SMOLLM3_TENSORS:
        return SMOLLM3_TENSORS[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and int(parts[1]) < layers \
            and parts[2] in SMOLLM3_LAYER_TENSORS and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{SMOLLM3_LAYER_TENSORS[parts[2]]}.weight"
    return None


def _smollm3_config(path: Path, field, reader, head_dim: dict) -> dict:
    """The SmolLM3Config values of a SmolLM3 GGUF file, read as llama.cpp reads it (``src/models/smollm3.cpp``,
    ``llama_model::load_hparams``): transformers' GGUF reader has no smollm3 mapping, so edgesdk reads the file
    itself (:func:`_read_smollm3_gguf`). The ``smollm3.*`` keys mean what transformers' llama mapping reads from
    ``llama.*`` (context_length, embedding_length, feed_forward_length, block_count, head counts, rms epsilon,
    rope.freq_base, 10,000 where absent as in llama.cpp); the head size is attention.key_length, else width / heads;
    the embedding is tied where the file has no output.weight. llama.cpp's smollm3 applies no rotary in layer ``il``
    where ``(il + 1) % 4 == 0`` (n_no_rope_layer_step 4, nothing read from the file): ``no_rope_layers`` says so.
    Refused: keys llama.cpp requires missing, per-layer sizes that differ, a rotary dimension count other than the
    head size (llama.cpp asserts n_rot == head size), tensors llama.cpp's smollm3 does not read (biases, a fused
    attn_qkv), and a vocabulary whose token count is not the embedding's."""
    def size(key: str, required: bool = True):
        value = field(f"smollm3.{key}")
        if isinstance(value, list):  # llama.cpp's get_key_or_arr: one value per layer
            if len(set(value)) > 1:
                raise ModelSourceError(
                    f"the GGUF file {path} gives a different smollm3.{key} per layer ({value}); edgesdk's SmolLM3 "
                    "decoder has one for every layer", "use a SmolLM3 file whose layers are all the same size")
            value = value[0] if value else None
        if value is None and required:
            raise ModelSourceError(f"the GGUF file {path} holds a SmolLM3 model (general.architecture smollm3) "
                                   f"without smollm3.{key}, which llama.cpp requires: a damaged or incompletely "
                                   "converted file",
                                   "convert the model again (llama.cpp's convert_hf_to_gguf.py) or build from its "
                                   "Hugging Face directory instead")
        return value

    layers, width = int(size("block_count")), int(size("embedding_length"))
    heads = int(size("attention.head_count"))
    if heads <= 0 or layers <= 0:
        raise ModelSourceError(f"the GGUF file {path} gives {layers} layers (smollm3.block_count) and {heads} attention "
                               "heads (smollm3.attention.head_count), where a SmolLM3 model has at least one of each",
                               "convert the model again (llama.cpp's convert_hf_to_gguf.py)")
    kv_heads = size("attention.head_count_kv", required=False)
    values = {
        "model_type": "smollm3", READ_BY_EDGESDK: True,
        "num_hidden_layers": layers, "hidden_size": width, "intermediate_size": int(size("feed_forward_length")),
        "num_attention_heads": heads, "num_key_value_heads": heads if kv_heads is None else int(kv_heads),
        "max_position_embeddings": int(size("context_length")),
        "rms_norm_eps": float(size("attention.layer_norm_rms_epsilon")),
        "head_dim": head_dim.get("head_dim") or width // heads,
        "no_rope_layers": [0 if (index + 1) % 4 == 0 else 1 for index in range(layers)],
        "use_sliding_window": False, "sliding_window": None, "attention_bias": False, "mlp_bias": False,
        "hidden_act": "silu",
    }
    dims = size("rope.dimension_count", required=False)
    if dims is not None and int(dims) != values["head_dim"]:
        raise ModelSourceError(
            f"the GGUF file {path} rotates {dims} of each head's {values['head_dim']} dimensions "
            "(smollm3.rope.dimension_count); llama.cpp's smollm3 requires the whole head (it asserts n_rot == head "
            "size) and refuses the file", f"use a file whose smollm3.rope.dimension_count is {values['head_dim']}")
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    unread = sorted(name for name in tensors if name != "rope_freqs.weight" and _smollm3_hf_name(name, layers) is None)
    if unread:
        raise ModelSourceError(
            f"the GGUF file {path} holds {len(unread)} tensor(s) llama.cpp's smollm3 does not read into the model "
            f"edgesdk builds: {', '.join(unread[:5])}{', ...' if len(unread) > 5 else ''} (SmolLM3's layers have "
            "separate attn_q / attn_k / attn_v and no biases)",
            "use a SmolLM3 file as llama.cpp's convert_hf_to_gguf.py writes it, or build from the model's Hugging "
            "Face directory instead")
    tokens = field("tokenizer.ggml.tokens")
    vocab = int(tensors["token_embd.weight"].shape[-1])  # gguf's shape is ggml's: {width, vocabulary}
    if tokens is not None and len(tokens) != vocab:
        raise ModelSourceError(
            f"the GGUF file {path} has {len(tokens)} tokens (tokenizer.ggml.tokens) for an embedding of {vocab} rows "
            "(token_embd.weight); llama.cpp refuses a file whose vocabulary and embedding differ",
            "convert the model again (llama.cpp's convert_hf_to_gguf.py)")
    values["vocab_size"] = vocab
    values["tie_word_embeddings"] = "output.weight" not in tensors
    for name, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
        token = field(f"tokenizer.ggml.{key}")
        values[name] = None if token is None else int(token)
    rope = _gguf_rope_overrides(path, "smollm3", field, reader, {"head_dim": values["head_dim"]})
    base = float(field("smollm3.rope.freq_base") or 10_000.0)  # llama.cpp's default where absent
    values["rope_parameters"] = rope.get("rope_parameters") or {"rope_type": "default", "rope_theta": base}
    return values


def unpermute_llama_cpp_rows(weights, heads: int):
    """The rows of a query or key weight put back from llama.cpp's pairwise rotary order: the inverse of
    convert_hf_to_gguf.py's ``LlamaModel.permute`` (which SmolLM3Model inherits), as transformers' llama GGUF reader
    undoes it (``LlamaTensorProcessor._reverse_permute_weights``). ``weights``: (rows, ...), a numpy array, rows a
    multiple of 2 * ``heads``; a LoRA's ``lora_b`` (rows, rank) as well as a weight."""
    return (weights.reshape(heads, weights.shape[0] // heads // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _read_smollm3_gguf(path: Path, config):
    """A float32 ``SmolLM3ForCausalLM`` of ``config`` (a SmolLM3Config of :func:`_smollm3_config`'s values) holding
    the SmolLM3 GGUF file's weights, de-quantized with gguf-py's ``quants.dequantize`` as transformers' GGUF reader does,
    the query / key rows put back in Hugging Face order; and the names of parameters the file lacks."""
    import numpy as np
    import torch
    from gguf.quants import dequantize
    from transformers import GenerationConfig, SmolLM3ForCausalLM
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3RotaryEmbedding

    with torch.device("meta"):  # no random weights: the file's tensors are assigned below
        model = SmolLM3ForCausalLM(config)
    expected = dict(model.state_dict())
    state = {}
    for tensor in gguf_reader(path).tensors:
        name = _smollm3_hf_name(tensor.name, config.num_hidden_layers)
        if name is None:
            continue
        weights = np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)  # a copy, writable
        if ".attn_q." in tensor.name or ".attn_k." in tensor.name:
            heads = config.num_attention_heads if ".attn_q." in tensor.name else config.num_key_value_heads
            weights = unpermute_llama_cpp_rows(weights, heads)
        if tuple(weights.shape) != tuple(expected[name].shape):
            raise ModelSourceError(
                f"the GGUF file {path} holds {tensor.name} of shape {tuple(weights.shape)}, where its smollm3.* sizes "
                f"make it {tuple(expected[name].shape)}: a damaged or wrongly converted file",
                "convert the model again (llama.cpp's convert_hf_to_gguf.py)")
        state[name] = torch.from_numpy(weights)
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = [name for name in missing if name != "lm_head.weight"]
    model.model.rotary_emb = SmolLM3RotaryEmbedding(config=config)  # its buffers are not weights: built here
    model.config.dtype = torch.float32  # as from_pretrained(dtype=torch.float32) records it
    model.generation_config = GenerationConfig.from_model_config(config)
    return model, missing


def _phi3_overrides(path: Path, field, tensors: set[str], head_dim: dict) -> dict:
    """What transformers' GGUF reader leaves out of a Phi-3 file, as llama.cpp's converter writes it
    (convert_hf_to_gguf.py's Phi3MiniModel): its sliding window (``phi3.attention.sliding_window``; 0 for none),
    taken so the export refuses a context longer than it. A file whose rotary covers part of each head
    (``phi3.rope.dimension_count`` below the head size: Phi-4-mini) or that holds longrope's factors
    (``rope_factors_long.weight`` / ``rope_factors_short.weight``: Phi-3.5, Phi-3-128k), which the reader drops, is
    refused: the model would load with plain RoPE over the whole head."""
    size = head_dim.get("head_dim")
    dims = field("phi3.rope.dimension_count")
    if size is not None and dims is not None and int(dims) != size:
        raise ModelSourceError(
            f"the GGUF file {path} rotates {dims} of each head's {size} dimensions (phi3.rope.dimension_count, a "
            "partial rotary factor below 1 as Phi-4-mini's); edgesdk computes Phi-3 as a Llama decoder, which rotates "
            "the whole head", "use a Phi-3 / Phi-3.5 model, whose rotary covers the whole head")
    factors = sorted(tensors & {"rope_factors_long.weight", "rope_factors_short.weight"})
    if factors:
        raise ModelSourceError(
            f"the GGUF file {path} holds longrope's rotary factors ({', '.join(factors)}), which transformers' GGUF "
            "reader, through which edgesdk loads GGUF files, does not read: the model would load with plain RoPE",
            "build from the model's Hugging Face directory instead (e.g. hf download microsoft/Phi-3.5-mini-instruct "
            "--local-dir Phi-3.5-mini-instruct, then edgesdk build --model Phi-3.5-mini-instruct)")
    window = field("phi3.attention.sliding_window")
    return {"sliding_window": int(window)} if window else {}


def _gguf_rope_overrides(path: Path, arch: str, field, reader, head_dim: dict) -> dict:
    """The rotary scaling of a file whose frequencies llama.cpp rescales, as the config values transformers
    computes it from: its GGUF reader drops both ways llama.cpp stores it (it reads rope scaling for gpt-oss
    only and has no mapping for ``rope_freqs.weight``), and the model would load with plain RoPE. llama.cpp's
    converter writes Llama 3's scaling (rope_type llama3) as the ``rope_freqs.weight`` tensor, which divides
    each frequency (``llama-model.cpp``, LLM_TENSOR_ROPE_FREQS), and linear / YaRN scaling as
    ``{arch}.rope.scaling.type`` with its factor (gguf.md; read as llama.cpp reads them, _gguf_linear_scaling).
    Linear scaling and factors that Llama 3's rule reproduces load; anything else (YaRN, other factors, both
    rope_freqs and a linear factor) is refused."""
    scaling, factor = _gguf_linear_scaling(arch, field)
    base = float(field(f"{arch}.rope.freq_base") or 10_000.0)
    freqs = next((tensor for tensor in reader.tensors if tensor.name == "rope_freqs.weight"), None)
    if scaling not in ("linear", "none"):
        what = f"{arch}.rope.scaling.type = {scaling!r} (factor {factor:g})"
    elif factor <= 0:
        what = f"a linear scaling factor ({arch}.rope.scaling.factor) of {factor:g}, where a factor is positive"
    elif freqs is not None and factor != 1:
        what = (f"a rope_freqs.weight tensor and a linear scaling factor of {factor:g} (llama.cpp applies both; "
                "transformers' rope types give one of them)")
    elif freqs is not None:
        import numpy as np

        from edgesdk.export.gguf_export import ROPE_FREQS_ARCHITECTURES

        factors = np.asarray(freqs.data, dtype=np.float64).reshape(-1)
        size = head_dim.get("head_dim")
        dims = int(field(f"{arch}.rope.dimension_count") or size or 2 * factors.size)
        if arch not in ROPE_FREQS_ARCHITECTURES:
            raise ModelSourceError(
                f"the GGUF file {path} holds a rope_freqs.weight tensor (Llama 3's rope scaling), which llama.cpp's "
                f"{arch} architecture does not read (only {', '.join(sorted(ROPE_FREQS_ARCHITECTURES))} do; "
                "llama.cpp refuses the file): what it computes is not defined",
                "build from the model's Hugging Face directory instead, or use a GGUF file without rope_freqs.weight")
        if size is not None and dims != size:
            raise ModelSourceError(
                f"the GGUF file {path} rotates {dims} of each head's {size} dimensions ({arch}.rope.dimension_count)"
                " and scales them with rope_freqs.weight; llama.cpp's llama refuses a rotary dimension count other "
                "than the head size, and edgesdk's graphs rotate the whole head",
                f"use a file whose {arch}.rope.dimension_count is the head size ({size})")
        bad = int(np.count_nonzero(~np.isfinite(factors)))
        if factors.size != dims // 2 or bad:
            raise ModelSourceError(
                f"the GGUF file {path} holds a rope_freqs.weight tensor of {factors.size} values"
                + (f", {bad} of them not finite (NaN or infinity)" if bad else
                   f", where its {dims} rotary dimensions ({arch}.rope.dimension_count) take {dims // 2}")
                + ": a damaged or wrongly converted file",
                "convert the model again (llama.cpp's convert_hf_to_gguf.py) or build from its Hugging Face "
                "directory instead")
        fitted = llama3_rope_parameters(factors, base, dims)
        if fitted is not None:  # {}: every factor 1, plain RoPE, whose base the config read from rope.freq_base
            return {"rope_parameters": fitted} if fitted else {}
        what = (f"a rope_freqs.weight tensor whose {factors.size} factors ({factors.min():.4g} to "
                f"{factors.max():.4g}) no Llama 3 rope scaling gives")
    elif factor != 1:
        return {"rope_parameters": {"rope_type": "linear", "rope_theta": base, "factor": factor}}
    else:
        return {}
    raise ModelSourceError(
        f"the GGUF file {path} rescales its rotary frequencies with {what}, which edgesdk cannot compute as "
        "llama.cpp does (it loads Llama 3's and linear scaling)",
        "build from the model's Hugging Face directory instead: its config.json carries the rope scaling "
        "(llama3, linear, yarn), which the build exports")


def _gguf_linear_scaling(arch: str, field) -> tuple[str, float]:
    """(scaling type, factor) as llama.cpp's loader reads them (``llama-model.cpp``, load_hparams): the type
    defaults to linear, the factor is ``{arch}.rope.scaling.factor``, else the older ``{arch}.rope.scale_linear``,
    and 0 or absent means 1; type none scales by 1 whatever the factor (``llama-context.cpp``). So a file with a
    factor and no type (as older converters wrote linear scaling) is linearly scaled."""
    scaling = field(f"{arch}.rope.scaling.type")
    scaling = "linear" if scaling is None else str(scaling)
    factor = field(f"{arch}.rope.scaling.factor")
    if factor is None:
        factor = field(f"{arch}.rope.scale_linear")
    factor = float(factor or 0.0)
    return scaling, 1.0 if factor == 0 or scaling == "none" else factor


def llama3_rope_parameters(factors, base: float, dims: int) -> dict | None:
    """transformers' ``rope_parameters`` of rope_type llama3 (Meta's scaling, ``_compute_llama3_parameters``)
    whose frequency divisors are ``factors`` (llama.cpp's rope_freqs, (dims/2,)), or None where that rule
    gives other divisors. The largest divisor is the factor. In the band between, the divisor is
    1 / ((1 - s) / factor + s) with s linear in original_max_position_embeddings / wavelength, so only two
    combinations of the three band settings show in the divisors: low_freq_factor is taken as 1 (Meta's),
    and the other two follow from a least-squares line through the band."""
    import numpy as np

    wavelength = 2 * np.pi * base ** (np.arange(0, dims, 2) / dims)  # (dims/2,)
    if factors.shape != wavelength.shape or not np.isfinite(factors).all() or factors.min() < 1 - 1e-6:
        return None
    factor = float(factors.max())
    if abs(factor - round(factor, 3)) < 1e-5 * factor:  # a config's 8 or 32, not float32's 8.000001
        factor = round(factor, 3)
    if factor < 1 + 1e-6:
        return {}  # every divisor 1: plain RoPE
    band = (factors > 1 + 1e-5) & (factors < factor * (1 - 1e-5))
    candidates = []
    smooth = (1 / factors[band] - 1 / factor) / (1 - 1 / factor)  # s in (0, 1) inside the band
    if band.sum() >= 2:
        slope, intercept = np.polyfit(1 / wavelength[band], smooth, 1)  # s = slope / wavelength + intercept
        if intercept < 0:
            high = 1 - 1 / intercept  # intercept = -low / (high - low), low = 1
            context = round(float(slope * (high - 1)))
            candidates += [(round(float(high), 3), context), (float(high), context)]  # a config's 4, or as fitted
    if band.any():  # Meta's high_freq_factor 4, the context from the band's first divisor
        candidates.append((4.0, round(float(wavelength[band][0] * (1 + 3 * smooth[0])))))
    candidates += [(4.0, context) for context in (8192, 4096, 2048, 16384, 32768, 65536, 131072)]
    for high, context in candidates:
        params = {"rope_type": "llama3", "rope_theta": base, "factor": factor, "low_freq_factor": 1.0,
                  "high_freq_factor": float(high), "original_max_position_embeddings": int(context)}
        if context > 0 and np.allclose(llama3_divisors(params, wavelength), factors, rtol=1e-4, atol=0):
            return params
    return None


def llama3_divisors(params: dict, wavelength):
    """The frequency divisors of Llama 3's scaling at each ``wavelength`` (transformers'
    ``_compute_llama3_parameters``, llama.cpp's converter)."""
    import numpy as np

    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    context = params["original_max_position_embeddings"]
    smooth = np.clip((context / wavelength - low) / (high - low), 0.0, 1.0)
    return 1 / ((1 - smooth) / factor + smooth)


def _gemma3_overrides(path: Path, field, head_dim: dict) -> dict:
    """Config values a Gemma 3 GGUF fixes the way llama.cpp reads it (``llama-model.cpp``, LLM_ARCH_GEMMA3) where
    transformers' GGUF reader takes its config class's defaults: the softmax scale 1/sqrt(head size), or
    1/sqrt(width / heads) for the 27B's 62 layers (transformers' default query_pre_attn_scalar is 256 whatever
    the head size), and the linear rotary scaling of Gemma 3 4B and up (:func:`_gemma3_rope_overrides`). Every
    sixth layer global and a local rotary base of 10,000 are transformers' defaults too. A file whose logits are
    soft-capped is refused: the graphs do not compute it."""
    for key, what in (("gemma3.final_logit_softcapping", "soft-caps its logits"),
                      ("gemma3.attn_logit_softcapping", "soft-caps its attention logits")):
        value = field(key)
        if value is not None and value not in ("none", 0, 0.0):
            raise ModelSourceError(f"the GGUF file {path} holds a Gemma 3 model that {what} ({key} = {value!r}), "
                                   "which edgesdk's graphs do not compute",
                                   "use a Gemma 3 file converted by llama.cpp's convert_hf_to_gguf.py, which "
                                   "writes no soft-capping for Gemma 3")
    rope = _gemma3_rope_overrides(path, field)
    from edgesdk.export.gguf_export import gemma3_query_scalar

    layers, width, heads = field("gemma3.block_count"), field("gemma3.embedding_length"), \
        field("gemma3.attention.head_count")
    if "head_dim" not in head_dim or not isinstance(heads, int) or heads <= 0:
        return {**head_dim, **rope}  # too little to tell: transformers' reader, and then the build's checks, decide
    scalar = gemma3_query_scalar(int(layers), int(width), heads, head_dim["head_dim"])
    return {**head_dim, **rope, "query_pre_attn_scalar": int(scalar) if scalar.is_integer() else scalar}


def _gemma3_rope_overrides(path: Path, field) -> dict:
    """transformers' per-attention-kind ``rope_parameters`` for a Gemma 3 file whose rotary positions are linearly
    scaled (``gemma3.rope.scaling.type`` linear with its factor, Gemma 3 4B and up): llama.cpp scales the global
    layers only, at ``gemma3.rope.freq_base``, and keeps the sliding layers at scale 1 and base 10,000
    (``rope_freq_scale_train_swa``), which transformers' Gemma3TextConfig computes from rope_parameters'
    full_attention and sliding_attention entries; its GGUF reader drops the scaling, and the model would load
    unscaled. A file without ``gemma3.rope.freq_base`` gets llama.cpp's base of 10,000 for the global layers
    (``load_hparams``: "rope_freq_base (optional)", 10000.0f), where Gemma3TextConfig's default is 1,000,000. {} where
    the file gives its base and does not scale; any scaling but linear is refused."""
    from edgesdk.export.gguf_export import GEMMA3_LOCAL_ROPE_BASE

    scaling, factor = _gguf_linear_scaling("gemma3", field)
    if scaling not in ("linear", "none") or factor <= 0:
        raise ModelSourceError(
            f"the GGUF file {path} holds a Gemma 3 model whose rotary positions are scaled with "
            f"gemma3.rope.scaling.type = {scaling!r} (factor {factor:g}), which edgesdk cannot load as llama.cpp "
            "computes it (it loads linear scaling by a positive factor, as Gemma 3 4B and up have)",
            "build from the model's Hugging Face directory instead: its config.json carries the rope scaling, "
            "which the build exports")
    written = field("gemma3.rope.freq_base")
    if factor == 1 and written is not None:
        return {}
    base = float(written or 10_000.0)  # llama.cpp's default where the file has none
    full = ({"rope_type": "linear", "rope_theta": base, "factor": factor} if factor != 1 else
            {"rope_type": "default", "rope_theta": base})
    return {"rope_parameters": {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_ROPE_BASE}}}


def _gguf_head_dim(path: Path, arch: str, field) -> dict:
    """``{"head_dim": n}`` as llama.cpp's loader takes it: ``{arch}.attention.key_length`` (and
    ``value_length``), each defaulting to the width over the head count; {} where the file gives too
    little to tell. A key size apart from the value size is refused: the decoders edgesdk builds (and
    transformers') have one head size for both."""
    heads, width = field(f"{arch}.attention.head_count"), field(f"{arch}.embedding_length")
    default = int(width) // int(heads) if isinstance(heads, int) and heads > 0 and int(width) % heads == 0 else None
    sizes = {}
    for kind in ("key", "value"):
        size = field(f"{arch}.attention.{kind}_length")
        sizes[kind] = default if size is None else int(size)
    if sizes["key"] != sizes["value"] and None not in sizes.values():
        raise ModelSourceError(
            f"the GGUF file {path} has a key head size of {sizes['key']} and a value head size of "
            f"{sizes['value']} ({arch}.attention.key_length / value_length, width / heads where absent); "
            "edgesdk's decoders have one head size for both",
            "use a model whose query / key and value heads are the same size")
    size = sizes["key"] if sizes["key"] is not None else sizes["value"]
    return {} if size is None else {"head_dim": size}


# the per-layer bias tensors transformers' GGUF reader loads, per architecture (Qwen2's q/k/v biases); it drops any
# other bias without a word
GGUF_READ_BIASES = {"qwen2": ("attn_q", "attn_k", "attn_v")}


def _check_tensors_read(path: Path, arch: str, field, tensors: set[str]) -> None:
    """Refuse per-layer tensors transformers' GGUF reader leaves out without a word: layers past
    ``{arch}.block_count``, and biases its config for ``arch`` has no place for (all but Qwen2's q/k/v biases).
    llama.cpp applies what it reads (its llama adds the optional attn_q / attn_k / attn_v / attn_output and FFN
    biases where a file holds them, TENSOR_NOT_REQUIRED) and refuses a file holding tensors it does not read
    (``llama_model_loader::done_getting_tensors``: "wrong number of tensors"), so the model loaded without them
    would answer otherwise."""
    layers, kept = int(field(f"{arch}.block_count")), GGUF_READ_BIASES.get(arch, ())
    dropped = []
    for name in tensors:
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "blk" and parts[1].isdigit() \
                and (int(parts[1]) >= layers or (parts[-1] == "bias" and parts[2] not in kept)):
            dropped.append(name)
    if dropped:
        dropped.sort(key=lambda name: (int(name.split(".")[1]), name))
        raise ModelSourceError(
            f"the GGUF file {path} holds {len(dropped)} tensor(s) that transformers' GGUF reader, through which "
            f"edgesdk loads GGUF files, drops without a word: {', '.join(dropped[:5])}"
            + (", ..." if len(dropped) > 5 else "")
            + f" ({arch}.block_count is {layers}; a {arch} model "
            + (f"has biases on {', '.join(kept)} only" if kept else "has no biases") + "); llama.cpp applies such "
            "biases or refuses the file, so the model loaded without them would answer otherwise",
            "convert the model again with llama.cpp's convert_hf_to_gguf.py, or build from its Hugging Face "
            "directory")


def _check_whole_head_rotary(path: Path, arch: str, field, head_dim: dict) -> None:
    """Refuse a file whose ``{arch}.rope.dimension_count`` (llama.cpp's ``n_rot``, the head size where absent) is
    not the head size: llama.cpp's ``load_hparams`` refuses such a llama file ("invalid n_rot: %u, expected %u"),
    and its qwen2 / qwen3 graphs rotate only the first ``n_rot`` dimensions of each head, where the
    config edgesdk loads (head_dim, the key size) and its graphs rotate the whole head: the answers would differ."""
    size, dims = head_dim.get("head_dim"), field(f"{arch}.rope.dimension_count")
    if size is None or dims is None or int(dims) == size:
        return
    what = ("llama.cpp refuses the file (invalid n_rot)" if arch == "llama" else
            f"llama.cpp's {arch} rotates only those, and edgesdk's graphs rotate the whole head")
    raise ModelSourceError(
        f"the GGUF file {path} rotates {dims} of each head's {size} dimensions ({arch}.rope.dimension_count "
        f"{dims}, head size {size} from {arch}.attention.key_length or width / heads): {what}",
        f"use a file whose {arch}.rope.dimension_count is the head size ({size}), e.g. convert the model again "
        "with llama.cpp's convert_hf_to_gguf.py, or build from its Hugging Face directory")


# tokenizer.ggml.pre values llama.cpp reads as LLAMA_VOCAB_PRE_TYPE_LLAMA3 (src/llama-vocab.cpp,
# llama_vocab::impl::load), whose vocabulary adds a BOS token where the file has no tokenizer.ggml.add_bos_token
# (add_bos = true) and ignores the merges for a pre-token the vocabulary holds whole (ignore_merges = true)
LLAMA3_PRE_TOKENIZERS = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                         "jina-v5-nano")
# the BPE pre-tokenizers llama.cpp sets add_bos = true for: the Llama 3 ones, Mistral's tekken (Mistral Nemo) and
# chameleon
BOS_BY_DEFAULT_PRE_TOKENIZERS = (*LLAMA3_PRE_TOKENIZERS, "tekken", "chameleon")
# the BPE pre-tokenizers llama.cpp sets ignore_merges = true for (llm_tokenizer_bpe_session::tokenize: a pre-token
# the vocabulary holds whole is that one token, whatever the merges make of it)
IGNORE_MERGES_PRE_TOKENIZERS = (*LLAMA3_PRE_TOKENIZERS, "tekken", "minicpm5")

# The regexes llama.cpp splits a BPE vocabulary's text with before its merges, per tokenizer.ggml.pre
# (src/llama-vocab.cpp: the name -> LLAMA_VOCAB_PRE_TYPE_* table in llama_vocab::impl::load, then
# llm_tokenizer_bpe's regex_exprs per type), each regex splitting the pieces of the one before, its matches kept
# (a tokenizers Split, behavior "isolated"). They are the regexes of the models' own tokenizer.json, written here
# as there (llama.cpp's comments give them as "original regex from tokenizer.json"; its adapted forms spell
# (?i:'s|...) as '[sS]|... for std::regex).
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA3_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
QWEN2_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
_CASED_WORDS = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+{s}"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*{s}")
_GPT4O_SPLIT = (_CASED_WORDS.replace("{s}", f"{_CONTRACTIONS}?")
                + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_BLOOM_WORDS = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"
BPE_PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    # LLAMA_VOCAB_PRE_TYPE_GPT2, MPT, OLMO, JAIS, TRILLION, GRANITE_DOCLING: GPT-2's own regex
    **dict.fromkeys(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
                     "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4", "mpt", "olmo",
                     "jais", "trillion", "granite-docling"), (GPT2_SPLIT,)),
    # LLAMA3, and DBRX, SMAUG, CHATGLM4 with the same regex
    **dict.fromkeys((*LLAMA3_PRE_TOKENIZERS, "dbrx", "smaug-bpe", "glm4", "chatglm-bpe"), (LLAMA3_SPLIT,)),
    "jais-2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
               r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    # STARCODER, REFACT, COMMAND_R, SMOLLM, CODESHELL, EXAONE, MINERVA, MELLUM2: every digit alone, then GPT-2's
    # (their tokenizer.json: Digits with individual_digits, then ByteLevel with its GPT-2 regex)
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
                    (r"\p{N}", GPT2_SPLIT)),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2_SPLIT, r"[0-9][0-9][0-9]"),
    # QWEN2, STABLELM2, HUNYUAN, SOLAR_OPEN, and GROK_2 with the same regex
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open",
                     "grok-2"), (QWEN2_SPLIT,)),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    # DEFAULT (named "default"; llama.cpp also takes it for a file without the key, with a warning)
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]"),
    # PORO, BLOOM, GPT3_FINNISH; VIKING adds every digit alone
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), (_BLOOM_WORDS,)),
    "viking": (_BLOOM_WORDS, r"\p{N}"),
    "tekken": (_CASED_WORDS.replace("{s}", "")
               + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    # GPT4O, MINIMAX_M2
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), (_GPT4O_SPLIT,)),
    # TINY_AYA (Cohere's Tiny Aya, cohere2moe): digits in groups of three from the right, then GPT-4o's regex
    **dict.fromkeys(("tiny_aya", "cohere2moe"), (r"\d{1,3}(?=(?:\d{3})*\b)", _GPT4O_SPLIT)),
    # BAILINGMOE (Ling): tokenizer.json's regex, whose possessive ?+ and ++ llama.cpp writes greedy (the same
    # matches: what follows them never needs what they took back)
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"),
                    (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]"
                     r"|\s+(?!\S)|\s+",)),
    # EXAONE_MOE: a word runs on over single spaces between letters
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
}


def _bpe_pre_tokenizer(path: Path) -> tuple[str, str | None] | None:
    """``(tokenizer.ggml.pre, the reason it is refused or None)`` of a GGUF file with a BPE vocabulary
    (``tokenizer.ggml.model`` gpt2); None for another vocabulary. A file without the key (or with it empty) is
    read as "default", as llama.cpp reads it (src/llama-vocab.cpp, llama_vocab::impl::load: "missing
    pre-tokenizer type, using: 'default'", LLAMA_VOCAB_PRE_TYPE_DEFAULT), where transformers' GGUF tokenizer
    split it with GPT-2's regex alone."""
    if _gguf_value(path, "tokenizer.ggml.model") != "gpt2":
        return None
    pre = _gguf_value(path, "tokenizer.ggml.pre")
    if pre is None or pre == "":
        return "default", None
    if not isinstance(pre, str):
        return None
    if pre in BPE_PRE_TOKENIZER_SPLITS:
        return pre, None
    return pre, ("llama.cpp does not know it (unknown pre-tokenizer type)" if pre not in LLAMA_CPP_PRE_TOKENIZERS
                 else "its llama.cpp pre-tokenizer is not one edgesdk can rebuild exactly as a tokenizers "
                      "pre-tokenizer (custom code or long literal character classes)")


# the other tokenizer.ggml.pre values llama.cpp knows (llama_vocab::impl::load), whose splits edgesdk does not rebuild
LLAMA_CPP_PRE_TOKENIZERS = frozenset((
    *BPE_PRE_TOKENIZER_SPLITS, "deepseek-llm", "deepseek-v3", "spark2_5", "youtu", "gemma4",
    "granite-embed-multi-311m", "sarvam-moe", "whitespace", "chameleon", "granite-embed-multi-97m",
    "superbpe", "hunyuan-dense", "hy_v4",
    "joyai-llm", "kimi-k2", "afmoe", "laguna"))


def _check_bpe_pre_tokenizer(path: Path) -> None:
    """Refuse a GGUF file whose BPE pre-tokenizer (``tokenizer.ggml.pre``) edgesdk cannot split text as llama.cpp
    does (:data:`BPE_PRE_TOKENIZER_SPLITS` holds those it can): transformers' GGUF tokenizer splits any type it
    does not map with GPT-2's regex, so the text would become other token ids than llama.cpp's and the model's own
    tokenizer make, without a word."""
    found = _bpe_pre_tokenizer(path)
    if found is None or found[1] is None:
        return
    pre, why = found
    raise ModelSourceError(
        f"the GGUF file {path} has a BPE vocabulary with the pre-tokenizer {pre!r:.60} (tokenizer.ggml.pre): {why}; "
        "transformers' GGUF tokenizer, through which edgesdk reads it, would split the text with GPT-2's regex "
        "instead and so make other token ids than llama.cpp and the model's own tokenizer.json",
        "build from the model's Hugging Face directory (its tokenizer.json has the model's own pre-tokenizer), "
        "e.g. hf download ORG/NAME --local-dir NAME, then edgesdk build --model NAME")


def _set_bpe_pre_tokenizer(tokenizer, path: Path) -> None:
    """Give the fast ``tokenizer`` read from the GGUF file at ``path`` llama.cpp's pre-tokenizer for its
    ``tokenizer.ggml.pre``: the regexes of :data:`BPE_PRE_TOKENIZER_SPLITS` as tokenizers ``Split`` steps
    (isolated), then the byte-level mapping (``ByteLevel`` without its own regex), as the models' tokenizer.json
    and transformers' GGUF tokenizer for the Llama 3 and Qwen2 types have it. Where the last regex is GPT-2's,
    ``ByteLevel`` applies it itself (use_regex), and ``\\p{N}`` alone is ``Digits`` with individual_digits (Rust's
    char::is_numeric: the N categories), as those tokenizer.json files (StarCoder, SmolLM) write them: the
    bundle's tokenizer.json is then SmolLM2's own, which edgesdk's GGUF export names "smollm" again."""
    from tokenizers import Regex, pre_tokenizers

    found = _bpe_pre_tokenizer(path)
    if found is None or found[1] is not None:
        return
    if not _gguf_value(path, "tokenizer.ggml.pre"):  # llama.cpp warns too ("GENERATION QUALITY WILL BE DEGRADED!")
        warnings.warn(f"the GGUF file {path} has a BPE vocabulary without tokenizer.ggml.pre: its text is split "
                      "with llama.cpp's 'default' pre-tokenizer regexes, as llama.cpp does for such a file, which may "
                      "not be how the model was trained to split it; convert the model again with llama.cpp's "
                      "convert_hf_to_gguf.py (it writes the key), or build from its Hugging Face directory",
                      stacklevel=3)
    regexes = BPE_PRE_TOKENIZER_SPLITS[found[0]]
    gpt2_last = regexes[-1] == GPT2_SPLIT
    steps = [pre_tokenizers.Digits(individual_digits=True) if regex == r"\p{N}"
             else pre_tokenizers.Split(Regex(regex), behavior="isolated")
             for regex in regexes[:-1 if gpt2_last else None]]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=gpt2_last))
    tokenizer.backend_tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


def _drop_tokens_the_file_lacks(tokenizer, path: Path) -> None:
    """Take out of the fast ``tokenizer`` read from the GGUF file at ``path`` the added tokens the file's vocabulary
    (``tokenizer.ggml.tokens``) does not hold at their id: transformers' GGUF tokenizer builds a byte-level
    vocabulary as a GPT2Tokenizer, whose default special token ``<|endoftext|>`` it appends as one more id where the
    file has no such token (Llama 3's, Mistral Nemo's, GPT-4o-style vocabularies). That id is past the model's
    embedding: a text holding "<|endoftext|>" became it (an index error, or garbage, in the model), and the bundle's
    tokenizer.json held a token the GGUF export refuses. Where the file has empty tokens (which llama.cpp names
    ``[EMPTY_<id>]``), the vocabulary keyed by text holds fewer ids than the file, and that id was one of the
    file's, so the text became another token of the model. llama.cpp knows only the file's tokens and tokenizes
    that text as any other."""
    tokens = _gguf_value(path, "tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return
    backend = tokenizer.backend_tokenizer
    spec = json.loads(backend.to_str())
    kept = [added for added in spec.get("added_tokens", [])
            if added["id"] < len(tokens) and tokens[added["id"]] == added["content"]]
    if len(kept) == len(spec.get("added_tokens", [])):
        return
    from tokenizers import Tokenizer

    spec["added_tokens"] = kept
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))


# tokenizer.ggml.token_type values (gguf-py's TokenType, llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL_TOKEN, UNKNOWN_TOKEN, CONTROL_TOKEN, USER_DEFINED_TOKEN = 1, 2, 3, 4


def _key_added_tokens_by_their_text(tokenizer, path: Path) -> None:
    """Give the fast ``tokenizer`` read from the GGUF file at ``path`` the control and user-defined tokens of its
    byte-level vocabulary (``tokenizer.ggml.model`` gpt2) that are written in characters outside GPT-2's byte
    alphabet, as llama.cpp has them: each its one id, matched whole in the text (special for a control token).
    llama.cpp's converter writes such tokens as their text (convert_hf_to_gguf.py, ``get_vocab_base``: "the
    tokenizer in llama.cpp assumes the CONTROL and USER_DEFINED tokens are pre-normalized"), and llama.cpp
    matches that text (src/llama-vocab.cpp: ``token_to_id``, ``cache_special_tokens``). transformers' GGUF
    tokenizer keys them by the byte-level spelling of their text instead and leaves them out of its added tokens
    (taking them for mislabelled), so DeepSeek-R1-Distill's ``<｜begin▁of▁sentence｜>``, ``<｜User｜>``,
    ``<｜Assistant｜>`` were cut into byte pieces, and a BOS or EOS among them got an id past the vocabulary (the
    tokenizer's own, then dropped): the prompt began with a token the model does not have."""
    from tokenizers import Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens, types = _gguf_value(path, "tokenizer.ggml.tokens"), _gguf_value(path, "tokenizer.ggml.token_type")
    if _gguf_value(path, "tokenizer.ggml.model") != "gpt2" or not isinstance(tokens, list) \
            or not isinstance(types, list) or len(types) != len(tokens):
        return
    alphabet = set(bytes_to_unicode().values())
    spelled = {index: text for index, (text, kind) in enumerate(zip(tokens, types, strict=True))
               if kind in (CONTROL_TOKEN, USER_DEFINED_TOKEN) and isinstance(text, str) and text
               and not set(text) <= alphabet}
    if not spelled:
        return
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    key_of = {index: key for key, index in vocab.items()}
    texts = set(spelled.values())
    added = [token for token in spec.get("added_tokens", []) if token["content"] not in texts]
    for index, text in spelled.items():
        if key_of.get(index) not in (None, text):
            del vocab[key_of[index]]
        vocab[text] = index
        added.append({"id": index, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": types[index] == CONTROL_TOKEN})
    spec["added_tokens"] = sorted(added, key=lambda token: token["id"])
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))
    if hasattr(tokenizer, "update_post_processor"):  # the BOS / EOS the post-processor adds, by their ids now
        tokenizer.update_post_processor()


def _set_spm_space_prefix(tokenizer, path: Path) -> None:
    """Give the fast ``tokenizer`` read from the GGUF file at ``path`` llama.cpp's handling of the space in front of
    a SentencePiece (``tokenizer.ggml.model`` llama) text. llama.cpp (src/llama-vocab.cpp, ``tokenize``, the
    LLAMA_VOCAB_TYPE_SPM case: "prefix with space if previous is special") puts a space in front of every run of
    text that begins the input or follows a special token, whatever the text begins with, where
    ``tokenizer.ggml.add_space_prefix`` is true or absent (its default for SPM), and never where it is false.
    transformers' GGUF tokenizer builds a Metaspace pre-tokenizer (prepend_scheme "first") instead, which puts
    none before a text that already begins with a space, none after a special token (Llama 2's ``<s>[INST]``,
    Mistral's ``[INST]``, TinyLlama's ``</s>\n<|assistant|>``) and one where the file says false: other ids than
    llama.cpp's and the model's own tokenizer (Llama 2's tokenizer.json: a Prepend and Replace normalizer, the
    form this builds). The decoder takes the leading space off only where one was put in (llama.cpp's
    ``remove_space = add_space_prefix``). A Phi-3 file's tokenizer has that form already, its Prepend dropped
    where the file says false as well."""
    from tokenizers import Tokenizer

    if _gguf_value(path, "tokenizer.ggml.model") != "llama":
        return
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    pre, normalizer = spec.get("pre_tokenizer") or {}, spec.get("normalizer")
    if pre.get("type") == "Metaspace" and normalizer is None:
        space = pre.get("replacement", "\u2581")
    elif _spm_prepend(normalizer) is not None:  # Phi-3's: transformers builds it without reading the key
        space = _spm_prepend(normalizer)
    else:
        return  # Gemma's (no prefix, as its files say) is llama.cpp's
    prefix = _gguf_value(path, "tokenizer.ggml.add_space_prefix") is not False
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": space}
    spec["normalizer"] = ({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": space}, replace]}
                          if prefix else replace)
    spec["pre_tokenizer"] = None
    decoder = spec.get("decoder") or {}
    if not prefix and decoder.get("type") == "Sequence":
        decoder["decoders"] = [step for step in decoder["decoders"] if step.get("type") != "Strip"]
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))


def _spm_prepend(normalizer: dict | None) -> str | None:
    """The character a SentencePiece ``normalizer`` (a tokenizer.json spec) puts in front of the text and for each
    space where it is a Prepend then a Replace of " ", as Llama 2's and Phi-3's tokenizer.json have it; else None."""
    steps = (normalizer or {}).get("normalizers") if (normalizer or {}).get("type") == "Sequence" else None
    if not steps or len(steps) != 2 or steps[0].get("type") != "Prepend" or steps[1].get("type") != "Replace" \
            or steps[1].get("pattern") != {"String": " "} or steps[1].get("content") != steps[0].get("prepend"):
        return None
    return steps[0].get("prepend")


# general.name fragments for which llama.cpp strips the whitespace after special tokens, and the tokens it exempts
PHI3_NAMES, PHI3_UNSTRIPPED = ("phi-3", "phi3"), ("<unk>", "<s>", "<|endoftext|>")


def phi3_rstrip_tokens(name, tokens, types) -> set[str] | None:
    """The texts of the tokens llama.cpp gives LLAMA_TOKEN_ATTR_RSTRIP (takes the whitespace after them into them)
    for a GGUF file whose ``general.name`` is ``name``, vocabulary ``tokens`` and ``tokenizer.ggml.token_type``
    ``types``; None where it gives none. src/llama-vocab.cpp (llama_vocab::impl::load, "set attributes by
    model/tokenizer/architecture name"): where the name, lowercased (ASCII, std::tolower), contains "phi-3" or
    "phi3", every token of ``cache_special_tokens`` (types UNKNOWN, CONTROL, USER_DEFINED) and ``</s>`` get RSTRIP,
    then ``<unk>``, ``<s>``, ``<|endoftext|>`` lose it; tokenizer_st_partition, which matches the tokens of
    ``cache_special_tokens`` only (so a ``</s>`` of another type strips nothing), then drops the spaces, tabs and
    line breaks after such a token. Microsoft's tokenizer.json for Phi-3 marks the same added tokens ``rstrip``."""
    if not isinstance(name, str) or not any(part in name.encode().lower().decode() for part in PHI3_NAMES):
        return None
    kinds = types if isinstance(types, list) and len(types) == len(tokens) else [NORMAL_TOKEN] * len(tokens)
    special = {text for text, kind in zip(tokens, kinds, strict=True)
               if kind in (UNKNOWN_TOKEN, CONTROL_TOKEN, USER_DEFINED_TOKEN) and isinstance(text, str)}
    return special - set(PHI3_UNSTRIPPED)


def _strip_after_phi3_special_tokens(tokenizer, path: Path) -> None:
    """Give the fast ``tokenizer`` read from the GGUF file at ``path`` the ``rstrip`` llama.cpp gives the special
    tokens of a Phi-3 file by its ``general.name`` (:func:`phi3_rstrip_tokens`), which no GGUF key holds and
    transformers' GGUF tokenizer leaves out: a chat prompt's "<|user|>\nhi<|end|>\n<|assistant|>\n" kept its line
    breaks, which llama.cpp (and the model's own tokenizer.json) drop, so the next word lost its leading space
    (U+2581) and the prompt had other ids than llama.cpp's."""
    from tokenizers import Tokenizer

    tokens = _gguf_value(path, "tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return
    stripped = phi3_rstrip_tokens(_gguf_value(path, "general.name"), tokens,
                                  _gguf_value(path, "tokenizer.ggml.token_type"))
    if stripped is None:
        return
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    added = spec.get("added_tokens", [])
    if all(token.get("rstrip", False) == (token["content"] in stripped) for token in added):
        return
    for token in added:
        token["rstrip"] = token["content"] in stripped
    tokenizer._tokenizer = Tokenizer.from_str(json.dumps(spec))


# gguf.md / gguf-py (Keys.Tokenizer.CHAT_TEMPLATE, CHAT_TEMPLATE_N): a model's default template, and each named one
# (convert_hf_to_gguf.py writes a tokenizer_config's list of {"name", "template"} with GGUFWriter.add_chat_template:
# "default" under the first key, every other name under the second, the names also listed in tokenizer.chat_templates)
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
NAMED_CHAT_TEMPLATE_PREFIX = CHAT_TEMPLATE_KEY + "."


def _set_named_chat_templates(tokenizer, path: Path) -> None:
    """Give the ``tokenizer`` read from the GGUF file at ``path`` the file's named chat templates
    (``tokenizer.chat_template.<name>``, e.g. ``tokenizer.chat_template.tool_use``) beside its default one, as the
    dict transformers makes ``chat_template`` of a tokenizer_config that lists several (``{"default": ...,
    "tool_use": ...}``): transformers' GGUF tokenizer mapping reads ``tokenizer.chat_template`` alone, so a file with
    only a tool_use template had no chat template at all, where llama.cpp reads each by its key
    (``llama_model_chat_template(model, "tool_use")``) and common_chat_templates_init (common/chat.cpp) takes the
    tool_use template as the default where the file has none; the build then picks as llama.cpp picks
    (edgesdk/build/package.py, ``chosen_chat_template``). A file without named templates keeps the tokenizer's."""
    fields = gguf_reader(path).fields
    named = {}
    for key in fields:
        if key.startswith(NAMED_CHAT_TEMPLATE_PREFIX) and key[len(NAMED_CHAT_TEMPLATE_PREFIX):]:
            template = _gguf_value(path, key)
            if isinstance(template, str) and template:
                named[key[len(NAMED_CHAT_TEMPLATE_PREFIX):]] = template
    named.pop("default", None)
    if not named:
        return
    default = _gguf_value(path, CHAT_TEMPLATE_KEY)
    templates = {"default": default} if isinstance(default, str) and default else {}
    # a "tokenizer.chat_template.default" key is not the default: llama.cpp reads that from the plain key alone
    templates.update(sorted(named.items()))
    tokenizer.chat_template = templates


def _add_end_of_turn_ids(model, path: Path) -> None:
    """Put the end-of-turn and end-of-message tokens of the GGUF file at ``path`` (``tokenizer.ggml.eot_token_id``,
    ``tokenizer.ggml.eom_token_id``) among the ids that end ``model``'s generation (its generation config's
    ``eos_token_id``, which the bundle's ``eos_token_ids`` and the teacher text's stops are read from), as
    llama.cpp's vocabulary does (src/llama-vocab.cpp, llama_vocab::impl::load: "special_eot_id is not in
    special_eog_ids", the same for eom, each added to the ids that end generation). transformers' GGUF reader reads
    the EOS alone, so a file whose converter wrote the turn's end as EOT (gguf-py's SpecialVocab does where the
    tokenizer appends another token as EOS) answered past it where its text is not one llama.cpp also finds by
    text. An id past the vocabulary is left out, as llama.cpp leaves it ("bad special token")."""
    tokens = _gguf_value(path, "tokenizer.ggml.tokens")
    generation = getattr(model, "generation_config", None)
    if not isinstance(tokens, list) or generation is None:
        return
    ids = [_gguf_value(path, f"tokenizer.ggml.{kind}_token_id") for kind in ("eot", "eom")]
    ids = [value for value in ids if isinstance(value, int) and not isinstance(value, bool)
           and 0 <= value < len(tokens)]
    current = generation.eos_token_id
    current = [] if current is None else [current] if isinstance(current, int) else list(current)
    merged = current + [token for token in dict.fromkeys(ids) if token not in current]
    if len(merged) > len(current):
        generation.eos_token_id = merged


def _gguf_value(path: Path, key: str):
    found = gguf_reader(path).fields.get(key)
    return None if found is None else found.contents()


def gguf_adds_bos_by_default(path: Path) -> bool:
    """Whether llama.cpp adds a BOS token to the text of the GGUF file at ``path`` although the file does not say so:
    a BPE vocabulary (``tokenizer.ggml.model`` gpt2) with a pre-tokenizer llama.cpp sets add_bos for
    (:data:`BOS_BY_DEFAULT_PRE_TOKENIZERS`: Llama 3's, tekken) and no ``tokenizer.ggml.add_bos_token`` (Llama 3 and
    Mistral Nemo files written before the converter read the BOS from tokenizer.json's post-processor).
    transformers' GGUF tokenizer then adds none, where a SentencePiece vocabulary (``llama``) gets one in both; the
    key, where present, decides in both."""
    return _gguf_value(path, "tokenizer.ggml.add_bos_token") is None \
        and _gguf_value(path, "tokenizer.ggml.model") == "gpt2" \
        and _gguf_value(path, "tokenizer.ggml.pre") in BOS_BY_DEFAULT_PRE_TOKENIZERS


def gguf_ignores_merges(path: Path) -> bool:
    """Whether llama.cpp tokenizes the BPE vocabulary of the GGUF file at ``path`` with ``ignore_merges``: a
    pre-token the vocabulary holds whole becomes that one token, where applying the merges could split it (Llama 3's
    vocabulary, from tiktoken, holds such tokens; its tokenizer.json says ``"ignore_merges": true`` for the same
    reason). transformers' GGUF tokenizer builds its BPE model without it."""
    return _gguf_value(path, "tokenizer.ggml.model") == "gpt2" \
        and _gguf_value(path, "tokenizer.ggml.pre") in IGNORE_MERGES_PRE_TOKENIZERS


def gguf_query_key_left_permuted(path: Path) -> bool:
    """Whether transformers' GGUF reader leaves the attn_q / attn_k rows of the llama GGUF file at ``path`` in
    llama.cpp's rotary order: its ``LlamaTensorProcessor`` undoes convert_hf_to_gguf.py's ``LlamaModel.permute`` only
    where the file gives both ``llama.attention.head_count`` and ``llama.attention.head_count_kv``, and returns the
    rows as stored otherwise. gguf.md makes head_count_kv optional ("if not present ... the model does not use GQA")
    and llama.cpp then takes n_head_kv = n_head, so such a file is a whole model whose rows llama.cpp's converter
    permuted all the same."""
    fields = gguf_reader(path).fields
    return _gguf_value(path, "general.architecture") == "llama" \
        and "llama.attention.head_count" in fields and "llama.attention.head_count_kv" not in fields


def _undo_query_key_permutation(model) -> None:
    """The q_proj / k_proj rows of ``model`` put back from llama.cpp's rotary order (:func:`unpermute_llama_cpp_rows`,
    with the query and the key-value head counts), in place."""
    import torch

    config = model.config
    with torch.no_grad():
        for layer in model.model.layers:
            for projection, heads in ((layer.self_attn.q_proj, config.num_attention_heads),
                                      (layer.self_attn.k_proj, config.num_key_value_heads)):
                rows = unpermute_llama_cpp_rows(projection.weight.detach().cpu().numpy(), heads)
                projection.weight.copy_(torch.from_numpy(rows.copy()))


def _gguf_has_field(path: Path, key: str) -> bool:
    return key in gguf_reader(path).fields


def check_all_weights_loaded(missing: Any, where: Path) -> None:
    """Refuse a model some of whose weights the checkpoint lacks: transformers fills them with random
    values and only logs it."""
    if missing:
        names = sorted(missing)
        raise ModelSourceError(
            f"model {where} lacks {len(names)} weight(s) its config needs, which would be random: "
            + ", ".join(names[:5]) + (", ..." if len(names) > 5 else ""),
            "check that every weight file of the model is complete (an untied model needs lm_head.weight)",
        )


# the config.json sizes that set the weights' shapes, named in the refusal of weights that do not fit them
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim")


def _file_shapes(directory: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """tensor name -> (shape, file name) for every tensor of the directory's safetensors files (headers only)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with contextlib.suppress(Exception), safe_open(str(file), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open is no mapping
                shapes[key] = (tuple(handle.get_slice(key).get_shape()), file.name)
    return shapes


def _explain_mismatched_weights(directory: Path, config: Any, exc: Exception) -> None:
    """Refuse a Hugging Face directory whose weights have other shapes than its config.json makes (a config.json of
    another model, a size edited or missing, so that the config class's default stands): transformers' own error
    ("You set `ignore_mismatched_sizes` to `False` ... look at the above report") names no tensor and no size.
    Names the first tensors that differ, both shapes, and config.json's sizes (those it does not set, whose
    default was taken, marked). Returns where nothing can be compared (no readable safetensors header)."""
    import torch
    from transformers import AutoModelForCausalLM

    found = _file_shapes(directory)
    if not found:
        return
    try:
        with torch.device("meta"):
            empty = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - only the explanation is lost: the caller raises its own error
        return
    expected = {name: tuple(tensor.shape) for name, tensor in empty.state_dict().items()}
    differ = [(name, shape, file, expected[name]) for name, (shape, file) in found.items()
              if name in expected and shape != expected[name]]
    if not differ:
        return
    try:
        declared = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        declared = {}
    declared = declared if isinstance(declared, dict) else {}
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    sizes = []
    for name in SHAPE_FIELDS:
        value = getattr(text_config, name, None)
        if value is not None:
            sizes.append(f"{name} {value}" + ("" if name in declared or name in declared.get("text_config", {})
                                              else " (not in config.json: the default)"))
    shown = "; ".join(f"{name} is {list(shape)} in {file}, but config.json makes it {list(wanted)}"
                      for name, shape, file, wanted in differ[:3])
    raise ModelSourceError(
        f"the weights of {directory} do not fit its config.json: {len(differ)} tensor(s) have other shapes: {shown}"
        + (", ..." if len(differ) > 3 else "") + f" (config.json: {', '.join(sizes)})",
        "use the config.json that came with these weights: its sizes (hidden_size, intermediate_size, "
        "num_attention_heads, num_key_value_heads, head_dim, vocab_size) must match the weight files; e.g. download "
        f"it again with '{download_again_command(directory, ('config.json',))}'") from exc


def _explain_unreadable_weights(directory: Path, exc: Exception) -> None:
    """Refuse a Hugging Face directory some of whose safetensors weight files cannot be read, naming them with their
    sizes: transformers' own error ("SafetensorError: Error while deserializing header: incomplete metadata, file
    not fully covered", a file shorter than its header says, as a download cut short leaves it) names no file, and a
    sharded model has many. Returns where every weight file's header reads."""
    from safetensors import safe_open

    from edgesdk.models.sources import MODEL_WEIGHTS_NAME

    unreadable = []
    for file in sorted(directory.glob("*.safetensors")):
        if not MODEL_WEIGHTS_NAME.match(file.name):
            continue
        try:
            with safe_open(str(file), "pt"):
                pass
        except Exception as read_exc:  # noqa: BLE001 - safetensors raises its own error type, and OSError
            try:
                size = f"{file.stat().st_size:,} bytes"
            except OSError:
                size = "size unknown"
            unreadable.append(f"{file.name} ({size}: {type(read_exc).__name__}: {read_exc})")
    if not unreadable:
        return
    raise ModelSourceError(
        f"cannot load the weights of {directory}: {len(unreadable)} weight file(s) cannot be read: "
        + "; ".join(unreadable[:3]) + ("; ..." if len(unreadable) > 3 else "")
        + ": a file cut short (an interrupted download) or damaged",
        "download the file(s) again, e.g. '"
        + download_again_command(directory, tuple(entry.split(" (", 1)[0] for entry in unreadable[:3]))
        + "', and compare each file's size with the repository's") from exc


def _explain_generation_config_failure(directory: Path, exc: Exception) -> None:
    """Refuse a Hugging Face directory whose ``generation_config.json`` transformers' ``GenerationConfig`` refuses (a
    JSON array, ``max_new_tokens`` -1, ``num_return_sequences`` 3 without sampling ...): from_pretrained reads it
    after the weights and its error was reported as weights that could not be loaded, with the fix to download the
    whole model again. Returns where the file is absent, where transformers reads it, and where reading it raises
    OSError (a file that is no valid JSON): from_pretrained catches that and builds the generation defaults from
    config.json instead (``GenerationMixin``'s loading), so such a file never fails the load."""
    from transformers import GenerationConfig

    from edgesdk.models.generation_defaults import GENERATION_CONFIG

    if not (directory / GENERATION_CONFIG).is_file():
        return
    try:
        GenerationConfig.from_pretrained(str(directory))
    except OSError:
        return  # transformers falls back to config.json: the load failed for another reason
    except Exception as read_exc:  # noqa: BLE001 - transformers raises ValueError, TypeError, AttributeError for it
        raise ModelSourceError(
            f"cannot load the model {directory}: transformers refuses its {GENERATION_CONFIG} (the generation "
            f"defaults it reads after the weights): {type(read_exc).__name__}: {read_exc}",
            f"correct the value it names in {directory / GENERATION_CONFIG}, or use the {GENERATION_CONFIG} that "
            f"came with the model (e.g. '{download_again_command(directory, (GENERATION_CONFIG,))}'); the weights "
            "are not at fault") from exc


# the rotary scaling settings transformers' rope functions compute with as numbers (modeling_rope_utils.py)
ROPE_NUMBER_KEYS = ("factor", "attention_factor", "beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor",
                    "original_max_position_embeddings")
# transformers' refusal of a rotary scaling that lacks a setting its type needs (RopeParameters._check_received_keys)
ROPE_MISSING_KEYS = re.compile(r"Missing required keys in `rope_parameters` for 'rope_type'='(\w+)': \{(.*?)\}")


def _positive_number(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _explain_rope_missing_keys(directory: Path, exc: Exception) -> None:
    """Refuse a config.json whose rotary scaling (``rope_scaling``, or transformers 5's ``rope_parameters``) lacks a
    setting its type needs (llama3 without low_freq_factor, yarn or linear without factor): transformers' KeyError
    was reported as an incomplete download, with the fix to fetch the weights and tokenizer again. Returns where
    ``exc`` is not that refusal."""
    found = ROPE_MISSING_KEYS.search(str(exc))
    if found is None:
        return
    rope_type, missing = found[1], sorted(re.findall(r"'(\w+)'", found[2]))
    raise ModelSourceError(
        f"the model config {directory / 'config.json'} gives the rotary scaling rope_type {rope_type!r} without "
        f"{', '.join(missing)}, which transformers needs to compute a {rope_type} scaling",
        f"add {', '.join(missing)} to config.json's rope_scaling (rope_parameters) with the values the model was "
        "trained with, as the config.json that came with it has them (e.g. download it again with "
        f"'{download_again_command(directory, ('config.json',))}')") from exc


def _causal_lm_model_type(name: str) -> str | None:
    """The model_type of the causal-LM class ``name`` (LlamaForCausalLM: llama); None where transformers knows no
    such class, or where several model types share it and none is the class's own. transformers maps several to one
    class (sarvam_mla to DeepseekV3ForCausalLM, exaone and internlm3 to LlamaForCausalLM), and the last of them was
    named: "sarvam_mla" for a DeepSeek-V3 config. The class's own has its config class (DeepseekV3Config) or its
    name (gpt2 for GPT2LMHeadModel, whose GPT2Config gpt-sw3 uses too)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    types = [model_type for model_type, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if cls == name]
    if len(types) <= 1:
        return types[0] if types else None
    import transformers

    own = getattr(getattr(transformers, name, None), "config_class", None)  # the class's own config, where importable
    if getattr(own, "model_type", None) in types:  # Llama4ForCausalLM: llama4_text, not llama4 (the multimodal one)
        return own.model_type
    prefix = re.sub(r"(ForCausalLM|LMHeadModel)$", "", name)
    squashed = re.sub(r"[_-]", "", prefix).lower()
    ranked = [(CONFIG_MAPPING_NAMES.get(model_type) == f"{prefix}Config",
               re.sub(r"[_-]", "", model_type).lower() == squashed, model_type) for model_type in types]
    config_matches, name_matches, model_type = max(ranked, key=lambda rank: rank[:2])
    return model_type if config_matches or name_matches else None


def _explain_missing_model_type(directory: Path, exc: Exception) -> None:
    """Refuse a config.json without ``model_type`` (a hand-written or very old one), which transformers' AutoConfig
    reads only where the directory's name holds a model type ("Unrecognized model in DIR. Should have a `model_type`
    key"): it was reported as an incomplete download, with the fix to fetch the weights and tokenizer again. The fix
    names the model_type of the class its ``architectures`` lists (LlamaForCausalLM: llama). Returns where ``exc``
    is not that refusal."""
    if "Should have a `model_type` key" not in str(exc):
        return
    try:
        declared = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    listed = declared.get("architectures") if isinstance(declared, dict) else None
    listed = [str(name) for name in listed] if isinstance(listed, list) else []
    known = [(name, model_type) for name in listed if (model_type := _causal_lm_model_type(name))]
    fix = (f"add \"model_type\": \"{known[0][1]}\" to config.json (the model_type of {known[0][0]}, which its "
           "architectures lists)" if known else
           "add the model's \"model_type\" to config.json (e.g. \"llama\" for LlamaForCausalLM), or use the "
           "config.json that came with the weights")
    raise ModelSourceError(
        f"the model config {directory / 'config.json'} has no model_type, which transformers reads the "
        "architecture from" + (f" (its architectures lists {', '.join(listed)[:120]})" if listed else ""),
        fix) from exc


def check_rope_parameters(config: Any, directory: Path) -> None:
    """Refuse a config.json whose rotary settings transformers cannot build the model from: a rope_theta given as
    text or null failed while the weights loaded ("TypeError: unsupported operand type(s) for ** or pow(): 'str' and
    'Tensor'"), a scaling setting (factor, low_freq_factor ...) given as text with "TypeError: '<=' not supported
    between instances of 'str' and 'int'", an unknown rope_type with "KeyError: 'weird'", all reported as weights
    that could not be loaded.
    ``rope_parameters`` is one mapping, or one per attention kind (Gemma 3: full_attention, sliding_attention)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    parameters = getattr(text_config, "rope_parameters", None)
    if not isinstance(parameters, dict):
        return
    nested = parameters and all(isinstance(value, dict) for value in parameters.values())
    groups = parameters.items() if nested else [(None, parameters)]
    known = ["default", *ROPE_INIT_FUNCTIONS]
    fix = ("use the config.json that came with the model (rope_parameters: {\"rope_type\": \"default\", "
           "\"rope_theta\": 10000.0} is the plain form; older configs write rope_theta and rope_scaling at the top)")
    for kind, group in groups:
        where = f"rope_parameters{f'.{kind}' if kind else ''}"
        theta = group.get("rope_theta")
        if theta is not None and not _positive_number(theta):
            raise ModelSourceError(f"the model config {directory / 'config.json'} gives {where}.rope_theta "
                                   f"{theta!r:.60}, expected a number > 0 (the rotary base, e.g. 10000.0)", fix)
        for key in ROPE_NUMBER_KEYS:  # text (or a number <= 0) failed while the weights loaded ("'<=' not supported ...")
            if group.get(key) is not None and not _positive_number(group[key]):
                raise ModelSourceError(f"the model config {directory / 'config.json'} gives {where}.{key} "
                                       f"{group[key]!r:.60}, expected a number > 0 (written without quotes)", fix)
        rope_type = group.get("rope_type", group.get("type", "default"))
        if rope_type not in known:
            raise ModelSourceError(f"the model config {directory / 'config.json'} gives {where}.rope_type "
                                   f"{rope_type!r:.60}, which transformers does not know; expected one of "
                                   f"{', '.join(known)}", fix)


def check_all_weights_used(unexpected: Any, where: Path) -> None:
    """Refuse a Hugging Face directory whose weight files hold tensors its config.json gives no place to (more
    layers than ``num_hidden_layers``, biases where ``attention_bias`` / ``mlp_bias`` are off): transformers drops
    them and only logs it ("UNEXPECTED"), so the model computes something other than its checkpoint. llama.cpp's
    loader refuses a file with tensors its model does not read ("wrong number of tensors",
    ``llama_model_loader::done_getting_tensors``). The keys transformers itself ignores (old checkpoints'
    ``rotary_emb.inv_freq``, ``position_ids``) are not in ``unexpected``."""
    if unexpected:
        names = sorted(unexpected)
        raise ModelSourceError(
            f"model {where} holds {len(names)} weight(s) its config.json has no place for, which transformers would "
            "drop: " + ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
            + "; the model would then compute something other than its checkpoint",
            "use the config.json that came with these weights (its num_hidden_layers, attention_bias, mlp_bias and "
            "architecture must match the weight files)",
        )


def config_tied_as_loaded(model) -> None:
    """Set ``tie_word_embeddings`` false where the loaded model's LM head is not its embedding: transformers leaves
    a model untied whose config.json says tie_word_embeddings but whose weights hold an lm_head.weight of other
    values (it warns "... both are present in the checkpoints with different values, so we will NOT tie them. You
    should update the config with `tie_word_embeddings=False`"), and its config saying tied. The manifest then
    recorded a tied model, and whatever rebuilds the model from its config (``tie_weights()``; a pruned checkpoint
    read back by compress/structure.py, ``from_config`` then ``load_state_dict``) shared one table for both,
    losing the head or the embedding."""
    config = model.config
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if not getattr(config, "tie_word_embeddings", False) or head is None or embedding is None \
            or head.weight is embedding.weight:
        return
    config.tie_word_embeddings = False
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text_config is not config:
        text_config.tie_word_embeddings = False


@contextlib.contextmanager
def _progress_bars(enabled: bool):
    """transformers' loading bars ("Loading weights", and the GGUF reader's own tqdm bar, which
    transformers' switch does not reach) on or off for the duration of one load."""
    if enabled:
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_reader
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    reader_tqdm = getattr(gguf_reader, "tqdm", None)
    hf_logging.disable_progress_bar()
    if reader_tqdm is not None:
        gguf_reader.tqdm = functools.partial(reader_tqdm, disable=True)
    try:
        yield
    finally:
        if reader_tqdm is not None:
            gguf_reader.tqdm = reader_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


# the files transformers builds a tokenizer from: the tokenizers serialisation, SentencePiece, tiktoken, Mistral's
# tekken, BPE / WordPiece vocabularies
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tekken.json", "vocab.json", "vocab.txt", "merges.txt")


def _explain_tokenizer_failure(directory: Path, exc: Exception) -> None:
    """Refuse a Hugging Face directory whose tokenizer transformers could not load, saying why where the
    files show it (transformers' own message then names sentencepiece for a directory without any tokenizer,
    and tiktoken for a SentencePiece tokenizer.model it could not convert)."""
    names = {entry.name for entry in directory.iterdir()}
    if "tokenizer.json" not in names and "tokenizer.model" in names \
            and importlib.util.find_spec("sentencepiece") is None:
        raise ModelSourceError(
            f"cannot load the tokenizer of {directory}: it has a SentencePiece tokenizer.model and no "
            "tokenizer.json, and transformers converts tokenizer.model with the sentencepiece package, which is "
            "not installed in this Python",
            "install sentencepiece (pip install sentencepiece), or write tokenizer.json once where it is "
            f"installed: AutoTokenizer.from_pretrained(dir).save_pretrained(dir), for dir {directory}") from exc
    fix = ("copy the model's tokenizer files again (tokenizer.json with tokenizer_config.json, as the model's "
           f"repository has them), e.g. "
           f"{download_again_command(directory, ('tokenizer.json', 'tokenizer_config.json'))}")
    for name, keys in (("tokenizer_config.json", ()), ("tokenizer.json", ("model", "added_tokens"))):
        if name not in names:
            continue
        try:
            data = json.loads((directory / name).read_text(encoding="utf-8"))
        except (OSError, ValueError) as read_exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise ModelSourceError(f"cannot load the tokenizer of {directory}: its {name} is not readable JSON "
                                   f"({read_exc})", fix) from exc
        if not isinstance(data, dict):
            raise ModelSourceError(f"cannot load the tokenizer of {directory}: its {name} holds a JSON "
                                   f"{type(data).__name__}, expected an object of keys", fix) from exc
        lacking = [key for key in keys if key not in data]
        if lacking:
            raise ModelSourceError(
                f"cannot load the tokenizer of {directory}: its {name} lacks the key(s) {', '.join(lacking)}, which "
                "the tokenizers library's serialisation has (version, added_tokens, normalizer, pre_tokenizer, "
                "post_processor, decoder, model)", fix) from exc
    check_tokenizer_files(directory, exc)


def check_tokenizer_files(directory: Path, exc: Exception | None = None) -> None:
    """Refuse a Hugging Face directory without any file a tokenizer is built from (:data:`TOKENIZER_FILES`, a
    tiktoken file), before transformers reads it: its AutoTokenizer then makes a tokenizer of the model type's class
    with no vocabulary (one token, every text encoded to none), and the bundle built with it answers no prompt.
    ``exc``: the failure of transformers' reader this explains, where it had one."""
    names = {entry.name for entry in Path(directory).iterdir()}
    if not names.intersection(TOKENIZER_FILES) and not any(name.endswith(".tiktoken") for name in names):
        raise ModelSourceError(
            f"cannot load the tokenizer of {directory}: it has no tokenizer file ({', '.join(TOKENIZER_FILES)}, "
            "*.tiktoken)",
            "copy the model's tokenizer files (tokenizer.json with tokenizer_config.json) beside its config.json"
        ) from exc


def check_tokenizer_size(tokenizer, model, where) -> None:
    """Refuse a tokenizer far smaller than ``model``'s vocabulary (under 2 tokens, or under half its embedding rows):
    not the model's own (transformers' tokenizer classes make one of a few special tokens from a tokenizer_config.json
    alone), it encodes text to few or no tokens and the bundle answers nothing. A model's embedding is padded past its
    tokenizer (Qwen2.5: 151936 rows for 151665 tokens), never to twice its size."""
    rows = model.get_input_embeddings().num_embeddings
    size = len(tokenizer)
    if size < 2 or size * 2 < rows:
        raise ModelSourceError(
            f"the tokenizer of {where} has {size} token(s), but the model's embedding has {rows} rows "
            f"(vocab_size): a tokenizer this much smaller is not the model's, and would encode text to few or no "
            "tokens", "copy the model's own tokenizer files (tokenizer.json with tokenizer_config.json, as the model's "
            "repository has them) beside its config.json")


def available_memory(root: Path = Path("/")) -> int | None:
    """Bytes of memory this process can still take without swapping: /proc/meminfo's MemAvailable, capped by the
    cgroup v2 limits of this process's cgroup and its ancestors (a container's limit: ``memory.max`` less what the
    cgroup holds that it cannot give back, ``memory.current`` less the ``inactive_file`` page cache of
    ``memory.stat``, which the kernel reclaims before it kills: a just-downloaded model's file cache is not in
    use); None where nothing is readable (not Linux). ``root``: the file system's root (a test's tree)."""
    found = []
    with contextlib.suppress(OSError, ValueError):
        for line in (root / "proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    own = "/"
    with contextlib.suppress(OSError):
        for line in (root / "proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):  # the cgroup v2 line (cgroups(7))
                own = line[3:].strip() or "/"
    cgroups = root / "sys/fs/cgroup"
    group = cgroups / own.lstrip("/")
    for level in (group, *group.parents):
        with contextlib.suppress(OSError, ValueError):
            limit = (level / "memory.max").read_text().strip()
            if limit != "max":
                held = int((level / "memory.current").read_text().strip())
                with contextlib.suppress(OSError, ValueError):
                    for line in (level / "memory.stat").read_text().splitlines():
                        if line.startswith("inactive_file "):
                            held -= int(line.split()[1])
                found.append(max(0, int(limit) - max(held, 0)))
        if level == cgroups:
            break
    return min(found) if found else None


def check_fits_in_memory(config: Any, source: ModelSource) -> None:
    """Refuse a model whose float32 weights (what :func:`load_model` loads: a GGUF file de-quantized, float16 /
    bfloat16 safetensors widened) alone take more memory than the host has available, before any weight is read:
    loading it would swap for hours or end with the process killed for lack of memory. The parameters are counted
    on a model of ``config`` built on the meta device (no memory); the check is skipped where the memory cannot be
    read."""
    import torch
    from transformers import AutoModelForCausalLM

    available = available_memory()
    if available is None:
        return
    try:
        with torch.device("meta"):
            empty = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - the load itself reports a config it cannot build
        return
    parameters = sum(parameter.numel() for parameter in empty.parameters())
    needed = parameters * 4  # float32
    if needed <= available:
        return
    gib = 2 ** 30
    raise ModelSourceError(
        f"model {source.path} has {parameters / 1e9:.2f} billion parameters, which load as float32 (the precision "
        f"edgesdk compresses from) in about {needed / gib:.1f} GiB, and this machine has {available / gib:.1f} GiB "
        "of memory available: loading it would swap or be killed for lack of memory",
        f"build on a host with at least {math.ceil(needed / gib)} GiB of free memory (close other programs to "
        "free some), or choose a smaller model (e.g. SmolLM2-135M / 360M, Qwen2.5-0.5B)")



def incomplete_model_fix(source) -> str:
    """The fix for a model file or directory transformers cannot read: a GGUF file is one file to fetch again; a
    Hugging Face directory needs its config, every weights shard (with their index) and its tokenizer."""
    if source.kind == "gguf":
        return "check that the file is a complete, uncorrupted GGUF file (download it again if its size is off)"
    return (f"check that {source.path} holds the model's complete files: config.json, the weights "
            "(model.safetensors, or every model-*.safetensors shard with model.safetensors.index.json) and the "
            f"tokenizer; e.g. download them again with '{download_again_command(source.path)}'")


def load_model(source: ModelSource, progress: bool = True, as_llama: bool = True, terms: str = "cli") -> LoadedModel:
    """Load weights and tokenizer of a resolved source as float32 on the CPU (``progress``: show
    transformers' loading bars). A Phi-3 or Granite model is loaded as the Llama it computes
    (edgesdk/models/as_llama.py) unless ``as_llama`` is False: a caller that merges LoRA adapters trained on the
    source's own modules (Phi-3's qkv_proj) merges them first, then calls :func:`load_as_llama`. ``terms``: whose
    names the refusals' fixes give the model and its options (:func:`check_gguf_model`)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    overrides = {}
    if source.kind == "gguf":
        overrides = check_gguf_model(source.path, terms)
        location, kwargs = str(source.path.parent), {"gguf_file": source.path.name}
    else:
        check_model_type_declared(source.path)
        location, kwargs = str(source.path), {}
    read_here = overrides.get(READ_BY_EDGESDK, False)  # a SmolLM3 file, which transformers' reader has no mapping for
    try:
        if read_here:
            from transformers import SmolLM3Config

            config = SmolLM3Config(**{key: value for key, value in overrides.items() if key != READ_BY_EDGESDK})
            config._name_or_path = location
        else:
            config = AutoConfig.from_pretrained(location, **kwargs, **overrides)
    except Exception as exc:  # transformers raises many types for unreadable or unknown files
        wrong = re.search(r"Field '(\w+)' expected (.+?), got (\w+) \(value: (.*?)\)", str(exc))
        if source.kind == "hf-dir":
            _explain_rope_missing_keys(source.path, exc)
            _explain_missing_model_type(source.path, exc)
        if wrong and source.kind == "hf-dir":  # transformers' strict config classes: a size given as text or null
            field_name, expected, got, value = wrong.groups()
            raise ModelSourceError(
                f"the model config {source.path / 'config.json'} gives {field_name} {value[:60]} "
                f"({'null' if got == 'NoneType' else f'a {got}'}), expected {expected}",
                f"set {field_name} in config.json to a value of type {expected} (a number is written without "
                "quotes), or use the config.json that came with the weights") from exc
        raise ModelSourceError(
            f"cannot read the model config of {source.path}: {type(exc).__name__}: {exc}",
            incomplete_model_fix(source),
        ) from exc
    if source.kind == "gguf" and not read_here and getattr(config, "pad_token_id", None) is not None \
            and not _gguf_has_field(source.path, "tokenizer.ggml.padding_token_id"):
        # transformers' reader sets pad_token_id from tokenizer.ggml.padding_token_id only, and the config class's
        # default (Phi3Config's 32000) stands for a file without one, where llama.cpp has no padding token; a default
        # past a small vocabulary fails the embedding's padding_idx check
        config.pad_token_id = None
    check_architecture(config, str(source.path))
    if source.kind == "hf-dir":
        check_rope_parameters(config, source.path)
    check_fits_in_memory(config, source)
    declared = getattr(config, "quantization_config", None)
    if isinstance(declared, dict) and str(declared.get("quant_method")).lower() in DEQUANTIZED_METHODS:
        # FineGrainedFP8 (the one quantized form sources.check_not_quantized lets through): weights times their
        # weight_scale_inv in float32, plain nn.Linear layers, the quantization config dropped; without
        # dequantize, transformers does this on a CPU-only host but keeps FP8Linear layers where CUDA is present
        config.quantization_config = {**declared, "dequantize": True}
    try:
        if read_here:
            model, missing = _read_smollm3_gguf(source.path, config)
            loading_info = {"missing_keys": missing}
        else:
            with _progress_bars(progress):
                model, loading_info = AutoModelForCausalLM.from_pretrained(
                    location, config=config, dtype=torch.float32, output_loading_info=True, **kwargs)
    except ModelSourceError:
        raise
    except Exception as exc:
        if "Weights only load failed" in str(exc):  # torch.load(weights_only=True) met a pickled object
            reason = next((line.strip() for line in str(exc).splitlines()
                           if "GLOBAL" in line or line.strip().startswith("Unsupported")), None)
            raise ModelSourceError(
                f"cannot load the weights of {source.path}: its PyTorch pickle (.bin) holds what "
                "torch.load(weights_only=True) does not read, objects other than tensors and plain containers, "
                "which edgesdk does not unpickle (unpickling them can run any code)" + (f": {reason}" if reason else ""),
                "use the model's safetensors weights, or, where you trust the file, convert it once: "
                "AutoModelForCausalLM.from_pretrained(dir, weights_only=False).save_pretrained(dir)",
            ) from exc
        if source.kind == "hf-dir" and "mismatched" in str(exc):  # transformers: "ignore_mismatched_sizes"
            _explain_mismatched_weights(source.path, config, exc)
        if source.kind == "hf-dir":
            _explain_unreadable_weights(source.path, exc)
            _explain_generation_config_failure(source.path, exc)
        raise ModelSourceError(
            f"cannot load the weights of {source.path}: {type(exc).__name__}: {exc}",
            incomplete_model_fix(source),
        ) from exc
    check_all_weights_loaded(loading_info["missing_keys"], source.path)
    if source.kind == "gguf" and not read_here and gguf_query_key_left_permuted(source.path):
        _undo_query_key_permutation(model)
    if source.kind == "gguf":
        _add_end_of_turn_ids(model, source.path)
    if source.kind == "hf-dir":
        check_all_weights_used(loading_info.get("unexpected_keys"), source.path)
        config_tied_as_loaded(model)
        _warn_of_own_code(source.path, model)
        check_tokenizer_files(source.path)  # AutoTokenizer makes an empty tokenizer of a directory without any
    try:
        with _progress_bars(progress):
            # AutoTokenizer reads the GGUF file's config through transformers' reader first, which refuses a SmolLM3
            # file; the fast tokenizer class builds it from the tokenizer.ggml.* keys alone, as it does for a llama
            # file (integrations/gguf: get_gguf_tokenizer, convert_gguf_tokenizer)
            tokenizer = (PreTrainedTokenizerFast if read_here else AutoTokenizer).from_pretrained(location, **kwargs)
    except Exception as exc:
        if source.kind == "hf-dir":
            _explain_tokenizer_failure(source.path, exc)
        raise ModelSourceError(
            f"cannot load the tokenizer of {source.path}: {type(exc).__name__}: {exc}",
            "the model needs its tokenizer: tokenizer.json (with tokenizer_config.json) beside config.json "
            "in a Hugging Face directory, the tokenizer metadata in a GGUF file",
        ) from exc
    if source.kind == "gguf":  # transformers splits a BPE type it does not map with GPT-2's regex
        _set_bpe_pre_tokenizer(tokenizer, source.path)
        _drop_tokens_the_file_lacks(tokenizer, source.path)
        _key_added_tokens_by_their_text(tokenizer, source.path)
        _set_spm_space_prefix(tokenizer, source.path)
        _strip_after_phi3_special_tokens(tokenizer, source.path)
        _set_named_chat_templates(tokenizer, source.path)
    if source.kind == "gguf" and gguf_adds_bos_by_default(source.path) and not getattr(tokenizer, "add_bos_token", True) \
            and getattr(tokenizer, "bos_token", None) is not None:
        tokenizer.add_bos_token = True  # transformers' setter rebuilds the post-processor with the BOS in front
    if source.kind == "gguf" and gguf_ignores_merges(source.path) \
            and getattr(tokenizer.backend_tokenizer.model, "ignore_merges", None) is False:
        tokenizer.backend_tokenizer.model.ignore_merges = True  # saved with tokenizer.json's model
    if not getattr(tokenizer, "is_fast", False):
        raise ModelSourceError(
            f"the tokenizer of {source.path} has no fast (tokenizers) version",
            "the board runtime reads tokenizer.json; add one to the model directory",
        )
    if source.kind == "gguf":  # the weights are de-quantized float32 now: a plain, saveable model
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    model.eval()
    check_tokenizer_size(tokenizer, model, source.path)
    check_added_tokens_embedded(tokenizer, model, source.path)
    pooling, note = declared_pooling(source.kind, source.path)
    loaded = LoadedModel(model=model, tokenizer=tokenizer, source=source, pooling=pooling, pooling_note=note)
    return load_as_llama(loaded) if as_llama else loaded


def check_added_tokens_embedded(tokenizer, model, where) -> None:
    """Refuse a ``tokenizer`` whose added tokens have ids past ``model``'s embedding rows where the model needs them
    (its BOS, EOS, padding or unknown token, or a token its chat template writes), and warn of the others.

    The runtime refuses a prompt holding an id past the rows (edgesdk/runtime/generate.py, ``_check_prompt``), so a
    bundle built from such a tokenizer failed only on the board, at its first chat. A token nothing needs (Gemma 3's
    <image_soft_token>, id 262144 in every size, past the 1B's 262144 rows) is left in: text holding it is refused
    there, and the GGUF export leaves it out of the file as llama.cpp's converter does."""
    rows = model.get_input_embeddings().num_embeddings
    past = {int(index): added.content for index, added in tokenizer.backend_tokenizer.get_added_tokens_decoder().items()
            if int(index) >= rows}
    if not past:
        return
    for index, text in sorted(past.items()):
        role = _needed_as(text, tokenizer)
        if role:
            raise ModelSourceError(
                f"the tokenizer of {where} has the added token {text!r} ({role}) as id {index}, but the model's "
                f"embedding has {rows} rows (ids 0 to {rows - 1}): the bundle's runtime would refuse every prompt "
                "holding it", "use the tokenizer that came with these weights (tokenizer.json and "
                "tokenizer_config.json of the same model), or weights whose vocab_size covers the tokenizer")
    shown = ", ".join(f"{text!r} (id {index})" for index, text in sorted(past.items())[:5]) + \
        (", ..." if len(past) > 5 else "")
    warnings.warn(f"the tokenizer of {where} has added tokens {shown} past the model's {rows} embedding rows: the "
                  "bundle's runtime refuses text holding them, and a GGUF export leaves them out", stacklevel=3)


def _needed_as(text: str, tokenizer) -> str | None:
    """What the model needs the token ``text`` of ``tokenizer`` for: one of its special tokens, or its chat
    template's (named templates too); None where nothing does."""
    for role in ("bos", "eos", "pad", "unk"):
        if getattr(tokenizer, f"{role}_token", None) == text:
            return f"its {role.upper()} token"
    template = tokenizer.chat_template
    return "written by its chat template" if text in (template if isinstance(template, str)
                                                      else json.dumps(template or "", ensure_ascii=False)) else None


def load_as_llama(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` with a Phi-3 or Granite model replaced by the Llama it computes (edgesdk/models/as_llama.py);
    any other model as it is."""
    from edgesdk.models.as_llama import as_llama, converts_to_llama

    if converts_to_llama(loaded.model.config):
        loaded.model = as_llama(loaded.model)
    return loaded
