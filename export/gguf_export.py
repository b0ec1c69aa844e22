"""Export a fused bundle as a GGUF file that llama.cpp (and transformers' GGUF loader) runs.

The bundle's weights are re-encoded, not re-quantized (export/gguf_tensors.py): a QAT-trained INT4
bundle becomes a Q4_0 file whose weights are exactly those QAT learned, so llama.cpp's own kernels
run at the bundle's quality instead of the round-to-nearest Q4_0 that ``llama-quantize`` makes from
float weights. This is the GGUF fallback of the deployment plan (reference: anchors-mission.md §6)
for boards where ONNX Runtime has no wheel.

Layout follows llama.cpp's ``convert_hf_to_gguf.py`` conventions for the ``llama``, ``qwen2``,
``qwen3``, ``smollm3`` and ``gemma3`` architectures (GGUF spec: github.com/ggml-org/ggml/blob/master/docs/gguf.md):

- tensor names ``token_embd``, ``blk.{i}.attn_{q,k,v,output}``, ``blk.{i}.ffn_{gate,up,down}``,
  ``blk.{i}.{attn,ffn}_norm``, ``output_norm``, ``output`` (absent when tied), Qwen3's and Gemma 3's
  ``blk.{i}.attn_{q,k}_norm``, and Gemma 3's ``blk.{i}.post_attention_norm`` / ``post_ffw_norm``;
- ``llama`` rotates adjacent pairs (GPT-J style) where the bundle's graph rotates halves
  (``rotary_interleaved=0``), so the query and key rows of each head are reordered: row
  ``h·hd + a·hd/2 + j`` moves to ``h·hd + 2j + a``. ``qwen2``, ``qwen3`` and ``gemma3`` rotate halves
  and keep them.
- ``smollm3`` is Llama's layout (tensors, pairwise row order: ``SmolLM3Model(LlamaModel)`` in the converter)
  whose layers ``il`` with ``(il + 1) % 4 == 0`` apply no rotary (NoPE); llama.cpp fixes that step at 4
  (``n_no_rope_layer_step``) and reads no per-layer list from the file. A bundle whose NoPE layers are
  others (a config with another interval, layers removed by depth pruning), or NoPE layers in any other
  architecture (``deci`` included), which rotates every layer, is refused.
- ``gemma3``'s norm weights are stored as the factor they scale by (1 + the Hugging Face weight), which
  the bundle already holds. llama.cpp fixes what the file does not say: every sixth layer attends
  globally at ``rope.freq_base`` and the others over ``attention.sliding_window`` at a rotary base of
  10,000, the embedding is scaled by sqrt(width), the softmax by 1/sqrt(head size) (the 27B's 62 layers
  excepted), and the FFN is GeGLU with GELU's tanh form (``llama-model.cpp``, LLM_ARCH_GEMMA3). Linear rope
  scaling (``rope.scaling.factor``, the 4B and larger models' factor 8) applies to the global layers only:
  llama.cpp fixes the sliding layers' ``rope_freq_scale_train_swa`` at 1. A bundle that differs in any of these
  is refused rather than written to compute something else.
- rope scaling: Llama 3's as the ``rope_freqs.weight`` tensor (which llama.cpp divides each frequency by),
  linear as ``{arch}.rope.scaling.type`` linear and ``{arch}.rope.scaling.factor`` F (llama.cpp rotates position
  p by p / F * theta^(-2j / hd)), as llama.cpp's converter writes them.
- Layers pruned to different shapes (``prune`` ranks FFN channels across layers and removes whole
  GQA groups per layer) are written as llama.cpp's ``deci`` architecture (NVIDIA's Llama-Nemotron
  NAS models), whose loader reads the head counts, KV head counts and FFN widths as per-layer arrays
  and builds the Llama graph (adjacent-pair RoPE, optional Q/K/V biases) from them. ``llama`` and
  ``qwen2`` read one width for every layer. ``qwen2``'s loader also sizes the query projection and its
  bias as the model width, so a Qwen2 model whose query heads span less (every layer keeping the same
  fewer GQA groups) is written as ``deci`` too. Every one of these loaders (``deci`` included) sizes the
  optional query bias as the model width, so a layer whose query heads span less and that has Q/K/V
  biases (any pruned Qwen2 layer that lost GQA groups) is refused: llama.cpp would refuse the file.

The file is written beside its destination, read back with the ``gguf`` package's own decoder and
compared with the bundle's weights (bit-exact), and only then renamed into place.
"""

from __future__ import annotations

import math
import os
import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edgesdk.errors import ExportError
from edgesdk.export.blockwise import BlockQuantized
from edgesdk.export.bundle_weights import (
    BundleDecoder,
    Matrix,
    check_readable_form,
    matrix_rows,
    read_bundle_decoder,
    take_rows,
)
from edgesdk.export.gguf_tensors import decoded_values, encode_matrix
from edgesdk.export.gguf_vocab import GGUFVocab, vocab_from_tokenizer_json
from edgesdk.models.loader import GGUF_CARD_KEYS

# model type in the bundle's manifest -> (GGUF architecture, query/key rows reordered for pairwise RoPE)
ARCHITECTURES = {"llama": ("llama", True), "mistral": ("llama", True), "qwen2": ("qwen2", False),
                 "qwen3": ("qwen3", False), "smollm3": ("smollm3", True), "gemma3_text": ("gemma3", False)}
# model types with per-head query / key norms, which llama.cpp's deci architecture does not have
HEAD_NORMED = {"qwen3", "gemma3_text"}
GEMMA3_GLOBAL_EVERY = 6  # llama.cpp's gemma3: layer i attends globally when i % 6 == 5 (set_swa_pattern(6))
GEMMA3_LOCAL_ROPE_BASE = 10_000.0  # and rotates its sliding layers at this base (rope_freq_base_train_swa)
GEMMA3_27B_LAYERS = 62  # the one size whose softmax scale llama.cpp takes as 1/sqrt(width / heads)
SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp's smollm3: layer il applies no rotary where (il + 1) % 4 == 0


def gemma3_query_scalar(layers: int, width: int, heads: int, head_dim: int) -> float:
    """The query_pre_attn_scalar llama.cpp's gemma3 computes with (softmax scale = its ** -1/2): the head size,
    or width / heads for the 27B's 62 layers (``llama-model.cpp``, LLM_ARCH_GEMMA3)."""
    return width / heads if layers == GEMMA3_27B_LAYERS else float(head_dim)
PER_LAYER_ARCHITECTURE = ("deci", True)  # layers of different shapes, any of the model types above
# model types whose transformers config always holds head_dim (LlamaConfig and MistralConfig set it to width / heads
# where config.json leaves it out, and save it), so llama.cpp's converter writes key / value_length for their
# config.json; Qwen2Config and SmolLM3Config hold none
HEAD_SIZE_ALWAYS_GIVEN = {"llama", "mistral", "qwen3", "gemma3_text"}
# GGUF architectures whose llama.cpp loader takes the query projection as (width x width), not heads x head size
QUERY_AS_WIDE_AS_MODEL = {"qwen2"}


@dataclass(frozen=True)
class LayerShapes:
    """Per decoder layer: query heads, KV heads and FFN width."""

    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]
    ffn: tuple[int, ...]

    @property
    def uniform(self) -> bool:
        return len(set(zip(self.heads, self.kv_heads, self.ffn, strict=True))) == 1

    def metadata(self, values: tuple[int, ...]) -> int | list[int]:
        """One number for uniform layers (what every llama.cpp architecture reads), else the per-layer array."""
        return values[0] if self.uniform else list(values)


class GGUFExportNote(UserWarning):
    """What llama.cpp will read differently from the exported file than edgesdk runs the bundle, or what was done with
    earlier exports' temporary files beside it; its text is also in the export report's ``notes`` (a tokenizer's),
    ``file_notes`` (the file's others) or ``partial_notes`` (the temporary files'), which ``edgesdk export`` prints."""


@dataclass(frozen=True)
class GGUFExportConfig:
    verify: bool = True  # read the file back with gguf's decoder and compare every tensor with the bundle's


@dataclass
class GGUFExportReport:
    path: Path
    size_bytes: int
    architecture: str
    file_type: str  # the most common weight type: Q4_0, Q8_0 or F32
    tensor_types: dict[str, int] = field(default_factory=dict)  # ggml type -> tensors of it
    verified_tensors: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # texts llama.cpp tokenizes differently from the bundle
    file_notes: list[str] = field(default_factory=list)  # what else llama.cpp runs differently: window, end tokens
    partial_notes: list[str] = field(default_factory=list)  # earlier exports' temporary files removed or left there


def gguf_destination(bundle_dir: Path, out: Path) -> Path:
    """The file to write: ``out`` itself, or ``out/<bundle name>.gguf`` for a directory."""
    out = Path(out)
    target = out / f"{Path(bundle_dir).resolve().name}.gguf" if out.is_dir() else out
    if target.suffix.lower() != ".gguf":  # X.GGUF too: llama.cpp and Ollama take any case
        raise ExportError(f"output {out} does not end in .gguf",
                          f"name the file (e.g. {out.with_suffix('.gguf')}) or pass a directory")
    if not target.parent.is_dir():
        raise ExportError(f"output {target}: its directory {target.parent} does not exist",
                          f"create it first (mkdir -p {target.parent}) or write the file into an existing directory")
    bundle = Path(bundle_dir).resolve()
    if bundle == target.resolve().parent or bundle in target.resolve().parents:
        raise ExportError(f"output {target} lies inside the bundle {bundle_dir}, whose verification refuses "
                          "files its manifest does not list", "write the GGUF file outside the bundle directory")
    return target


def export_gguf(bundle_dir: Path, out: Path, config: GGUFExportConfig = GGUFExportConfig()) -> GGUFExportReport:
    """Write the verified bundle ``bundle_dir`` as a GGUF file at ``out`` (a file or a directory)."""
    from edgesdk.bundle import read_manifest, sync_directory, verify_bundle

    start = time.perf_counter()
    destination = gguf_destination(bundle_dir, out)
    # a graph form GGUF export cannot read is refused by the manifest alone, before every file is hashed
    check_readable_form(Path(bundle_dir), read_manifest(Path(bundle_dir)))
    bundle = verify_bundle(Path(bundle_dir))
    manifest = bundle.manifest
    model_type = manifest["model"]["after"]["architecture"]
    if model_type not in ARCHITECTURES:
        raise ExportError(f"bundle {bundle_dir} holds a {model_type!r} model; GGUF export writes {sorted(ARCHITECTURES)}",
                          "run this bundle with edgesdk")
    decoder = read_bundle_decoder(bundle.path, manifest)
    file_notes = []
    if model_type == "gemma3_text":
        check_gemma3_layout(decoder, bundle_dir)
        note = unknown_window_note(decoder, manifest)
        if note:
            file_notes.append(note)
            warnings.warn(f"{destination}: {note}", GGUFExportNote, stacklevel=2)
    shape = layer_shapes(decoder)
    architecture, pairwise_rope = ARCHITECTURES[model_type]
    narrow_query = decoder.head_dim * shape.heads[0] != decoder.hidden_size
    if not shape.uniform or (architecture in QUERY_AS_WIDE_AS_MODEL and narrow_query):
        if model_type in HEAD_NORMED:
            raise ExportError(
                f"bundle {bundle_dir} holds a {model_type} model whose layers were pruned to different shapes "
                f"(query heads {list(shape.heads)}, KV heads {list(shape.kv_heads)}, FFN {list(shape.ffn)}); "
                f"llama.cpp's {architecture} architecture reads one shape for every layer, and its per-layer one "
                "(deci) has no query / key norms", "run this bundle with edgesdk, or build it without prune "
                "(or with prune settings that keep every layer alike) for llama.cpp")
        architecture, pairwise_rope = PER_LAYER_ARCHITECTURE
    check_rotary_layers(decoder, architecture, bundle_dir)
    check_rope_factors(decoder, architecture, bundle_dir)
    check_query_bias(decoder, architecture, bundle_dir)
    tokenizer = manifest["tokenizer"]
    vocab = vocab_from_tokenizer_json(bundle.file(tokenizer["file"]), tokenizer.get("bos_token"),
                                      tokenizer.get("eos_token"), matrix_rows(decoder.embed), gguf_name(manifest),
                                      tokenizer.get("pad_token"), tokenizer.get("unk_token"))
    vocab = with_end_tokens(vocab, tokenizer.get("eos_token_ids") or ())
    for note in vocab.notes:
        warnings.warn(f"{destination}: llama.cpp tokenizes {note}", GGUFExportNote, stacklevel=2)
    unheld = end_of_turn_keys(vocab)[1]
    if unheld:
        note = (f"the bundle stops at tokens {unheld} ({', '.join(repr(vocab.tokens[i]) for i in unheld)}), which "
                "llama.cpp does not end generation at: it ends at the EOS, EOT and EOM tokens and at tokens of its own "
                "texts only, and those keys hold two other ids; pass them to llama.cpp as stop strings "
                "(llama-server's \"stop\", llama-cli's -r)")
        file_notes.append(note)
        warnings.warn(f"{destination}: {note}", GGUFExportNote, stacklevel=2)
    tensors = gguf_tensors(decoder, pairwise_rope)
    encoded = {name: encode_matrix(value) for name, value in tensors.items()}
    types = dict(Counter(data.quant or "F32" for data in encoded.values()))
    weight_types = Counter(data.quant or "F32" for data in encoded.values() if data.data.ndim == 2)
    file_type = max(sorted(weight_types), key=weight_types.get)  # sorted: ties resolve the same every run

    partial_notes = clear_stale_partials(destination)
    for note in partial_notes:
        warnings.warn(note, GGUFExportNote, stacklevel=2)
    partial = lock = None
    try:
        partial, handle = _open_partial(destination)
        lock = _lock_partial(handle)
        with handle:
            _write(partial, architecture, decoder, shape, vocab, encoded, file_type, manifest,
                   _chat_template(bundle, tokenizer), handle, tensor_elements(tensors))
        verified = verify_gguf(partial, tensors) if config.verify else 0
        _sync_file(partial)  # on the disk before the rename: a power cut then leaves the old file or the new one
        os.replace(partial, destination)
        partial = None
        sync_directory(destination.parent)
    except OSError as exc:  # no room, no permission, a file size limit
        raise ExportError(f"cannot write {destination} ({exc.strerror or exc}); nothing was written there",
                          "pick a path in an existing, writable directory with room for the file") from exc
    finally:
        if partial is not None:
            partial.unlink(missing_ok=True)
        if lock is not None:
            os.close(lock)
    return GGUFExportReport(path=destination, size_bytes=destination.stat().st_size, architecture=architecture,
                            file_type=file_type, tensor_types=types, verified_tensors=verified,
                            seconds=time.perf_counter() - start, notes=list(vocab.notes), file_notes=file_notes,
                            partial_notes=partial_notes)


def with_end_tokens(vocab: GGUFVocab, eos_token_ids) -> GGUFVocab:
    """``vocab`` with the ids the bundle stops at (its manifest's ``eos_token_ids``; ids past the vocabulary, which
    the file has no token for, left out) as ``eos_ids``, and with an EOS and a BOS token where the tokenizer has none.

    A tokenizer without an EOS token: llama.cpp's gpt2 vocabulary would then stop at its default id 11; the first
    id that ends the bundle's generation and that the vocabulary holds is written instead (llama.cpp passes over an
    id past the vocabulary, "bad special token", for that same default).

    A tokenizer without a BOS token (Qwen2's, Qwen3's): llama.cpp has no way to read "none" from the file and takes
    its default, token 11 of a gpt2 vocabulary (1 of a llama one; src/llama-vocab.cpp, "default special tokens"), a
    text token (',' in Qwen's and GPT-2's vocabularies) that the chat template's {{ bos_token }} and llama-server's
    /props then give. The EOS token is written instead, as llama.cpp's converter writes config.json's bos_token_id
    for these models (gguf-py SpecialVocab; Qwen's is <|endoftext|>, its EOS); tokenizer.ggml.add_bos_token false
    keeps it out of every prompt."""
    stops = tuple(int(i) for i in eos_token_ids if 0 <= int(i) < len(vocab.tokens))
    vocab = replace(vocab, eos_ids=stops)
    if vocab.eos_id is None and stops:
        vocab = replace(vocab, eos_id=stops[0])
    if vocab.bos_id is None and vocab.eos_id is not None:
        vocab = replace(vocab, bos_id=vocab.eos_id)
    return vocab


def _sync_file(path: Path) -> None:
    """Flush ``path``'s data to the disk (fsync(2)). ext4 and most file systems may write a rename before the data
    of the file renamed, so a power cut soon after an export over an earlier file (a board's SD card) would leave
    an empty or partial file at the destination with the earlier one already gone; edgesdk.bundle's commit syncs
    its files before its renames for the same reason."""
    handle = os.open(path, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)


PARTIAL_ATTEMPTS = 16  # fresh random names tried before the export gives up (one taken is already a 2^-48 chance)
PARTIAL_RANDOM_HEX = 12  # the random part of NAME.<random>.partial: 6 bytes as hexadecimal digits
STALE_PARTIAL_SECONDS = 600  # an unlocked temporary file left unmodified this long belongs to no running export


def _partial_pattern(destination: Path) -> re.Pattern:
    """The names :func:`_open_partial` gives the temporary files of exports to ``destination``, and no other."""
    return re.compile(re.escape(destination.name) + rf"\.[0-9a-f]{{{PARTIAL_RANDOM_HEX}}}\.partial")


def _lock_partial(handle) -> int | None:
    """A descriptor holding an exclusive flock(2) on the file open in ``handle`` (the export's write handle) until
    the export closes it (after the rename or the removal), so that :func:`clear_stale_partials` in another export
    never removes a file still being written or verified, however long that takes; the kernel drops the lock when the
    process dies, SIGKILL included. It is a duplicate of the write handle's descriptor, so it keeps the lock after the
    handle closes and has the write access an exclusive lock needs where flock is emulated as a POSIX lock (Linux on
    NFS), where a read-only descriptor's lock fails. None where the platform or the file system has no flock (the
    age alone then decides)."""
    try:
        import fcntl
    except ImportError:
        return None
    descriptor = os.dup(handle.fileno())
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
    except OSError:  # a file system without locks: the age alone decides
        os.close(descriptor)
        return None
    return descriptor


def _lock_holder(path: Path, flock=None) -> str | None:
    """Why ``path`` is left in place for its lock (:func:`_lock_partial`), None where no export holds it: a running
    export holds it, or it cannot be told (the file cannot be opened, or its file system takes no lock: EBADF or
    ENOLCK), and a file is never removed on a guess. It is opened for reading and writing, as the exclusive lock
    tested needs where flock is a POSIX lock (NFS); the caller has checked that it is this user's file. ``flock``:
    fcntl.flock, or a stand-in that answers as a file system would."""
    import errno

    try:
        import fcntl
    except ImportError:
        return None
    flock = fcntl.flock if flock is None else flock
    try:
        descriptor = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        return f"it cannot be opened to test whether an export holds it ({exc.strerror or exc})"
    try:
        flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return "another export still holds it open"
        if exc.errno in (errno.EBADF, errno.ENOLCK):
            return (f"its file system cannot lock it ({exc.strerror or errno.errorcode[exc.errno]}), so whether "
                    "another export is writing it cannot be told")
        return f"whether another export holds it cannot be told ({exc.strerror or exc})"
    finally:
        os.close(descriptor)
    return None


def clear_stale_partials(destination: Path, now: float | None = None) -> list[str]:
    """Remove the temporary files (``NAME.<random>.partial``) that exports to ``destination`` killed outright
    (SIGKILL, the OOM killer, a power cut) left beside it, and say what was done: one note per file found.

    Each export writes its own randomly named file (:func:`_open_partial`), so no later export writes over one left
    behind, as the old fixed name was: without this, every hard kill would leave a file of the model's size on the
    board's card for good. A file is removed only where nothing can still be writing it: a regular file of this
    user, under exactly that name, unmodified for over STALE_PARTIAL_SECONDS, and unlocked (a running export holds
    its file's lock until it renames or removes it). Any other is left, and its note names it and why."""
    import stat

    now = time.time() if now is None else now
    pattern = _partial_pattern(destination)
    try:
        found = sorted(entry for entry in destination.parent.iterdir() if pattern.fullmatch(entry.name))
    except OSError:  # an unlistable directory: the export itself then fails, naming it
        return []
    uid = os.getuid() if hasattr(os, "getuid") else None
    notes = []
    for path in found:
        try:
            info = path.lstat()
        except OSError:  # removed meanwhile (another export's own rename or removal)
            continue
        age = now - info.st_mtime
        if not stat.S_ISREG(info.st_mode):
            why = "it is no regular file"
        elif uid is not None and info.st_uid != uid:
            why = f"it belongs to another user (uid {info.st_uid})"
        elif age <= STALE_PARTIAL_SECONDS:
            why = f"it was modified {max(age, 0):.0f} s ago, so another export may still be writing it"
        elif (held := _lock_holder(path)) is not None:
            why = held
        else:
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                why = f"it cannot be removed ({exc.strerror or exc})"
            else:
                notes.append(f"removed {path}, {info.st_size / 1e6:.1f} MB left by an export that stopped "
                             f"{age / 60:.0f} minutes ago")
                continue
        notes.append(f"left {path} in place: {why}; remove it once no export is writing it (rm {path})")
    return notes


def _open_partial(destination: Path):
    """(path, binary file open for writing) of a new file beside ``destination`` under a name no other export
    picks (``NAME.<random>.partial``), created by this call with ``O_CREAT | O_EXCL | O_NOFOLLOW``: two exports to
    the same path (two shells, a script run twice) each write, verify and rename their own file, where a fixed
    partial name let one remove or rename the other's, and nothing already at a name (a link planted in a shared
    directory) is followed, written through or removed (open(2): with O_EXCL a symbolic link at the name fails with
    EEXIST). The mode is what gguf's own ``open(path, "wb")`` gives (0o666 less the umask), not mkstemp's 0o600,
    so the renamed file is readable as any file the user writes."""
    import secrets

    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(PARTIAL_ATTEMPTS):
        partial = destination.with_name(f"{destination.name}.{secrets.token_hex(PARTIAL_RANDOM_HEX // 2)}.partial")
        try:
            return partial, os.fdopen(os.open(partial, flags, 0o666), "wb")
        except FileExistsError:  # that random name is taken: draw another
            continue
    raise ExportError(f"cannot write {destination}: creating the file it is written to first "
                      f"({destination.name}.<random>.partial) in {destination.parent} failed {PARTIAL_ATTEMPTS} times "
                      "with 'file exists' under fresh random names, which a working file system does not do; "
                      "nothing was written",
                      f"check that file system (ls -la {destination.parent}; a network or FUSE mount may answer "
                      "wrongly), or write the GGUF file into a directory on another one")


def check_rotary_layers(decoder: BundleDecoder, architecture: str, bundle_dir: Path) -> None:
    """Refuse layers without rotary (NoPE, ``rope`` None) where llama.cpp's architecture would rotate them:
    ``smollm3`` skips rotary in exactly the layers ``il`` with ``(il + 1) % 4 == 0`` (src/models/smollm3.cpp,
    ``n_no_rope_layer_step`` fixed at 4), every other architecture (``deci`` included) rotates every layer."""
    count = len(decoder.layers)
    nope = [i for i, layer in enumerate(decoder.layers) if layer.rope is None]
    if architecture == "smollm3":
        expected = [i for i in range(count) if (i + 1) % SMOLLM3_NO_ROPE_STEP == 0]
        if nope != expected:
            raise ExportError(
                f"bundle {bundle_dir} holds a SmolLM3 model of {count} layers whose layers without rotary (NoPE) "
                f"are {nope}, where llama.cpp's smollm3 skips rotary in exactly layers {expected} (every fourth, "
                "(il + 1) % 4 == 0, fixed in llama.cpp) and rotates the rest; the file would compute other logits",
                "run this bundle with edgesdk (run / serve follow the model's own NoPE layers); for llama.cpp, "
                "build from a model whose no_rope_layers are 0 in layers 3, 7, 11, ... and 1 elsewhere (SmolLM3's "
                "default, no_rope_layer_interval 4), without depth pruning (prune's layers_removed 0)")
    elif nope:
        why = (" (its layers were pruned to different shapes, which only the per-layer deci architecture holds)"
               if architecture == PER_LAYER_ARCHITECTURE[0] else "")
        raise ExportError(
            f"bundle {bundle_dir}: its layers {nope} apply no rotary (NoPE), where llama.cpp's {architecture} "
            f"architecture{why} rotates every layer; the file would compute other logits",
            "run this bundle with edgesdk, or build it without prune (or with prune settings that keep every "
            "layer alike) for llama.cpp")


# GGUF architectures whose llama.cpp loader reads rope_freqs.weight (Llama 3's frequency factors)
ROPE_FREQS_ARCHITECTURES = {"llama", "deci"}


def check_rope_factors(decoder: BundleDecoder, architecture: str, bundle_dir: Path) -> None:
    """Refuse rotary frequency factors (Llama 3's scaling) where llama.cpp's architecture does not read
    ``rope_freqs.weight``: it would rotate with plain RoPE."""
    if any(factors is not None for factors in decoder.rope_factors) and architecture not in ROPE_FREQS_ARCHITECTURES:
        raise ExportError(f"bundle {bundle_dir} rotates with scaled frequencies (Llama 3's rope scaling), which "
                          f"llama.cpp's {architecture} architecture does not read (only "
                          f"{', '.join(sorted(ROPE_FREQS_ARCHITECTURES))} take rope_freqs.weight)",
                          "run this bundle with edgesdk, or build it from a model without that rope scaling")


# GGUF architectures whose llama.cpp loader sizes the optional query bias (blk.N.attn_q.bias) as the model width
# (src/llama-model.cpp, load_tensors: ``layer.bq = create_tensor(..., {n_embd}, TENSOR_NOT_REQUIRED)``), whatever the
# query projection's own rows (n_embd_head_k * n_head(il), which deci reads per layer)
QUERY_BIAS_AS_WIDE_AS_MODEL = {"llama", "deci", "qwen2"}


def check_query_bias(decoder: BundleDecoder, architecture: str, bundle_dir: Path) -> None:
    """Refuse a query bias narrower than the model where llama.cpp's architecture reads it as wide as the model.

    llama.cpp's ``llama``, ``deci`` and ``qwen2`` loaders create ``blk.N.attn_q.bias`` with the shape
    ``{n_embd}`` (src/llama-model.cpp), and the graph adds it to the query projection's output, whose rows are the
    layer's heads times the head size. A layer whose query heads span less than the width (a Qwen2 model whose GQA
    groups prune removed, written as ``deci``) holds a bias of those fewer rows, which llama.cpp refuses at load
    time ("tensor 'blk.0.attn_q.bias' has wrong shape; expected 896, got 448") and no file layout can hold."""
    if architecture not in QUERY_BIAS_AS_WIDE_AS_MODEL:
        return
    width = decoder.hidden_size
    narrow = [(i, layer.heads * decoder.head_dim) for i, layer in enumerate(decoder.layers)
              if layer.qkv_bias is not None and layer.heads * decoder.head_dim != width]
    if narrow:
        shown = ", ".join(f"layer {i}: {rows}" for i, rows in narrow[:4]) + (", ..." if len(narrow) > 4 else "")
        raise ExportError(
            f"bundle {bundle_dir}: its query projections have biases of (heads x head size {decoder.head_dim}) rows "
            f"other than the model width {width} ({shown}), where llama.cpp's {architecture} architecture reads "
            f"blk.N.attn_q.bias as {width} values and refuses the file at load time ('wrong shape'); no llama.cpp "
            "architecture with per-layer shapes (deci) sizes it otherwise",
            "run this bundle with edgesdk, or build it without removing query heads (prune's kv_group_ratio 0) "
            "for llama.cpp")


def gguf_tensors(decoder: BundleDecoder, pairwise_rope: bool) -> dict[str, Matrix]:
    """GGUF tensor name -> the bundle's matrix (rows = outputs) or vector, query/key rows reordered
    for pairwise RoPE when asked; Llama 3's frequency factors as ``rope_freqs.weight`` (hd/2,), which
    llama.cpp divides each rotary frequency by."""
    hd = decoder.head_dim
    tensors: dict[str, Matrix] = {"token_embd.weight": decoder.embed}
    if decoder.rope_factors and decoder.rope_factors[0] is not None:
        tensors["rope_freqs.weight"] = decoder.rope_factors[0]
    for i, layer in enumerate(decoder.layers):
        q_rows, kv_rows = layer.heads * hd, layer.kv_heads * hd
        qkv, gate_up = layer.units["attn.qkv"], layer.units["mlp.gate_up"]
        sections = {"q": slice(0, q_rows), "k": slice(q_rows, q_rows + kv_rows),
                    "v": slice(q_rows + kv_rows, q_rows + 2 * kv_rows)}
        order = {"q": _pairwise_order(layer.heads, hd), "k": _pairwise_order(layer.kv_heads, hd)}
        tensors[f"blk.{i}.attn_norm.weight"] = layer.input_norm
        for kind, rows in sections.items():
            weight = take_rows(qkv, rows)
            bias = None if layer.qkv_bias is None else layer.qkv_bias[rows]
            if pairwise_rope and kind in order:
                weight = take_rows(weight, order[kind])
                bias = None if bias is None else bias[order[kind]]
            tensors[f"blk.{i}.attn_{kind}.weight"] = weight
            if bias is not None:
                tensors[f"blk.{i}.attn_{kind}.bias"] = bias
        if layer.q_norm is not None:  # Qwen3, Gemma 3 (llama.cpp: LLM_TENSOR_ATTN_Q_NORM / ATTN_K_NORM)
            tensors[f"blk.{i}.attn_q_norm.weight"] = layer.q_norm
            tensors[f"blk.{i}.attn_k_norm.weight"] = layer.k_norm
        tensors[f"blk.{i}.attn_output.weight"] = layer.units["attn.o"]
        if layer.attn_out_norm is not None:  # Gemma 3 (LLM_TENSOR_ATTN_POST_NORM)
            tensors[f"blk.{i}.post_attention_norm.weight"] = layer.attn_out_norm
        tensors[f"blk.{i}.ffn_norm.weight"] = layer.post_attention_norm  # the FFN's input norm
        width = matrix_rows(gate_up) // 2
        tensors[f"blk.{i}.ffn_gate.weight"] = take_rows(gate_up, slice(0, width))
        tensors[f"blk.{i}.ffn_up.weight"] = take_rows(gate_up, slice(width, 2 * width))
        tensors[f"blk.{i}.ffn_down.weight"] = layer.units["mlp.down"]
        if layer.ffn_out_norm is not None:  # Gemma 3 (LLM_TENSOR_FFN_POST_NORM)
            tensors[f"blk.{i}.post_ffw_norm.weight"] = layer.ffn_out_norm
    tensors["output_norm.weight"] = decoder.final_norm
    if decoder.lm_head is not None:
        tensors["output.weight"] = decoder.lm_head
    return tensors


def verify_gguf(path: Path, expected: dict[str, Matrix]) -> int:
    """Read ``path`` with the ``gguf`` package and check each tensor's values against ``expected``
    (bit-exact); returns the number of tensors checked."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    reader = GGUFReader(str(path))
    found = {tensor.name: tensor for tensor in reader.tensors}
    if set(found) != set(expected):
        raise ExportError(f"{path} holds tensors {sorted(set(found) ^ set(expected))[:5]} that differ from the bundle's",
                          "report this as a bug in the GGUF export")
    for name, matrix in expected.items():
        values = decoded_values(matrix)
        stored = dequantize(found[name].data, found[name].tensor_type).reshape(values.shape)
        if not np.array_equal(stored.astype(np.float32), values):
            raise ExportError(f"{path}: tensor {name} reads back different from the bundle's weights",
                              "report this as a bug in the GGUF export")
    return len(expected)


def check_gemma3_layout(decoder: BundleDecoder, bundle_dir: Path) -> None:
    """Refuse a Gemma 3 bundle that llama.cpp's ``gemma3`` would compute differently (module docstring)."""
    problems = []
    layers = decoder.layers
    if decoder.activation != "gelu_tanh":
        problems.append(f"its FFN activation is {decoder.activation}, where llama.cpp computes GELU's tanh form")
    if not math.isclose(decoder.embed_scale, math.sqrt(decoder.hidden_size), rel_tol=1e-6):
        problems.append(f"its embedding is scaled by {decoder.embed_scale:.6g}, where llama.cpp scales by "
                        f"sqrt({decoder.hidden_size})")
    expected = gemma3_query_scalar(len(layers), decoder.hidden_size, layers[0].heads, decoder.head_dim) ** -0.5
    scale = decoder.attention_scale if decoder.attention_scale is not None else decoder.head_dim ** -0.5
    if not math.isclose(scale, expected, rel_tol=1e-6):
        problems.append(f"its attention scale is {scale:.6g} (query_pre_attn_scalar {scale ** -2:.6g}), where "
                        f"llama.cpp takes {expected:.6g} for {len(layers)} layers")
    local = [i for i in range(len(layers)) if i % GEMMA3_GLOBAL_EVERY != GEMMA3_GLOBAL_EVERY - 1]
    glob = [i for i in range(len(layers)) if i not in local]
    windowed = [i for i, layer in enumerate(layers) if layer.window is not None]
    windows = sorted({layers[i].window for i in windowed})
    if (windowed and windowed != local) or len(windows) > 1:  # none windowed: every window covers the context
        problems.append(f"its sliding-window layers are {windowed} with windows {windows}, where llama.cpp slides "
                        f"one window over layers {local}")
    local_bases = {round(decoder.rope_bases[layers[i].rope], 3) for i in local}
    global_bases = {round(decoder.rope_bases[layers[i].rope], 3) for i in glob}
    if any(not math.isclose(base, GEMMA3_LOCAL_ROPE_BASE, rel_tol=1e-3) for base in local_bases):
        problems.append(f"its sliding layers rotate at a base of {sorted(local_bases)}, where llama.cpp uses "
                        f"{GEMMA3_LOCAL_ROPE_BASE:g}")
    if len(global_bases) > 1:
        problems.append(f"its global layers rotate at bases {sorted(global_bases)}, where llama.cpp uses one")
    local_linear = sorted({decoder.rope_linear_factors[layers[i].rope] for i in local} - {1.0})
    global_linear = {decoder.rope_linear_factors[layers[i].rope] for i in glob}
    if local_linear:
        problems.append(f"its sliding layers {local} rotate with a linear scaling factor of {local_linear}, where "
                        "llama.cpp scales only the global layers (rope_freq_scale_train_swa fixed at 1)")
    if len(global_linear) > 1:
        problems.append(f"its global layers rotate with linear scaling factors {sorted(global_linear)}, where "
                        "llama.cpp uses one")
    if problems:
        raise ExportError(f"bundle {bundle_dir} holds a Gemma 3 model that llama.cpp's gemma3 would compute "
                          "differently: " + "; ".join(problems), "run this bundle with edgesdk")


def rope_linear_factor(decoder: BundleDecoder, architecture: str) -> float:
    """The file's ``rope.scaling.factor`` (1.0: no linear scaling): the global layers' factor for a checked Gemma 3
    bundle (none where the model has fewer than six layers), else rotary table 0's, which every layer reads."""
    if architecture != "gemma3":
        return decoder.rope_linear_factors[0] if decoder.rope_linear_factors else 1.0
    glob = [layer for i, layer in enumerate(decoder.layers) if i % GEMMA3_GLOBAL_EVERY == GEMMA3_GLOBAL_EVERY - 1]
    return decoder.rope_linear_factors[glob[0].rope] if glob else 1.0


def gemma3_window_and_base(decoder: BundleDecoder, model_window: int | None = None) -> tuple[int, float]:
    """(``attention.sliding_window``, ``rope.freq_base``) of a checked Gemma 3 bundle: the sliding layers'
    window; where no layer's window is shorter than the context (the graph then holds none), the model's
    (``model_window``, :func:`recorded_window`), or the context where the manifest does not record it; the global
    layers' rotary base (the local one where the model has fewer than six layers, none of them global for
    llama.cpp)."""
    windows = [layer.window for layer in decoder.layers if layer.window is not None]
    glob = [layer for i, layer in enumerate(decoder.layers) if i % GEMMA3_GLOBAL_EVERY == GEMMA3_GLOBAL_EVERY - 1]
    base = decoder.rope_bases[glob[0].rope] if glob else GEMMA3_LOCAL_ROPE_BASE
    return (windows[0] if windows else model_window or decoder.max_context), base


def recorded_window(manifest: dict) -> int | None:
    """The model's attention window as the manifest records it (``model.after.sliding_window``), or None: bundles
    built before it was recorded lack it (``model.after`` itself every bundle has: :func:`export_gguf` reads its
    ``architecture``)."""
    return manifest["model"]["after"].get("sliding_window")


def unknown_window_note(decoder: BundleDecoder, manifest: dict) -> str | None:
    """The note for a Gemma 3 bundle whose window the file cannot carry: no layer of its graph slides over
    fewer tokens than its context, and its manifest does not record the model's window. None where it is known."""
    if any(layer.window is not None for layer in decoder.layers) or recorded_window(manifest) is not None:
        return None
    context = decoder.max_context
    return ("the bundle's manifest does not record its model's sliding window "
            "('model.after.sliding_window', which bundles built by older edgesdk releases lack) and its graph, "
            f"made for a context of {context} tokens, slides over no shorter window, so the file's "
            f"gemma3.attention.sliding_window is written as {context}: llama.cpp run with a context longer than "
            f"{context} tokens (-c) would slide its local layers over {context} tokens where the model slides over "
            f"its own window; run llama.cpp with -c {context} at most, or rebuild the bundle with an edgesdk that "
            "records the window")


def _pairwise_order(heads: int, head_dim: int) -> np.ndarray:
    """Row order that turns rotate-half query/key rows into llama.cpp's adjacent-pair order."""
    return np.arange(heads * head_dim).reshape(heads, 2, head_dim // 2).transpose(0, 2, 1).reshape(-1)


def layer_shapes(decoder: BundleDecoder) -> LayerShapes:
    """The bundle's query heads, KV heads and FFN width, layer by layer."""
    return LayerShapes(heads=tuple(layer.heads for layer in decoder.layers),
                       kv_heads=tuple(layer.kv_heads for layer in decoder.layers),
                       ffn=tuple(matrix_rows(layer.units["mlp.gate_up"]) // 2 for layer in decoder.layers))


def _chat_template(bundle, tokenizer: dict) -> str | None:
    name = tokenizer.get("chat_template")
    return bundle.file(name).read_text(encoding="utf-8") if name and bundle.file(name).is_file() else None


# a quantization type at the end of a GGUF file's name (SmolLM2-135M-Instruct.Q4_1, model-Q4_K_M, x-f16): the source
# file's, which a bundle's weights no longer are
QUANT_SUFFIX = re.compile(r"[.\-_](?:I?Q\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|FP16|FP32)$", re.IGNORECASE)
# general.* keys of a model card (gguf-py's Keys.General) carried from the source into the manifest's model.before.card
# (edgesdk.models.loader.source_card) and written back: the name goes into general.name (gguf_name)
CARD_KEYS = GGUF_CARD_KEYS


def model_card(manifest: dict) -> dict:
    """The source model's card as the manifest records it (``model.after.card``, else ``model.before.card``): general.*
    key (less ``general.``) -> a string or a list of strings; empty for a model without one and for bundles built
    before edgesdk recorded it. Values of another type are left out: the file must hold what gguf-py's readers take."""
    model = manifest.get("model") or {}
    card = (model.get("after") or {}).get("card") or (model.get("before") or {}).get("card") or {}
    return {key: value for key, value in card.items() if key in CARD_KEYS and (
        (isinstance(value, str) and value) or (isinstance(value, list) and value
                                               and all(isinstance(item, str) for item in value)))}


def alias_title(source: str) -> str | None:
    """For a model built from one of edgesdk's aliases (the manifest's ``source``), the name its file is published
    under, written as llama.cpp's converter writes a model's name from its identifier (gguf-py's
    ``Metadata.id_to_title``): ``smollm2-135m`` is ``SmolLM2-135M-Instruct.Q4_1.gguf``, so "SmolLM2 135M Instruct".
    None for any other source. The alias's own file holds a card whose name its converter took from the training
    checkpoint's directory ("Smollm2 135M 8k Lc100K Mix1 Ep2", basename "smollm2", finetune "8k-lc100k-mix1-ep2"),
    which says neither that the model is the instruction-tuned one nor what Hugging Face and llama.cpp users know it
    as; the alias itself ("smollm2-135m") drops "Instruct" too."""
    from gguf.metadata import Metadata

    from edgesdk.models.sources import ALIASES

    alias = ALIASES.get(source)
    if alias is None:
        return None
    stem = Path(alias.member).name
    if stem.lower().endswith(".gguf"):
        stem = QUANT_SUFFIX.sub("", stem[:-len(".gguf")]) or stem
    return Metadata.id_to_title(stem)


def gguf_name(manifest: dict) -> str:
    """The file's ``general.name``: the model's name, the recipe and the bundle. The model's name is an alias's
    published one (:func:`alias_title`), else its card's (a GGUF source's ``general.name`` or ``general.basename``),
    else the source's (a directory's or file's name, not its path) without a GGUF file's extension and quantization
    type: the exported file's weights are the bundle's, so ``SmolLM2-135M-Instruct.Q4_1.gguf`` would name a Q4_1 file
    for F32 ones. A GGUF file's own card keeps its name otherwise: its author chose it, and llama.cpp reads tokenizer
    behaviour from it (export/gguf_vocab.py: ``rstrip``, which checks the name written), as edgesdk's GGUF loader read
    the source's own ``general.name``."""
    card = model_card(manifest)
    source = str(manifest["model"]["after"]["source"])
    name = alias_title(source) or card.get("name") or card.get("basename")
    if not name:
        name = Path(source).name or source
        if name.lower().endswith(".gguf"):
            name = QUANT_SUFFIX.sub("", name[:-len(".gguf")]) or name
    return f"{name} ({manifest['recipe']['name']}, edgesdk bundle {manifest['bundle_id']})"


def trained_context(manifest: dict, decoder: BundleDecoder) -> int:
    """The file's ``{arch}.context_length``: the model's trained positions (the manifest's
    ``max_position_embeddings``), which llama.cpp's converter writes and llama.cpp and Ollama read as the trained
    context (n_ctx_train: the -c default, the rope scaling's reference, what a GGUF read back gives a new build). The
    bundle's own --max-context only sizes the ONNX graph's tables and caches, not the weights; bundles built before
    the manifest recorded the positions give it."""
    from edgesdk.bundle import model_positions

    return model_positions(manifest) or decoder.max_context


def file_card(manifest: dict, parameters: int | None = None) -> dict:
    """:func:`model_card` less what the bundle made untrue. ``size_label`` where the bundle's parameter count differs
    from its source's (``model.after`` / ``model.before`` ``parameters``: pruning removed channels, heads or layers):
    recomputed from ``parameters`` (the file's own tensors' elements) as llama.cpp's converter labels a model it writes
    (gguf-py's ``size_label``: 135M, 87M, 1.7B), or left out where that count is not given; a source's "135M" on an
    87M-parameter file would mislead every model list that shows it. ``finetune`` where LoRA adapters were merged
    (``model.before.adapters``): the weights are no longer the source's fine-tune, and the adapters carry no name of
    theirs to put there."""
    from gguf.utility import size_label

    card = model_card(manifest)
    model = manifest.get("model") or {}
    before, after = model.get("before") or {}, model.get("after") or {}
    counts = before.get("parameters"), after.get("parameters")
    if "size_label" in card and all(isinstance(count, int) for count in counts) and counts[0] != counts[1]:
        if parameters:
            card["size_label"] = size_label(parameters, parameters, 0, 0)
        else:
            card.pop("size_label")
    if before.get("adapters") or after.get("adapters"):
        card.pop("finetune", None)
    return card


def tensor_elements(tensors: dict) -> int:
    """The weights' count over ``tensors`` (GGUF name -> :class:`BlockQuantized` or array),
    as llama.cpp's converter counts a file's parameters for its size label (every tensor written, norms included)."""
    return sum(value.n * value.k if isinstance(value, BlockQuantized) else int(np.size(value))
               for value in tensors.values())


def add_card(writer, manifest: dict, parameters: int | None = None) -> None:
    """The source's model card (:func:`file_card`: :func:`model_card` less what the bundle made untrue, and less its
    name, which :func:`gguf_name` writes) as the general.* keys llama.cpp's converter writes from a model card and
    llama.cpp, Ollama and Hugging Face's GGUF viewer show (license, organization, basename, size label ...).
    ``parameters``: the file's weights' count (:func:`tensor_elements`), which a changed size label is computed from.
    Written by key name: gguf-py's ``add_*`` adders for them changed across its releases."""
    for key, value in file_card(manifest, parameters).items():
        if key == "name":
            continue
        if isinstance(value, str):
            writer.add_string(f"general.{key}", value)
        else:
            writer.add_array(f"general.{key}", value)


def writes_head_size(model_type: str, decoder: BundleDecoder, shape: LayerShapes) -> bool:
    """Whether the file gives ``attention.key_length`` / ``value_length`` for a bundle of ``model_type`` (its
    manifest's architecture). llama.cpp takes the head size as the width over layer 0's head count where they are
    absent, so they are needed for per-layer shapes and for heads of another size. Its ``convert_hf_to_gguf.py``
    also writes them whenever config.json has ``head_dim`` (``TextModel.set_gguf_parameters``), which the configs of
    Llama, Mistral, Qwen3 and Gemma 3 always hold as transformers saves them (HEAD_SIZE_ALWAYS_GIVEN): written for
    those too, as readers that take the head size from these keys alone (transformers' gemma3 and qwen3_moe
    mappings) fall back to their own defaults."""
    return (not shape.uniform or decoder.head_dim * shape.heads[0] != decoder.hidden_size
            or model_type in HEAD_SIZE_ALWAYS_GIVEN)


def _write(path: Path, architecture: str, decoder: BundleDecoder, shape: LayerShapes, vocab: GGUFVocab,
           encoded: dict, file_type: str, manifest: dict, chat_template: str | None, handle=None,
           parameters: int | None = None) -> None:
    """The GGUF file at ``path``, written into ``handle`` (a binary file already open at ``path``, see
    :func:`_open_partial`) where given, else opened by gguf's writer. ``parameters``: the weights' count
    (:func:`tensor_elements`), for the card's size label."""
    from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, RopeScalingType
    from gguf.gguf_writer import WriterState

    writer = GGUFWriter(str(path), architecture)
    writer.add_name(gguf_name(manifest))
    add_card(writer, manifest, parameters)
    writer.add_file_type({"Q4_0": LlamaFileType.MOSTLY_Q4_0, "Q8_0": LlamaFileType.MOSTLY_Q8_0,
                          "F32": LlamaFileType.ALL_F32}[file_type])
    if any(data.quant is not None for data in encoded.values()):  # the GGUF spec: present where any tensor is
        writer.add_quantization_version(2)  # quantized, whatever the majority type general.file_type names
    writer.add_context_length(trained_context(manifest, decoder))
    writer.add_embedding_length(decoder.hidden_size)
    writer.add_block_count(len(decoder.layers))
    writer.add_feed_forward_length(shape.metadata(shape.ffn))
    writer.add_head_count(shape.metadata(shape.heads))
    writer.add_head_count_kv(shape.metadata(shape.kv_heads))
    if writes_head_size(manifest["model"]["after"]["architecture"], decoder, shape):
        writer.add_key_length(decoder.head_dim)
        writer.add_value_length(decoder.head_dim)
    writer.add_rope_dimension_count(decoder.head_dim)
    if architecture == "gemma3":
        window, base = gemma3_window_and_base(decoder, recorded_window(manifest))
        writer.add_sliding_window(window)
        writer.add_rope_freq_base(base)
        # Ollama runs gemma3 in its own engine (fs/ggml/ggml.go, OllamaEngineRequired), whose gemma3 reads the
        # global layers' base from rope.global.freq_base (default 1,000,000; later versions: rope.freq_base) and
        # the sliding layers' from rope.local.freq_base (model/models/gemma3/model_text.go), the keys its own
        # converter writes (convert/convert_gemma3.go): written too, or a global base other than 1,000,000 would
        # rotate at 1,000,000 there. llama.cpp reads neither and passes over them.
        writer.add_float32(f"{architecture}.rope.global.freq_base", base)
        writer.add_float32(f"{architecture}.rope.local.freq_base", GEMMA3_LOCAL_ROPE_BASE)
    else:
        writer.add_rope_freq_base(decoder.rope_base)
    linear = rope_linear_factor(decoder, architecture)
    if linear != 1.0:  # llama.cpp: freq_scale 1 / factor (the sliding layers of gemma3 excepted, kept at 1)
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(linear)
    writer.add_layer_norm_rms_eps(decoder.rms_eps)
    add_tokenizer(writer, vocab, chat_template)
    add_sampling(writer, (manifest.get("generation") or {}).get("sampling") or {})
    for name, data in encoded.items():
        raw = None if data.quant is None else GGMLQuantizationType[data.quant]
        writer.add_tensor(name, data.data, raw_dtype=raw)
    if handle is not None:  # once every tensor is added: open_output_file takes an open one-file output as it is
        writer.fout, writer.state = [handle], WriterState.EMPTY
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:  # also when a write fails, so that the partial file is not left open
        writer.close()


def add_sampling(writer, sampling: dict) -> None:
    """The model's own sampling settings (the manifest's ``generation.sampling``) as the ``general.sampling.*`` keys
    llama.cpp reads for every option its user does not set (common/common.cpp, common_init_sampler_from_model), of the
    types gguf-py's ``add_sampling_*`` write: temp, top_p, min_p and penalty_repeat FLOAT32, top_k and
    penalty_last_n INT32, sequence a string of sampler names separated by ';'.

    Written by key name through the writer's typed adders: gguf 0.16 and 0.17, which edgesdk takes (gguf>=0.16), have
    no ``add_sampling_*`` methods."""
    from edgesdk.models.generation_defaults import GGUF_KEYS, INT32_FIELDS

    for key, name in GGUF_KEYS.items():  # general.sampling.<key> -> the manifest's field
        if name not in sampling:
            continue
        full_key = f"general.sampling.{key}"
        if name == "samplers":
            writer.add_string(full_key, ";".join(sampling[name]))
        elif name in INT32_FIELDS:
            writer.add_int32(full_key, int(sampling[name]))
        else:
            writer.add_float32(full_key, float(sampling[name]))


def end_of_turn_keys(vocab: GGUFVocab) -> tuple[dict[str, int], list[int]]:
    """The ``tokenizer.ggml.eot_token_id`` / ``eom_token_id`` keys that make llama.cpp stop at every id the bundle
    stops at (``vocab.eos_ids``), and the ids beyond what those two keys can hold (llama.cpp runs past them).

    llama.cpp reads no list of end ids: its vocab loader ends generation at the EOS token, at each token whose text is
    one of its own (``<|im_end|>``, ``<end_of_turn>``, ``<|endoftext|>`` ...: ``special_eog_ids`` in
    src/llama-vocab.cpp, edgesdk.runtime.text.end_of_generation_ids) and at the EOT and EOM tokens. A stop token of
    another text (OpenChat's ``<|end_of_turn|>``, Command-R's ``<|END_OF_TURN_TOKEN|>``, beside an EOS token) is
    written as the EOT token, or as the EOM token where the vocabulary holds a token llama.cpp takes as its EOT by
    text (``find EOT token``; a written key replaces that detection), and a second one in the other key."""
    from edgesdk.runtime.infill_sampler import EOT_TEXTS
    from edgesdk.runtime.text import end_of_generation_ids

    ids: dict[str, int] = {}
    for index, token in enumerate(vocab.tokens):  # llama.cpp's token_to_id: the last id of a repeated text
        ids[token] = index
    stops = end_of_generation_ids(ids.get, () if vocab.eos_id is None else (vocab.eos_id,))
    missing = sorted(set(vocab.eos_ids) - stops)
    keys = ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"]
    if any(text in ids for text in EOT_TEXTS):
        keys.reverse()
    return dict(zip(keys, missing, strict=False)), missing[len(keys):]


def add_tokenizer(writer, vocab: GGUFVocab, chat_template: str | None) -> None:
    """The ``tokenizer.ggml.*`` keys llama.cpp's vocabulary loader reads (``llama_vocab::impl::load``) and the
    chat template, on the GGUF writer ``writer``."""
    writer.add_vocab_size(len(vocab.tokens))
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.model == "llama":  # SentencePiece: merges by score, no merge list
        writer.add_token_scores(vocab.scores)
        writer.add_add_space_prefix(vocab.add_space_prefix)
    else:
        writer.add_token_merges(vocab.merges)
    for value, add in ((vocab.bos_id, writer.add_bos_token_id), (vocab.eos_id, writer.add_eos_token_id),
                       (vocab.unk_id, writer.add_unk_token_id), (vocab.pad_id, writer.add_pad_token_id)):
        if value is not None:
            add(value)
    if set(vocab.eos_ids) - {vocab.eos_id}:
        # Every id the bundle stops at, where there are others than the EOS token (Gemma 3's <end_of_turn> beside
        # <eos>; a ChatML model's <|endoftext|> beside <|im_end|>): Ollama's converter writes generation_config's
        # eos_token_id list under this key (convert/tokenizer.go, SpecialVocabulary.IDs; INT32 array) and its
        # engine stops at tokenizer.ggml.eos_token_id and each of these. llama.cpp reads no such key (it takes its
        # end-of-generation set from eos_token_id and the tokens' texts) and passes over it.
        writer.add_array("tokenizer.ggml.eos_token_ids", sorted(vocab.eos_ids))
    for key, value in end_of_turn_keys(vocab)[0].items():
        writer.add_uint32(key, value)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)  # unwritten, llama.cpp adds none to a gpt2 or llama vocabulary
    if chat_template:
        writer.add_chat_template(chat_template)
