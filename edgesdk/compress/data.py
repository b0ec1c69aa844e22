"""Training text for the compression stages: token blocks cut from text files, optionally joined
by text the teacher generates itself (data-free distillation, Liu et al. 2023 "LLM-QAT").

The evaluation slice must never be trained on: ``skip_chars`` leaves out the head of every file
(the perplexity measure reads the first 200,000 characters of wiki.valid.raw).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from edgesdk.errors import BuildError, read_utf8


@dataclass(frozen=True)
class DataConfig:
    """Where training tokens come from (one config shared by the stages of a build)."""

    files: tuple[str, ...] = ()  # plain-text files; empty = teacher-generated text only
    skip_chars: int = 0  # leading characters of each file left out (keep evaluation text unseen)
    generated_sequences: int = 32  # teacher continuations added (data-free distillation; 0 = none)
    generated_tokens: int = 256  # length of each teacher continuation
    seed: int = 0  # shuffling and prompt choice

    def __post_init__(self):
        for name in ("skip_chars", "generated_sequences", "generated_tokens"):
            if getattr(self, name) < 0:
                raise BuildError(f"data setting {name} is {getattr(self, name)}; it must be >= 0",
                                 "pass 0 or a positive number (--data-skip-chars, --generated-sequences)")
        if self.generated_sequences and self.generated_tokens < 1:  # generate() refuses max_new_tokens 0
            raise BuildError(f"data setting generated_tokens is {self.generated_tokens} with generated_sequences "
                             f"{self.generated_sequences}: each teacher continuation needs at least 1 token",
                             "set generated_tokens to 1 or more, or --generated-sequences 0 for no teacher text")

    def check_files(self, terms: str = "cli") -> None:
        """Every --data file exists, is UTF-8 text and keeps text after the skipped characters; checked
        before the model loads, so a typo costs seconds, not a model load. ``terms``: whose names a refusal
        gives the options (:func:`read_training_text`).

        A file given twice (under one name or two: ``wiki.txt`` and ``./wiki.txt``, or a link to it) is refused:
        its tokens would be in the pool twice, drawn for training twice as often as every other file's."""
        seen: dict[Path, str] = {}
        for name in self.files:
            read_training_text(Path(name), self.skip_chars, terms)
            same = Path(name).resolve()
            if same in seen:
                again = "again" if seen[same] == name else f"again as {name}"
                data = _option("--data", terms)
                raise BuildError(f"training text {seen[same]} is given {again} ({data} twice): its text would be "
                                 "trained on twice as often as the other files'",
                                 f"pass each file to {data} once")
            seen[same] = name


def no_training_text(terms: str = "cli", why: str = "") -> BuildError:
    """The refusal of stages that read training text where there is none: no --data and no teacher text
    (--generated-sequences 0). ``why`` says which stages read it and what was given, where that is known before
    the model loads (edgesdk/build/pipeline.py ``check_training_text``)."""
    fix = ("pass --data FILE (plain text), or --generated-sequences N with N > 0 for teacher-generated text"
           if terms != "python" else
           "pass data='FILE' (plain text), or generated_sequences=N with N > 0 for teacher-generated text")
    return BuildError("the compression stages have no training text" + (f": {why}" if why else ""), fix)


def _option(option: str, terms: str) -> str:
    """``edgesdk build``'s ``option`` (--data), or for ``terms`` "python" build_bundle()'s argument (data)."""
    from edgesdk.build.checkpoint import said

    return said(option, terms)


def read_training_text(path: Path, skip_chars: int = 0, terms: str = "cli") -> str:
    """A --data file's text after its first ``skip_chars`` characters, or a BuildError naming the problem, with
    the options in the caller's ``terms``: ``--data`` for edgesdk build, ``data`` for build_bundle()."""
    data = _option("--data", terms)
    if not path.exists():
        raise BuildError(f"training text {path} does not exist", f"pass an existing plain-text file to {data}")
    if not path.is_file():
        kind = "a directory" if path.is_dir() else "not a regular file (a device, pipe or socket)"
        raise BuildError(f"training text {path} is {kind}", f"pass a plain-text file to {data}")
    text = read_utf8(path, "training text", BuildError)
    if not text.strip():  # no skip leaves text: a smaller --data-skip-chars is no fix
        held = f"holds only whitespace ({len(text)} characters)" if text else "is empty"
        raise BuildError(f"training text {path} {held}", f"pass a plain-text file with text in it to {data}")
    if not text[skip_chars:].strip():
        last = len(text.rstrip()) - 1  # the largest skip that keeps the last non-whitespace character
        raise BuildError(f"training text {path} is empty after skipping {skip_chars} characters: it holds "
                         f"{len(text)} characters, the last of its text at position {last}",
                         f"pass a longer file or a {_option('--data-skip-chars', terms)} of at most {last}")
    return text[skip_chars:]


class TokenData:
    """A pool of token ids to cut (batch, length) training blocks from.

    ``bos_id`` is the token the tokenizer puts in front of every text (Gemma, Llama 2 / TinyLlama: the
    runtime always decodes after it), and every block :meth:`batches` cuts starts with it; None where
    the tokenizer adds none (SmolLM2, Qwen)."""

    def __init__(self, ids: torch.Tensor, generated: int, bos_id: int | None = None, terms: str = "cli"):
        self.ids = ids  # (N,) int64
        self.generated_tokens = generated
        self.bos_id = bos_id
        self.terms = terms  # whose names a refusal gives the options: edgesdk build's, or build_bundle()'s

    @classmethod
    def load(cls, config: DataConfig, tokenizer, teacher=None, progress: bool = False,
             terms: str = "cli") -> TokenData:
        """The files' tokens, then the teacher's text; ``terms`` (BuildConfig.terms) names the options in the
        refusals: ``--data`` for edgesdk build, ``data`` for build_bundle()."""
        pieces: list[torch.Tensor] = []
        for name in config.files:
            text = read_training_text(Path(name), config.skip_chars, terms)
            pieces.append(torch.tensor(tokenizer(text)["input_ids"], dtype=torch.long))
        generated = 0
        if config.generated_sequences and teacher is not None:
            sample = cached_teacher_text(teacher, tokenizer, config, progress)
            generated = int(sample.numel())
            pieces.append(sample)
        if not pieces:
            raise no_training_text(terms)
        ids = torch.cat(pieces)
        from edgesdk.evaluate import leading_bos

        return cls(ids, generated, leading_bos(tokenizer), terms)

    def batches(self, count: int, batch_size: int, length: int, seed: int,
                stage: str | None = None) -> list[torch.Tensor]:
        """``count`` random (batch_size, length) blocks, reproducible for a seed. A block is the model's
        input and (shifted by one inside it) its targets, so ``length`` tokens make one block and every
        start from 0 to ``N - length`` is drawn: the last token of the pool is trained on too.
        ``stage`` (whose ``sequence_length`` is ``length``) names the setting a refusal points to.

        Where the tokenizer adds a BOS (``bos_id``), a block's first token is replaced by it, as
        llama.cpp's imatrix and perplexity tools do for every chunk when the vocab adds BOS
        (``tokens[batch_start] = llama_vocab_bos(vocab)``): the runtime always has BOS at position 0,
        and its activations (often a model's largest: Sun et al. 2024, "Massive Activations in Large
        Language Models") belong in SmoothQuant's peaks, the static activation scales, the Fisher
        batches and the teacher KL. Replaced rather than prepended: the starts, the length and the
        targets (positions 1 on, so BOS is never a target) stay as drawn, and a block that starts at a
        file's own BOS is unchanged (prepending would make it BOS BOS). A one-token block keeps its token
        (a block of only BOS calibrates on no text). Without ``bos_id`` the blocks are the drawn slices."""
        tokens = self.ids.numel()
        if tokens < length:
            from edgesdk.build.checkpoint import said

            terms = self.terms
            setting = f"{stage}.sequence_length" if stage else "sequence_length"
            shorter = (said("--set", terms, f"{setting}={tokens}") if stage and tokens >= 2 else
                       f"a shorter {setting}")
            raise BuildError(f"training text has {tokens} tokens, fewer than one block of {length} ({setting})",
                             f"pass more text with {said('--data', terms)} (or more teacher text, "
                             f"{said('--generated-sequences', terms)}), or {shorter}")
        generator = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, tokens - length + 1, (count, batch_size), generator=generator)
        blocks = [torch.stack([self.ids[s: s + length] for s in row.tolist()]) for row in starts]
        if self.bos_id is not None and length > 1:
            for block in blocks:  # torch.stack made copies: the pool is left as it was
                block[:, 0] = self.bos_id
        return blocks


def heldout_text(config: DataConfig, limit: int = 40_000) -> str:
    """The first ``min(skip_chars, limit)`` characters of the first file: text never trained on."""
    if not config.files or config.skip_chars <= 0:
        return ""
    return Path(config.files[0]).read_text(encoding="utf-8")[: min(config.skip_chars, limit)]


PROMPTS = (
    "The history of", "In mathematics,", "Once upon a time", "The city is known for",
    "Scientists have discovered", "The following is a list of", "He was born in", "The album was released",
    "Write a short story about", "Explain how", "The river flows", "During the war,",
)


# continuations end at their first EOS (no padding runs), sampled with SAMPLING whatever the model's own
# generation config asks (older text took its top_k, repetition penalty ...), each prompt encoded as the
# runtime encodes one: BOS where the tokenizer adds it, never a trailing EOS (older text of an add_eos_token
# tokenizer continued after "prompt EOS")
TEACHER_TEXT_FORMAT = "cut-after-eos/sampling-pinned/prompt-without-eos"
# temperature 1, top-p 0.95 and transformers' default top-k 50, pinned; no penalty or other filter
SAMPLING = {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 50}


def hash_weights(digest, model) -> None:
    """Feed every tensor of the state dict (name, shape, dtype and its bytes) into ``digest``: exact and
    independent of thread counts, unlike floating-point sums (SmolLM2-135M: about a second)."""
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:".encode())
            raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)  # bytes, bfloat16 included
            digest.update(raw.numpy())  # read through the buffer protocol, no copy


def teacher_key(teacher, config: DataConfig, tokenizer=None) -> str:
    """Names the teacher text: the model (config and a fingerprint of every weight, not only the
    embedding: a fine-tune often leaves that untouched), the tokenizer that encodes its prompts and
    whose ids the text holds (its vocabulary, merges, normalizer and whether it adds BOS), and the
    sampling settings."""
    import hashlib

    from edgesdk.evaluate import leading_bos

    digest = hashlib.sha256(teacher.config.to_json_string().encode())
    hash_weights(digest, teacher)
    if tokenizer is not None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        digest.update((backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items())))
                      .encode())
        digest.update(f"{leading_bos(tokenizer)}".encode())
    digest.update(f"{config.generated_sequences}/{config.generated_tokens}/{config.seed}/{PROMPTS}".encode())
    digest.update(TEACHER_TEXT_FORMAT.encode())  # a cache written in an older format is not reused
    return digest.hexdigest()[:20]


def cached_teacher_text(teacher, tokenizer, config: DataConfig, progress: bool) -> torch.Tensor:
    """Teacher text is sampled once per model and settings and kept in the user cache: builds of
    several recipes from one model share it (sampling 16k tokens takes minutes on a CPU).

    The cache only saves time: a cached file that cannot be read as token ids is sampled again
    (and replaced), and a cache that cannot be written (a read-only home, a full disk) is a warning,
    the build going on with the text it sampled."""
    import contextlib
    import os
    import sys

    from edgesdk.models.sources import cache_dir

    path = cache_dir() / "teacher-text" / f"{teacher_key(teacher, config, tokenizer)}.pt"
    if path.is_file():
        try:
            cached = torch.load(path, weights_only=True)  # a tensor; a planted pickle must not run (torch < 2.6)
        except Exception as exc:  # torch.load fails in many ways on a damaged file (EOFError, RuntimeError, KeyError)
            cached = exc
        if isinstance(cached, torch.Tensor) and cached.dtype == torch.long and cached.dim() == 1 and cached.numel():
            return cached
        found = f"torch.load raised {type(cached).__name__}" if isinstance(cached, Exception) else "another object"
        print(f"edgesdk build: warning: the cached teacher text {path} is damaged ({found}, not a tensor of token "
              "ids); sampling it again", file=sys.stderr)
    sample = generate_text(teacher, tokenizer, config, progress)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # two builds at once write a file each
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(sample, partial)
        os.replace(partial, path)
    except (OSError, RuntimeError) as exc:  # torch.save's writer reports a failed write as a RuntimeError
        with contextlib.suppress(OSError):  # a half-written file is not left behind
            partial.unlink(missing_ok=True)
        print(f"edgesdk build: warning: the teacher text could not be kept in the cache {path.parent} "
              f"({getattr(exc, 'strerror', None) or exc}); this build goes on with it, the next one samples it "
              "again: set EDGESDK_CACHE to a writable directory", file=sys.stderr)
    return sample


def eos_ids(model, tokenizer) -> set[int]:
    """Every id that ends a generation: the tokenizer's EOS and the model's generation config's."""
    ids: set[int] = set()
    for value in (getattr(getattr(model, "generation_config", None), "eos_token_id", None),
                  getattr(model.config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def cut_after_eos(sequence: torch.Tensor, start: int, stops: set[int]) -> torch.Tensor:
    """``sequence`` (T,) up to and including the first stop id at or after ``start``.

    A batch of sampled continuations comes back padded to the longest one; the padding repeats
    the EOS id, so without the cut a third of SmolLM2's teacher text was runs of ``<|im_end|>``
    that every stage trained on and the power stage's sweep scored (17.7 nats a token).
    """
    generated = sequence[start:]
    hits = torch.isin(generated, torch.tensor(sorted(stops), dtype=sequence.dtype)).nonzero()
    return sequence if hits.numel() == 0 else sequence[: start + int(hits[0, 0]) + 1]


def prompt_ids(tokenizer, prompt: str) -> list[int]:
    """A teacher-text prompt's ids as the runtime and llama.cpp encode a prompt to continue: the BOS the
    tokenizer puts first (:func:`edgesdk.runtime.fim.leading_bos`; none for SmolLM2, Qwen), then the text,
    never the EOS a tokenizer with ``add_eos_token`` puts after it. With that EOS the prompt is a finished
    document, so the "continuation" was sampled after an end of text, not conditioned on the prompt
    (llama-cli and llama-perplexity refuse such a vocabulary: ``GGML_ASSERT(!llama_vocab_get_add_eos(vocab))``)."""
    from edgesdk.evaluate import leading_bos

    bos = leading_bos(tokenizer)
    return ([] if bos is None else [bos]) + list(tokenizer(prompt, add_special_tokens=False)["input_ids"])


def generate_text(teacher, tokenizer, config: DataConfig, progress: bool, batch: int = 8) -> torch.Tensor:
    """Sampled teacher continuations of short prompts (``SAMPLING``: temperature 1, top-p 0.95, top-k
    50; each prompt encoded by :func:`prompt_ids`), ``batch`` per prompt at once (batched decoding is
    several times faster per token on a CPU), each cut after its first EOS, concatenated. The model's own
    generation config gives only its token ids: transformers fills every setting a call leaves out from it,
    so Qwen3's top_k 20 or a repetition penalty would shape the text (and the cache, keyed by the weights,
    would not say so).

    The sampling seeds the global RNG (``generate`` draws from it) inside a fork, so the caller's
    stream is left as it was: the power stage initialises its adapters from that stream after
    loading the text, and a build that samples must get the adapters a build reading the cache gets."""
    with torch.random.fork_rng():
        return _generate_text(teacher, tokenizer, config, progress, batch)


def _generate_text(teacher, tokenizer, config: DataConfig, progress: bool, batch: int) -> torch.Tensor:
    from tqdm import tqdm
    from transformers import GenerationConfig

    stops = eos_ids(teacher, tokenizer)
    generator = torch.Generator().manual_seed(config.seed)
    chunks = []
    rounds = -(-config.generated_sequences // batch)
    own = teacher.generation_config
    teacher.generation_config = GenerationConfig(**{name: getattr(own, name, None)
                                                    for name in ("bos_token_id", "eos_token_id", "pad_token_id")})
    try:
        for index in tqdm(range(rounds), desc="teacher text", disable=not progress, unit="batch"):
            count = min(batch, config.generated_sequences - index * batch)
            prompt = PROMPTS[int(torch.randint(len(PROMPTS), (1,), generator=generator))]
            ids = torch.tensor([prompt_ids(tokenizer, prompt)], dtype=torch.long)
            torch.manual_seed(config.seed * 100_003 + index)
            with torch.no_grad():
                out = teacher.generate(ids, max_new_tokens=config.generated_tokens, num_return_sequences=count,
                                       pad_token_id=tokenizer.eos_token_id, **SAMPLING)  # (count, prompt + new)
            chunks.extend(cut_after_eos(row, ids.shape[1], stops) if stops else row for row in out)
    finally:
        teacher.generation_config = own
    return torch.cat(chunks)
