"""``edgesdk embed``: the embeddings of texts through a bundle's runtime, as llama.cpp's ``llama-embedding``
(examples/embedding/embedding.cpp) takes them and prints them (registered in :mod:`edgesdk.cli`; the pooling and
normalisation are :mod:`edgesdk.runtime.embedding`).

The text of ``--prompt`` (each one given) and of ``--file`` (its line ends as they are, one trailing newline
dropped, as llama.cpp's ``-f`` reads a file; ``-f -`` reads stdin so, as ``edgesdk run -f -`` does) is split at
``--embd-separator`` (a newline by default) and each piece is one input, as llama-embedding's ``split_lines``. Each
is tokenized with the model's special tokens and embedded on its own; all are tokenized and checked against the
context before the first is embedded, as llama-embedding tokenizes them before its first batch.

``--embd-output-format`` prints as llama-embedding does:

- ``""`` (the default): ``embedding N: v v v ...`` a line (``%9.6f`` each, ``%6.0f`` with ``--embd-normalize
  0``), every value for one input, the first 16 for several, then the cosine similarity matrix; with pooling
  ``none`` one line per token, its first 3 values ``...`` its last 3;
- ``array``: ``[[v,v,...],[...]]`` on one line (``%1.7f``, ``%1.0f`` with ``--embd-normalize 0``);
- ``json``: OpenAI's embeddings answer, ``{"object": "list", "data": [{"object": "embedding", "index",
  "embedding"}], "model", "usage"}`` (llama-embedding writes ``object`` and ``data``; ``model`` and ``usage``
  complete OpenAI's shape, so its client's types read it);
- ``json+``: ``json`` with ``cosineSimilarity``, the matrix of every pair of vectors (``%6.2f``), where there
  are several inputs;
- ``raw``: one vector a line, its values separated by single spaces (``%1.7f``, ``%1.0f`` with ``--embd-normalize
  0``), nothing else: llama-embedding's ``print_raw_embeddings``, for a pipe.

With pooling ``none`` the array, JSON and raw forms hold every token's vector, the inputs' one after another.

Importing this module imports click only; the runtime loads when the command runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from edgesdk.cli_interactive import process_escapes
from edgesdk.cli_llama import (
    CTX_SIZE_ENV,
    LLAMA_OPTION_NAMES,
    MODEL_ENV,
    LlamaCommand,
    LlamaEnvOption,
    bundle_or_model,
    ctx_size_env_note,
    ctx_size_source,
    model_option,
    say_model_env_overridden,
    say_unread_llama_env,
)
from edgesdk.cli_options import NamedPath, escape_option, runtime_options
from edgesdk.errors import EdgeSDKError, iconv_to_utf8, read_utf8

POOLINGS = ("last", "mean", "cls", "none")  # edgesdk.runtime.embedding.POOLINGS (not imported: it needs numpy)
OUTPUT_FORMATS = ("", "array", "json", "json+", "raw")
SHOWN_VALUES = 16  # the values llama-embedding's plain output shows of each vector when there are several inputs


class PoolingChoice(click.Choice):
    """``--pooling`` of embed and serve (:data:`POOLINGS`). llama.cpp's --pooling also takes ``rank``
    (common/arg.cpp), a reranker's: a query and a document read together and scored by the model's classification
    head (llama-server --reranking's /v1/rerank), not pooled into a vector. edgesdk computes no such score, so rank
    is refused with that reason, not as a word click does not know."""

    def __init__(self):
        super().__init__(POOLINGS)

    def convert(self, value, param, ctx):
        if value == "rank":
            self.fail("rank is llama.cpp's pooling for a reranker, which scores a query and a document together "
                      "through the model's classification head (llama-server --reranking's /v1/rerank); edgesdk "
                      "serves no reranker, its embeddings pool a model's hidden states: pass "
                      f"{', '.join(POOLINGS[:-1])} or {POOLINGS[-1]}, or leave --pooling out for the pooling the "
                      "model declares (else mean)", param, ctx)
        return super().convert(value, param, ctx)


@click.command("embed", cls=LlamaCommand, context_settings=LLAMA_OPTION_NAMES)
# LLAMA_ARG_MODEL: llama-embedding's -m (common/arg.cpp), read where no BUNDLE is given
@click.argument("bundle", type=click.Path(path_type=Path), envvar=MODEL_ENV, required=False)
@model_option("llama-embedding")
@click.option("--prompt", "-p", "prompts", multiple=True, metavar="TEXT",
              help="Text to embed; each piece between separators (each line by default) is one input. Repeat for "
                   "more.")
@click.option("--file", "-f", "text_file", type=NamedPath("file", "-f notes.txt (a UTF-8 text file)"), metavar="FILE",
              help="Embed a UTF-8 file's pieces too, after those of --prompt (llama-embedding's -f: one trailing "
                   "newline dropped). '-' reads it from stdin (as /dev/stdin does).")
@click.option("--embd-separator", default="\n", show_default="a newline", metavar="STRING",
              help="What separates the inputs in --prompt and --file, e.g. '<#sep#>'.")
@escape_option
@click.option("--pooling", type=PoolingChoice(), default=None, cls=LlamaEnvOption, envvar="LLAMA_ARG_POOLING",
              help="How a text's hidden states become its vector: last (the last token's: decoder embedding models, "
                   "Qwen3-Embedding, e5-mistral), mean, cls (the first token's), none (every token's).  [default: as "
                   "the model declares, else mean]")
@click.option("--embd-normalize", type=click.IntRange(min=-1), default=2, show_default=True, metavar="N",
              help="Normalisation of each vector: -1 none, 0 max-abs scaled to int16, 1 taxicab, 2 euclidean "
                   "(unit length), > 2 p-norm.")
@click.option("--embd-output-format", type=click.Choice(OUTPUT_FORMATS), default="", metavar="FORMAT",
              help="'' (lines of values and the cosine similarity matrix, as llama-embedding prints them), array "
                   "([[...],[...]]), json (OpenAI's embeddings answer), json+ (json and the cosine similarity "
                   "matrix), raw (one vector a line, its values separated by spaces).")
@click.option("--truncate", is_flag=True,
              help="Embed the first max-context tokens of a longer input, the end token its tokenizer appends kept "
                   "(a note on stderr says which), instead of refusing it.")
@runtime_options(llama_env=True)
def embed(bundle, model, prompts, text_file, embd_separator, escape, pooling, embd_normalize, embd_output_format,
          truncate, threads, backend, target, ignore_target):
    """Embeddings of texts through the bundle's runtime, as llama.cpp's llama-embedding prints them.

    \b
    Examples:
      edgesdk embed BUNDLE -p "Hello world"
      edgesdk embed -m BUNDLE -p "Hello world"                # llama-embedding's -m names the bundle too
      edgesdk embed BUNDLE -f passages.txt --embd-output-format json > vectors.json
      edgesdk embed BUNDLE -p "a cat" -p "a dog" -p "the stock market"   # and their cosine similarities

    -c N (--ctx-size) up to the bundle's context is the context the inputs are held to (a longer one is refused, or
    cut to it with --truncate); 0 is the bundle's own, and more than it holds, fixed when it was built, is refused
    with the rebuild. llama-embedding's options that change nothing here are accepted and said so on stderr (-ngl,
    -fa, --mlock, --no-mmap, ...); the others are refused by name.

    llama-embedding's environment variables set the options they set there (LLAMA_ARG_THREADS, LLAMA_ARG_POOLING:
    each option below names its own; LLAMA_ARG_MODEL is the BUNDLE where none is given; LLAMA_ARG_CTX_SIZE is
    taken as -c is, and a value it cannot be is said); the command line goes over them. One set for an option embed
    lacks is named on stderr.
    """
    bundle = bundle_or_model(bundle, model, "BUNDLE", "llama-embedding")  # llama-embedding's -m MODEL
    inputs = _inputs(prompts, text_file, embd_separator, escape)
    # llama-embedding would act on them (common/arg.cpp reads each option's variable for every tool that has it)
    say_model_env_overridden()
    say_unread_llama_env("llama-embedding", MODEL_ENV, CTX_SIZE_ENV)
    from edgesdk.cli_run import asked_context
    from edgesdk.runtime.embedding import EmbeddingConfig, bundle_pooling, embed_tokens
    from edgesdk.runtime.session import open_runtime

    # -c N: the run's context, checked against the manifest's before the bundle loads
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target, context=asked_context(bundle),
                           context_source=ctx_size_source())  # -c or LLAMA_ARG_CTX_SIZE, as a refusal names it
    if (note := ctx_size_env_note(runtime.backend.max_context, bundle)) is not None:
        click.echo(f"edgesdk: {note}", err=True)
    pooling = pooling or bundle_pooling(runtime.bundle.manifest, runtime.bundle.path)
    config = EmbeddingConfig(pooling=pooling, normalize=embd_normalize)
    limit = runtime.backend.max_context
    # every input tokenized and checked before the first runs, as llama-embedding tokenizes them all before its first
    # batch: one refused does not come after the others' embeddings, lost
    sequences = [(_input_ids(runtime.tokenizer, text, where, limit, truncate, runtime.backend), where)
                 for text, where in inputs]
    embeddings = []
    for (ids, end), where in sequences:
        embedding = embed_tokens(runtime.backend, ids, config, truncate, end,
                                 manifest=runtime.bundle.manifest)
        if embedding.truncated:
            appended = "the end token" if end == 1 else f"the {end} end tokens"
            kept = f"its first {embedding.tokens - end} and {appended} the tokenizer appends" if end else \
                f"its first {embedding.tokens}"
            click.echo(f"note: {where} is {len(ids)} tokens: {kept} were embedded", err=True)
        embeddings.append(embedding)
    rows = [row for embedding in embeddings
            for row in (embedding.vectors if pooling == "none" else [embedding.vectors])]
    texts = [text for text, _ in inputs]
    if embd_output_format == "":
        _print_lines(rows, texts, pooling, embd_normalize)
        return
    if embd_output_format == "raw":
        for row in rows:
            click.echo(" ".join(_value(float(value), embd_normalize) for value in row))
        return
    from edgesdk.serve.openai_answer import served_model_name

    tokens = sum(embedding.tokens for embedding in embeddings)
    click.echo(_json_text(rows, embd_output_format, embd_normalize, len(texts),
                          served_model_name(runtime.bundle.manifest), tokens))


def _input_ids(tokenizer, text: str, where: str, limit: int, truncate: bool, backend=None) -> tuple[list[int], int]:
    """(ids, end) of one input (:func:`edgesdk.runtime.embedding.text_ids`), or an EdgeSDKError naming ``where``: text
    that is not UTF-8, that holds no tokens, or that is longer than ``limit`` tokens without ``truncate``. That one's
    fix is run's for a prompt past the context (:func:`edgesdk.bundle.context_fix`, with ``backend``'s
    ``built_context`` and ``model_positions``): under ``-c N`` raising -c up to the bundle's context, else the
    rebuild that holds more where the model's positions allow it; --truncate and "shorten it" alone sent a ``-c 16``
    run's user to cut a text the bundle held."""
    from edgesdk.bundle import context_fix
    from edgesdk.runtime.embedding import EmbeddingError, fitted, text_ids

    try:
        ids, end = text_ids(tokenizer, text)
    except EdgeSDKError as exc:  # bytes that are not UTF-8 in an argument (lone surrogates from the shell)
        raise EdgeSDKError(f"{where}: {exc.problem}", exc.fix) from exc
    if not ids:
        raise EdgeSDKError(f"{where} holds no tokens: there is nothing to embed", "give it some text")
    try:
        fitted(ids, limit, truncate, end)
    except EmbeddingError as exc:  # longer than the context
        raise EdgeSDKError(f"{where}: {exc.problem}",
                           context_fix(f"pass --truncate to embed its first {limit} tokens, or shorten it", limit,
                                       getattr(backend, "model_positions", None), len(ids),
                                       built=getattr(backend, "built_context", None),
                                       source=getattr(backend, "context_source", "-c"))) from exc
    return ids, end


def _inputs(prompts: tuple[str, ...], text_file: Path | None, separator: str,
            escape: bool = True) -> list[tuple[str, str]]:
    """(text, where) of each input: the pieces of each --prompt, then of --file, split at ``separator``; with
    ``escape`` (-e, on by default) their escapes processed before the split, as llama-embedding processes its
    prompt's (the separator itself is taken as written)."""
    if separator == "":
        raise click.BadParameter("an empty separator splits nothing; pass a string that is between the inputs, "
                                 "or leave it out for a newline", param_hint="'--embd-separator'")

    def escaped(text: str, hint: str) -> str:
        return process_escapes(text, hint) if escape else text

    sources = [(escaped(prompt, "'--prompt' / '-p'"), "--prompt" if len(prompts) == 1 else f"--prompt {number}")
               for number, prompt in enumerate(prompts, 1)]
    if text_file is not None:
        stdin = str(text_file) == "-"
        if not stdin and (why := _not_a_file(text_file)) is not None:
            raise click.BadParameter(f"{str(text_file)!r} is not a file ({why}); give a UTF-8 text file, or '-' "
                                     "for stdin", param_hint="'--file' / '-f'")
        content = _stdin_text() if stdin else _file_text(text_file)
        content = content[:-1] if content.endswith("\n") else content
        sources.append((escaped(content, "'--file' / '-f'"), f"--file {text_file}"))
    if not sources:
        raise click.UsageError("give the text to embed: --prompt TEXT (repeatable) or --file FILE (- for stdin)")
    piece = "line" if separator == "\n" else "piece"
    inputs = []
    for text, source in sources:
        parts = text.split(separator)
        for number, part in enumerate(parts, 1):
            where = source if len(parts) == 1 else f"{piece} {number} of {source}"
            if not part:
                raise EdgeSDKError(f"{where} is empty: there is nothing to embed", _empty_fix(source, piece, parts))
            inputs.append((part, where))
    return inputs


def _stdin_text() -> str:
    """``-f -``: the text is all of stdin, read to its end, as ``-f /dev/stdin`` reads it and as ``edgesdk run -f -``
    reads its prompt, so that ``cat passages.txt | edgesdk embed BUNDLE -f -`` embeds each line (llama-embedding's
    -f opens '-' as a file name and fails; '-' names stdin for most Unix tools). Its line ends are kept as they
    are, as a file's; bytes that are not UTF-8 are refused as a --file that is not."""
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise EdgeSDKError("--file - reads the text to embed from stdin, and this process has none (it was closed)",
                           "pipe the text in (cat passages.txt | edgesdk embed BUNDLE -f -), or pass -f FILE or "
                           "-p TEXT")
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EdgeSDKError(f"--file - (stdin) is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           f"convert it first, e.g. ... | {iconv_to_utf8(data)} | edgesdk embed BUNDLE -f -") from exc


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is no file to read (a directory, or nothing at that path), None where it is one or cannot be
    looked up: pathlib's exists() and is_dir() raise where a folder on the way may not be searched (EACCES), which
    :func:`_file_text` then names as a file that cannot be read, instead of a traceback."""
    try:
        if path.is_dir():
            return "it is a directory"
        return None if path.exists() else "nothing exists at that path"
    except OSError:
        return None


def _empty_fix(source: str, piece: str, parts: list[str]) -> str:
    """The fix for an empty input of ``source``: a whole --prompt or --file without text needs some, where one empty
    ``piece`` between separators is removed (or the separator was not the inputs')."""
    if len(parts) == 1:
        if source == "--file -":
            return "pipe the text to embed in, or leave --file out"
        return ("write the text to embed into the file, or leave --file out" if source.startswith("--file") else
                "give --prompt the text to embed, or leave that --prompt out")
    return f"remove the empty {piece}, or pass --embd-separator with what separates the inputs"


def _file_text(path: Path) -> str:
    """The UTF-8 text of ``path`` with its line ends as they are, as llama.cpp's ``-f`` reads it (an ifstream, no
    newline translation on Linux): a CRLF file split at ``--embd-separator $'\\r\\n'`` gives its lines, and a lone
    carriage return is no line end (Python's text mode would turn both into newlines). A file that cannot be read
    or is not UTF-8 is refused as :func:`~edgesdk.errors.read_utf8` refuses it."""
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return read_utf8(path, "--file")  # raises, naming the file, the bad byte or why it cannot be read, the fix


def _value(value: float, norm: int) -> str:
    """One value as llama-embedding's array, JSON and raw forms write it."""
    return f"{value:1.0f}" if norm == 0 else f"{value:1.7f}"


def _similarities(rows):
    """The cosine similarity of every pair of ``rows``, as llama.cpp's common_embd_similarity_cos gives it (in
    double precision; 1 for two zero vectors, 0 where one of them is zero)."""
    import numpy as np

    vectors = np.asarray(rows, dtype=np.float64)
    dots = vectors @ vectors.T
    lengths = np.sqrt(np.diag(dots))
    scale = np.outer(lengths, lengths)
    zero = lengths == 0.0
    similar = np.divide(dots, scale, out=np.zeros_like(dots), where=scale > 0)
    similar[np.outer(zero, zero)] = 1.0
    return similar


def _print_lines(rows, texts: list[str], pooling: str, norm: int) -> None:
    """llama-embedding's plain output (``--embd-output-format`` left empty)."""
    spec = "{:6.0f} " if norm == 0 else "{:9.6f} "
    values = lambda row: "".join(spec.format(float(value)) for value in row)  # noqa: E731
    if pooling == "none":
        for index, row in enumerate(rows):
            click.echo(f"embedding {index}: {values(row[:3])} ... {values(row[max(0, len(row) - 3):])}")
        return
    shown = len(rows[0]) if len(texts) == 1 else SHOWN_VALUES
    for index, row in enumerate(rows):
        click.echo(f"embedding {index}: {values(row[:shown])}")
    if len(texts) > 1:
        click.echo("\ncosine similarity matrix:\n")
        click.echo("".join(f"{text[:6]:>6} " for text in texts))
        for text, similar in zip(texts, _similarities(rows), strict=True):
            click.echo("".join(f"{value:6.2f} " for value in similar) + text[:10])


def _json_text(rows, output_format: str, norm: int, inputs: int, model: str, tokens: int) -> str:
    """The array, json or json+ form, written as llama-embedding writes it."""
    vectors = ["[" + ",".join(_value(float(value), norm) for value in row) + "]" for row in rows]
    if output_format == "array":
        return "[" + ",".join(vectors) + "]"
    items = ",\n".join(f'    {{\n      "object": "embedding",\n      "index": {index},\n      "embedding": {vector}\n'
                       "    }" for index, vector in enumerate(vectors))
    text = f'{{\n  "object": "list",\n  "data": [\n{items}\n  ]'
    if output_format == "json+" and inputs > 1:
        matrix = ",\n".join("    [" + ", ".join(f"{value:6.2f}" for value in similar) + " ]"
                            for similar in _similarities(rows))
        text += f',\n  "cosineSimilarity": [\n{matrix}\n  ]'
    usage = json.dumps({"prompt_tokens": tokens, "total_tokens": tokens})
    return text + f',\n  "model": {json.dumps(model)},\n  "usage": {usage}\n}}'
