"""``edgesdk eval``: the perplexity of a bundle through its runtime, beside its PyTorch source model's, KL
divergence and last-word accuracy (registered in :mod:`edgesdk.cli`; the scoring is :mod:`edgesdk.evaluate`), or
instead one of llama-perplexity's accuracy tasks on a task file (:mod:`edgesdk.accuracy`).

Importing this module imports click only; the runtime, torch and transformers load when the command runs.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from edgesdk.cli_llama import (
    CTX_SIZE_ENV,
    LLAMA_OPTION_NAMES,
    MODEL_ENV,
    LlamaCommand,
    LlamaEnvOption,
    bundle_or_model,
    model_option,
    say_model_env_overridden,
    say_unread_llama_env,
)
from edgesdk.cli_options import echo_json, option_given, runtime_options
from edgesdk.errors import EdgeSDKError, read_utf8


def _plus_minus(value: float | None, uncertainty: float | None, spec: str) -> str:
    """``value ± uncertainty`` as llama-perplexity prints it; a figure with no defined value (one token) reads n/a."""
    if value is None:
        return "n/a"
    return format(value, spec) + ("" if uncertainty is None else f" ± {format(uncertainty, spec)}")


# llama-perplexity's -c / --ctx-size is --context here, and its -bf / --binary-file (the file --multiple-choice reads)
# --text; its other options, and '_' in an option's name read as '-' (--ppl_stride), as run reads them (cli_llama)
@click.command("eval", cls=LlamaCommand, context_settings=LLAMA_OPTION_NAMES,
               llama_aliases={"-c": "--context", "--ctx-size": "--context", "-bf": "--text", "--binary-file": "--text"})
# LLAMA_ARG_MODEL: llama-perplexity's -m (common/arg.cpp), read where no BUNDLE is given
@click.argument("bundle", type=click.Path(path_type=Path), envvar=MODEL_ENV, required=False)
@model_option("llama-perplexity")
# llama-perplexity's -f / --file FNAME (common/arg.cpp) is --text here
@click.option("--text", "-f", "--file", "text_file", required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Plain-text file to score (e.g. wikitext-2-raw/wiki.valid.raw); with an accuracy task, its task "
                   "file.")
@click.option("--method", type=click.Choice(["windows", "llama-perplexity"]), default="windows", show_default=True,
              help="windows: non-overlapping --context windows (or --stride), every token but each window's first "
                   "scored. llama-perplexity: the figure llama.cpp's llama-perplexity -c CONTEXT prints: the text "
                   "(BOS in front where the tokenizer adds one) cut into whole chunks of --context tokens, the tail "
                   "dropped, each chunk's first token made BOS where the tokenizer adds one, only the second half "
                   "of each chunk scored; it needs 2 x --context tokens. llama-perplexity reads the whole file: "
                   "pass --max-chars 0 to score the same text.")
@click.option("--context", default=512, type=click.IntRange(min=0), cls=LlamaEnvOption,
              envvar=CTX_SIZE_ENV,
              help="Tokens per window (per chunk: llama-perplexity's -c) [512, or the bundle's context where that is "
                   "shorter, said on stderr]; with --hellaswag, --winogrande or "
                   "--multiple-choice the most tokens a task may take, its endings packed as llama-perplexity -c "
                   "packs them, the prefix they share once (not given: each ending the bundle's context); 0: the "
                   "bundle's context (a task packed into it), as llama.cpp's -c 0 is the model's in its other "
                   "tools (llama-perplexity itself refuses -c 0).")
@click.option("--stride", type=click.IntRange(min=1), help="Window step [--context: no overlap]; windows only.")
@click.option("--chunks", default=-1, show_default=True, type=click.IntRange(min=-1),
              help="Score the first N chunks only (--method windows: the first N windows), as llama-perplexity "
                   "--chunks N; -1: all. The text is still read and checked whole; --reference and --kl-divergence "
                   "score the same chunks, --last-word all its paragraphs.")
@click.option("--ppl-stride", "ppl_stride", default=0, show_default=True, type=click.IntRange(min=0),
              help="With --method llama-perplexity: llama-perplexity --ppl-stride N, its strided perplexity: windows "
                   "of --context tokens started N apart, the last N tokens of each scored (the first window's too), "
                   "no BOS put in; 0: off. llama-perplexity's window is not its -c but the context it creates, "
                   "max(1, -b / -c) * -c + N/2 tokens (with its default -b 2048, -c 4096 gives 4096 + N/2) or more "
                   "(llama.cpp may round it up), logged as 'Calculation chunk = ...': pass that as --context.")
@click.option("--max-chars", default=200_000, show_default=True, type=click.IntRange(min=0),
              help="Score the first N characters (0 = all).")
@click.option("--reference", is_flag=True, help="Also score the PyTorch source model (host; needs edgesdk[host]).")
@click.option("--reference-model", metavar="MODEL",
              help="With --reference (implied): the source model where it is now, as build's --model takes it (a "
                   "Hugging Face directory, a .gguf file, an alias) [the path the bundle's manifest records].")
@click.option("--kl-divergence", "kl", is_flag=True,
              help="With --reference, or with --kl-divergence-base FILE (read): KL divergence of the bundle's "
                   "next-token distributions from the source model's and llama-perplexity --kl-divergence's "
                   "statistics (KLD mean with its uncertainty, percentiles, PPL ratio, Δp, same top token; all of "
                   "them with --json).")
@click.option("--kl-divergence-base", "kl_base", metavar="FILE", type=click.Path(dir_okay=False, path_type=Path),
              help="As llama-perplexity's: without --kl-divergence (host; implies --reference), write the source "
                   "model's next-token distributions at the scored positions to FILE, with the token ids, the "
                   "scoring settings and the tokenizer; with --kl-divergence, read them from FILE in place of the "
                   "source model (no torch: on the board), under the same settings and --text.")
@click.option("--last-word", is_flag=True,
              help="Also the last-word accuracy task: the last word of each 40-150-word paragraph ending in ' .' "
                   "(WikiText's form; of the part --max-chars keeps, whole paragraphs only), scored as "
                   "lm-evaluation-harness scores a loglikelihood task (with --reference, the source model's too).")
@click.option("--hellaswag", is_flag=True,
              help="Score HellaSwag from the --text file instead of perplexity, as llama-perplexity --hellaswag -f "
                   "FILE: llama.cpp's 6-line file (hellaswag_val_full.txt); each ending's mean token log-probability "
                   "past the prefix the 4 share picks (acc_norm), printed with its 95 % interval.")
@click.option("--hellaswag-tasks", type=click.IntRange(min=1), default=400, show_default=True,
              help="HellaSwag tasks scored, in llama-perplexity's random order.")
@click.option("--winogrande", is_flag=True,
              help="Score Winogrande from the --text file (llama.cpp's CSV, winogrande-debiased-eval.csv) instead of "
                   "perplexity, as llama-perplexity --winogrande -f FILE, except that every row is scored: "
                   "llama-perplexity leaves out a file's last row (its -f drops one trailing newline, and its reader "
                   "stops before a last line no newline ends).")
@click.option("--winogrande-tasks", type=click.IntRange(min=0), default=0, show_default=True,
              help="Winogrande tasks scored: 0 all, in file order; N drawn as llama-perplexity draws them (from the "
                   "rows it reads, so the same N tasks).")
@click.option("--multiple-choice", is_flag=True,
              help="Score the --text file in llama.cpp's binary multiple-choice format (ARC, MMLU, TruthfulQA) "
                   "instead of perplexity, as llama-perplexity --multiple-choice -bf FILE (its -bf / --binary-file "
                   "FILE is read as --text FILE).")
@click.option("--multiple-choice-tasks", type=click.IntRange(min=0), default=0, show_default=True,
              help="Multiple-choice tasks scored: 0 all, in file order; N drawn as llama-perplexity draws them.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--budgets", default="1.0,0.8,0.6", show_default=True,
              help="Power-gated bundles: compute budgets (fraction of FFN blocks run) for the perplexity curve.")
@runtime_options(llama_env=True)
def eval_(bundle, model, text_file, method, context, stride, chunks, ppl_stride, max_chars, reference, reference_model, kl, kl_base, last_word, hellaswag, hellaswag_tasks,
          winogrande, winogrande_tasks, multiple_choice, multiple_choice_tasks, as_json, budgets, threads, backend,
          target, ignore_target):
    """Perplexity of the bundle through its runtime (and of the PyTorch source with --reference).

    --method llama-perplexity gives the figure of llama.cpp's llama-perplexity (its perplexity() in
    tools/perplexity/perplexity.cpp): the file read as its -f reads it (the bytes as they are, one trailing
    newline dropped) and tokenized once, BOS in front where the tokenizer adds one;
    len(tokens) // CONTEXT chunks, the tail dropped; each chunk's first token replaced by BOS where the
    tokenizer adds one; positions CONTEXT/2 .. CONTEXT-2 of each chunk predict the tokens after them
    (CONTEXT - CONTEXT/2 - 1 a chunk); exp of the mean negative log-likelihood over them all. Fewer than
    2 x CONTEXT tokens are refused, as llama-perplexity refuses them. --chunks N scores the first N of the chunks
    (under either method), as llama-perplexity's --chunks N does. With --ppl-stride N it is llama-perplexity
    --ppl-stride N instead (its perplexity_v2): (tokens - CONTEXT + N - 1) // N windows of CONTEXT tokens started N
    apart, each decoded as it is (no BOS put in), its last N tokens scored; CONTEXT is then the context
    llama-perplexity creates, logged as "Calculation chunk = ...", not its -c.

    --hellaswag, --winogrande and --multiple-choice score the --text file as llama-perplexity's task of that
    name scores it, instead of perplexity (one task a run); there --context N (-c N) is the context the tasks are
    scored in, as llama-perplexity's -c: a task whose endings need more than N tokens packed as llama-perplexity packs
    them (the prefix they share once) is refused (not given: each ending may have the bundle's context).

    llama-perplexity's -c / --ctx-size N is --context N; its options that change nothing here are accepted and said
    so on stderr (-ngl, -fa, -b, --mlock, ...), the others refused by name.

    llama-perplexity's environment variables set the options they set there (LLAMA_ARG_THREADS; LLAMA_ARG_CTX_SIZE
    is --context, as -c is; LLAMA_ARG_MODEL is the BUNDLE where none is given); the command line goes over them.
    One set for an option eval lacks is named on stderr.

    --kl-divergence-base FILE works as llama-perplexity's: on the host, without --kl-divergence, the source model's
    distributions at the scored positions are written to FILE (each position's last hidden state, float32, and the
    output layer once, which give its logits back: SmolLM2's 2.3 kB a position where its whole vocabulary would be
    96 kB; the token ids, the settings and the tokenizer with them); on the board, --kl-divergence-base FILE
    --kl-divergence reads them and prints the statistics --reference --kl-divergence prints, under the same --text,
    --method, --context, --stride, --chunks, --ppl-stride and --max-chars (others are refused by name).
    """
    from edgesdk.evaluate import (
        PerplexityConfig,
        backend_record,
        bundle_perplexity,
        leading_bos,
        reference_perplexity,
    )
    from edgesdk.runtime.session import open_runtime

    bundle = bundle_or_model(bundle, model, "BUNDLE", "llama-perplexity")  # llama-perplexity's -m MODEL
    # llama-perplexity would act on them (common/arg.cpp reads each option's variable for every tool that has it)
    say_model_env_overridden()
    say_unread_llama_env("llama-perplexity", MODEL_ENV)
    # the task first: beside a task, --kl-divergence is refused as a perplexity option; told to add --reference
    # first, the user was then told to drop --kl-divergence
    task = _accuracy_task_asked({"hellaswag": (hellaswag, hellaswag_tasks), "winogrande": (winogrande, winogrande_tasks),
                                 "multiple-choice": (multiple_choice, multiple_choice_tasks)})
    asked, drop = _reference_asked(reference_model)
    writing, reading = kl_base is not None and not kl, kl_base is not None and kl
    if reading and (reference or reference_model is not None):
        raise click.BadParameter(f"--kl-divergence-base {kl_base} --kl-divergence reads the source model's "
                                 "distributions from that file in place of the source model: "
                                 f"{drop}, or drop --kl-divergence-base to compare with the "
                                 "source model itself", param_hint=asked)
    reference = reference or reference_model is not None or writing  # the file is the source model's: it is scored
    if kl and not reference and not reading:
        raise click.BadParameter("compares the bundle with its source model, which --reference loads (host); add "
                                 "--reference, or on a board --kl-divergence-base FILE, written on the host by "
                                 "eval --kl-divergence-base FILE", param_hint="--kl-divergence")
    if writing and not kl_base.resolve().parent.is_dir():  # before minutes of scoring
        raise click.BadParameter(f"{kl_base}: its directory {kl_base.resolve().parent} does not exist; create it "
                                 "or pass a path in an existing directory", param_hint="--kl-divergence-base")
    if writing:
        from edgesdk.evaluate import check_divergence_base_writable

        check_divergence_base_writable(kl_base, text=text_file, bundle=bundle)
    if reference:
        # Host-only dependencies: check them before scoring the bundle, and say how to get them.
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as exc:
            if writing:  # dropping --reference would still write the file, which needs torch
                raise EdgeSDKError(
                    f"--kl-divergence-base {kl_base} without --kl-divergence writes the PyTorch source model's "
                    f"distributions to that file, and scoring that model needs torch and transformers ({exc})",
                    f"write it on the host (pip install 'edgesdk[host]' there), copy it here and read it with "
                    f"--kl-divergence-base {kl_base} --kl-divergence; a file written there is read here without "
                    "torch",
                ) from exc
            raise EdgeSDKError(
                f"{asked} scores the PyTorch source model and needs torch and transformers ({exc})",
                f"pip install 'edgesdk[host]' on the host, or {drop} to score the bundle alone",
            ) from exc
    if task is not None:
        _score_accuracy_task(*task, bundle, text_file, reference, reference_model, as_json, threads, backend, target, ignore_target,
                             context=context if option_given("context") else None)
        return
    if method == "llama-perplexity" and stride is not None:
        raise click.BadParameter(f"--stride {stride} sets the step of --method windows; llama-perplexity cuts the "
                                 "text into chunks of --context tokens with no overlap: drop --stride, or use "
                                 "--method windows", param_hint="--stride")
    if ppl_stride and method != "llama-perplexity":
        raise click.BadParameter(f"{ppl_stride} is llama-perplexity's strided perplexity, which --method {method} "
                                 "does not compute: add --method llama-perplexity, or drop --ppl-stride (--stride "
                                 "sets the step of --method windows)", param_hint="--ppl-stride")
    if chunks == 0:  # llama-perplexity would print the perplexity of no token (nan)
        raise click.BadParameter("0 scores no chunk: pass the number of chunks to score, or -1 (the default) for "
                                 "all of them", param_hint="--chunks")
    if context == 0:  # llama.cpp's -c 0: "loaded from model", here the bundle's context (fixed when it was built)
        context = _bundle_context(bundle)

    def configured(context: int) -> PerplexityConfig:
        try:
            return PerplexityConfig(context=context, stride=stride or context, max_chars=max_chars or None,
                                    method=method, chunks=chunks if chunks > 0 else None,
                                    ppl_stride=ppl_stride or None)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--context/--ppl-stride" if ppl_stride else
                                     "--context/--stride") from exc

    config = configured(context)
    levels = _budget_levels(budgets)
    # the file read once: a pipe (/dev/stdin, <(zcat wiki.raw.gz)) gives its text only once
    text = _text_as_llama_perplexity_reads(text_file) if method == "llama-perplexity" else \
        read_utf8(text_file, "--text")
    if not text[: config.max_chars].strip():
        cut, where = _part_scored(text, config.max_chars)
        raise EdgeSDKError(f"--text {text_file} has nothing to score: {where} are empty or whitespace",
                           "raise --max-chars (0 scores the whole file)" if cut else
                           "pass a plain-text file, e.g. wikitext-2-raw/wiki.valid.raw")
    documents = _last_word_documents(text, text_file, config.max_chars) if last_word else None
    if reading:  # a missing or damaged file refused before the bundle loads
        from edgesdk.evaluate import read_divergence_base

        base = read_divergence_base(kl_base)
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target)
    if context > runtime.backend.max_context:
        if option_given("context"):  # asked for (or LLAMA_ARG_CTX_SIZE): refused, not shortened behind the user's back
            raise _context_too_long(context, runtime.backend.max_context, " is longer")
        # the default on a bundle built shorter (build --max-context 256): its own context, as llama-perplexity
        # with no -c runs on a model whose context is shorter than its default, not a refusal of the plain command
        context = _default_context_note(context, runtime.backend.max_context)
        config = configured(context)
    if reading:  # a file of other settings, tokenizer or text refused before the scoring, which takes minutes
        from edgesdk.evaluate import check_bundle_divergence_base

        check_bundle_divergence_base(runtime, text, config, base)
    # before the scoring, which takes minutes
    source = _reference_source(runtime, bundle, reference_model) if reference else None
    gated = hasattr(runtime.backend, "configure")
    if option_given("budgets") and not gated:
        raise EdgeSDKError(f"--budgets needs a bundle with power gates; {bundle} has none",
                           "drop --budgets, or build the bundle with a recipe holding the power stage (--recipe power)")
    # loaded before the bundle is scored: a --reference-model of another shape than the manifest records is
    # refused then, not after the scoring
    source_model = _reference_model(source, runtime, bundle, reference_model, threads) if reference else None
    if gated:  # the bundle scored with every FFN running; the gated points follow
        from edgesdk.evaluate import gated_perplexity

        power = gated_perplexity(runtime, text, config, levels, progress=True)
        result = {"bundle": power["gating_off"], "power": power}
    elif method == "llama-perplexity":  # its running [i]ppl values as the chunks finish, in place of a progress bar
        def said(index: int, running: float) -> None:
            click.echo(f"[{index}]{running:.4f},", nl=False, err=True)
            said.count = index

        said.count = 0
        try:
            result = {"bundle": bundle_perplexity(runtime, text, config, on_window=said).to_json()}
        finally:
            if said.count:  # the line of values ended, as llama-perplexity ends it, before what follows
                click.echo("", err=True)
    else:
        _say_windows_rule(context, config.stride)
        result = {"bundle": bundle_perplexity(runtime, text, config, progress=True).to_json()}
    # the text scored, as the text output's note gives it: under llama-perplexity's rule, a figure over fewer
    # characters than the file holds is not the one llama-perplexity -f prints for it
    result = {"method": method, "context": context, **({"stride": config.stride} if method == "windows" else {}),
              **({"chunks": config.chunks} if config.chunks else {}),  # --chunks N: the first N scored
              **({"ppl_stride": config.ppl_stride} if config.ppl_stride else {}),
              "characters": len(text),
              "characters_scored": len(text[:config.max_chars]), **backend_record(runtime), **result}
    if writing:  # the source model's perplexity from the same pass that writes its distributions
        from edgesdk.evaluate import write_bundle_divergence_base

        figure, positions = write_bundle_divergence_base(runtime, source_model, text, config, kl_base, progress=True)
        result["reference"] = figure.to_json()
        result["kl_divergence_base"] = {"path": str(kl_base), "written": True, "positions": positions,
                                        "bytes": kl_base.stat().st_size}
    elif reference:
        result["reference"] = reference_perplexity(source_model, runtime.tokenizer.encode_plain, text, config,
                                                   progress=True, bos_id=leading_bos(runtime.tokenizer)).to_json()
    if reference:
        ours, ref = result["bundle"]["perplexity"], result["reference"]["perplexity"]
        result["relative_difference"] = round(ours / ref - 1, 8)
        if kl:
            from edgesdk.evaluate import bundle_divergence

            result["divergence"] = bundle_divergence(runtime, source_model, text, config, progress=True).to_json()
    if reading:
        from edgesdk.evaluate import bundle_base_divergence

        result["divergence"] = bundle_base_divergence(runtime, text, config, base, progress=True).to_json()
        result["kl_divergence_base"] = {"path": str(kl_base), "written": False,
                                        "bundle_id": base.header.get("bundle_id"), "source": base.header.get("source")}
    if last_word:
        from edgesdk.evaluate import bundle_scorer, last_word_accuracy, reference_scorer

        encode = lambda t: runtime.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        bos = leading_bos(runtime.tokenizer)
        result["last_word"] = last_word_accuracy(bundle_scorer(runtime), encode, documents, bos_id=bos).to_json()
        if reference:  # a paragraph longer than the bundle is cut for both, so both score the same tokens
            result["reference_last_word"] = last_word_accuracy(reference_scorer(source_model.eval()), encode,
                                                               documents, max_tokens=runtime.backend.max_context,
                                                               bos_id=bos).to_json()
    if as_json:
        echo_json(result)
        return
    _print_perplexity(result, method, context, len(text), config.max_chars, config.ppl_stride)


# eval's options that only perplexity reads (parameter -> option), refused beside an accuracy task. --context (-c)
# is not one: llama-perplexity's tasks are scored in its n_ctx too (_score_accuracy_task)
PERPLEXITY_ONLY = {"method": "--method", "stride": "--stride", "chunks": "--chunks", "ppl_stride": "--ppl-stride",
                   "max_chars": "--max-chars", "kl": "--kl-divergence", "kl_base": "--kl-divergence-base",
                   "last_word": "--last-word",
                   "budgets": "--budgets"}


def _accuracy_task_asked(tasks: dict[str, tuple[bool, int]]) -> tuple[str, int] | None:
    """The accuracy task this run scores (its name, as llama-perplexity's flag, and its task count), None for
    perplexity. One task a run, as llama-perplexity takes one; a task count without its task, or a perplexity
    option beside a task, is refused by name."""
    chosen = [name for name, (asked, _) in tasks.items() if asked]
    for name in tasks:
        if option_given(f"{name.replace('-', '_')}_tasks") and name not in chosen:
            raise click.BadParameter(f"sets how many {name} tasks to score; add --{name}",
                                     param_hint=f"--{name}-tasks")
    if len(chosen) > 1:
        raise click.BadParameter(f"score one task file a run, as llama-perplexity does: pick one of --{chosen[0]} and "
                                 f"--{chosen[1]}", param_hint=f"--{chosen[1]}")
    if not chosen:
        return None
    for parameter, option in PERPLEXITY_ONLY.items():
        if option_given(parameter):
            raise click.BadParameter(f"applies to perplexity, and --{chosen[0]} scores the --text file as its task "
                                     f"file instead: drop one", param_hint=option)
    return chosen[0], tasks[chosen[0]][1]


def _task_context(context: int | None, max_context: int) -> int:
    """The most tokens a task's sequence may have: ``context`` (--context / -c, 0: the bundle's) or, not given, the
    bundle's ``max_context``; a context past the bundle's is refused, naming where it came from."""
    if context is None or context == 0:
        return max_context
    if context > max_context:
        raise _context_too_long(context, max_context, " is longer", " (0: the bundle's), the most tokens a task may have")
    return context


def _context_too_long(context: int, limit: int, said: str, more: str = "") -> click.BadParameter:
    """The refusal of a --context past the bundle's ``limit`` (max_context), naming LLAMA_ARG_CTX_SIZE where the
    value came from it."""
    if click.get_current_context().get_parameter_source("context") is click.core.ParameterSource.ENVIRONMENT:
        return click.BadParameter(f"{context} (from {CTX_SIZE_ENV}, llama.cpp's -c) is longer than the bundle's "
                                  f"max_context {limit}; set {CTX_SIZE_ENV} to {limit} or less (0: the bundle's) or "
                                  f"unset it, or pass --context {limit} or less", param_hint="--context")
    return click.BadParameter(f"{context}{said} than the bundle's max_context {limit}; pass --context {limit} or "
                              f"less{more}", param_hint="--context")


TASK_LABEL_WIDTH = 28  # an accuracy task's figures start in one column, after "multiple-choice (PyTorch)"


def _score_accuracy_task(kind: str, count: int, bundle: Path, text_file: Path, reference: bool,
                         reference_model: str | None, as_json: bool,
                         threads, backend, target, ignore_target, context: int | None = None) -> None:
    """``eval --hellaswag/--winogrande/--multiple-choice``: the --text task file scored as llama-perplexity scores
    it (edgesdk/accuracy.py), and with --reference by the PyTorch source model too.

    ``context``: --context / -c (or LLAMA_ARG_CTX_SIZE) where given, None where not (the bundle's context). As
    llama-perplexity's -c with a task (tools/perplexity/perplexity.cpp: a task's sequences go into its ``n_ctx``
    packed, the prefix they share once and each one's tokens past it, ``required_tokens``, and a task whose tokens
    so counted are more than it stops the run, "task %zu does not fit in the context window"), it is the most
    tokens one task may take so: a longer one is refused by name before any scoring. Not given, or 0 (the bundle's
    context, as common/arg.cpp's "0 = loaded from model", which llama-perplexity refuses), each sequence may have
    the bundle's max_context; one past the bundle's is refused, as for perplexity."""
    from edgesdk.accuracy import TaskTooLong, agreement, bundle_accuracy, read_task_file, reference_accuracy
    from edgesdk.evaluate import backend_record
    from edgesdk.runtime.session import open_runtime

    tasks = read_task_file(kind, text_file, count)  # a malformed file is named before the runtime loads
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target)
    limit = _task_context(context, runtime.backend.max_context)
    # llama-perplexity's -c (0: the bundle's context, which llama-perplexity would pack into too): a task's sequences
    # packed as it packs them; not given, each sequence may have the bundle's context
    packed = limit if context is not None else None
    source = _reference_source(runtime, bundle, reference_model) if reference else None
    # loaded (a --reference-model's shape checked) before the bundle scores the tasks
    model = _reference_model(source, runtime, bundle, reference_model, threads) if reference else None

    def scored(score):  # the bundle and the reference score the same tasks, within the same limit
        try:
            return score()
        except TaskTooLong as exc:
            if not exc.packed:
                raise
            raise EdgeSDKError(f"{exc.packed_need()}, more than --context {limit} (llama-perplexity's -c) lets a "
                               "task have",
                               f"pass a larger --context (the bundle takes up to {runtime.backend.max_context}; 0: "
                               "all of it), or remove that task from the file") from exc

    ours = scored(lambda: bundle_accuracy(runtime, kind, tasks, progress=True, context=packed))
    result = {"task": kind, **backend_record(runtime), "bundle": ours.to_json()}
    if reference:
        theirs = scored(lambda: reference_accuracy(model, runtime, kind, tasks, progress=True, context=packed))
        result.update(reference=theirs.to_json(), same_pick=round(agreement(ours, theirs), 6))
    if as_json:
        echo_json(result)
        return
    click.echo(f"{kind} (bundle)".ljust(TASK_LABEL_WIDTH) + ours.summary())
    if reference:
        click.echo(f"{kind} (PyTorch)".ljust(TASK_LABEL_WIDTH) + theirs.summary())
        click.echo("same pick".ljust(TASK_LABEL_WIDTH) + f"{result['same_pick']:.2%} of the tasks")
    for line in ours.llama_lines():  # the bundle's, in llama-perplexity's words, which scripts read
        click.echo(line)


def _say_windows_rule(context: int, stride: int) -> None:
    """Under --method windows (the default), what its figure scores, on stderr: it is not llama-perplexity's. With no
    overlap (stride == context) every token of a window but its first is scored, the first ones with little context
    before them, where llama-perplexity scores only the second half of each chunk: for the same -c the windows'
    figure is well above its (about 30 % on WikiText), and a user comparing the two would read it as a worse bundle.
    With a shorter stride a later window scores only its tokens past the overlap, each with at least context - stride
    tokens before it, so the figure may be above or below llama-perplexity's, and the note says only that it differs."""
    if stride >= context:
        scored = (f"every token of each {context}-token window but its first, the early ones with little context, so "
                  "its figure is higher than llama-perplexity's for the same -c (which scores only the second half "
                  "of each chunk)")
    else:
        scored = (f"every token of the first {context}-token window but its first, and of each later window, started "
                  f"{stride} tokens on, only the {stride} past its overlap with the one before (each with at least "
                  f"{context - stride} tokens before it), so its figure is not llama-perplexity's for the same -c "
                  "(which scores only the second half of each chunk)")
    click.echo(f"edgesdk eval: --method windows scores {scored}; for llama-perplexity's figure pass --method "
               "llama-perplexity --max-chars 0", err=True)


def _print_perplexity(result: dict, method: str, context: int, text_length: int, max_chars: int | None,
                      ppl_stride: int | None = None) -> None:
    """eval's perplexity result as text: the bundle's figure, and the reference's, the KL divergence, the last-word
    accuracy and the power gates' curve where the run has them (--json prints every figure)."""
    spans = "windows" if method == "windows" else f"chunks of {context}, llama-perplexity's rule" if not ppl_stride \
        else f"windows of {context} tokens, {ppl_stride} apart, llama-perplexity --ppl-stride's rule"
    bundle = result["bundle"]  # the figure ± its uncertainty, as llama-perplexity's "Final estimate" prints it
    click.echo(f"bundle perplexity    {_plus_minus(bundle['perplexity'], bundle['perplexity_uncertainty'], '.4f')} "
               f"({bundle['tokens_scored']} tokens, {bundle['windows']} {spans})")
    if method == "llama-perplexity" and bundle["perplexity_uncertainty"] is not None:
        # llama-perplexity's last line, which scripts read: its words and formats (tools/perplexity/perplexity.cpp)
        click.echo(f"Final estimate: PPL = {bundle['perplexity']:.4f} +/- {bundle['perplexity_uncertainty']:.5f}")
    if max_chars is not None and text_length > max_chars:
        click.echo(f"  scored the first {max_chars:,} of {text_length:,} characters (--max-chars); "
                   + ("llama-perplexity reads the whole file: pass --max-chars 0 for its figure"
                      if method == "llama-perplexity" else "pass --max-chars 0 to score the whole file"))
    if "reference" in result:
        reference = result["reference"]
        click.echo("reference (PyTorch)  "
                   + _plus_minus(reference["perplexity"], reference["perplexity_uncertainty"], ".4f"))
        click.echo(f"relative difference  {result['relative_difference'] * 100:+.3f} %")
    if "divergence" in result:
        d = result["divergence"]
        # one format for every KLD figure, llama-perplexity's %.6f: with a format each, max could read below p99
        click.echo(f"KL divergence        mean {d['mean_kld']:.6f}, median {d['median_kld']:.6f}, p99 {d['p99_kld']:.6f}, "
                   f"max {d['max_kld']:.6f} nats; same top token {d['same_top_token']:.2%} "
                   f"({d['tokens_scored']} tokens)")
        click.echo(f"                     mean KLD {_plus_minus(d['mean_kld'], d['mean_kld_uncertainty'], '.6f')} nats; "
                   f"PPL(Q)/PPL(base) {_plus_minus(d['ppl_ratio'], d['ppl_ratio_uncertainty'], '.6f')}, ln ratio "
                   f"{_plus_minus(d['ln_ppl_ratio'], d['ln_ppl_ratio_uncertainty'], '.6f')}; RMS Δp "
                   f"{_plus_minus(d['rms_dp'], d['rms_dp_uncertainty'], '.3%')}; same top token "
                   f"{_plus_minus(d['same_top_token'], d['same_top_token_uncertainty'], '.3%')} "
                   "(llama-perplexity --kl-divergence's statistics; all of them with --json)")
    base = result.get("kl_divergence_base")
    if base and base["written"]:
        click.echo(f"wrote the source model's distributions at {base['positions']:,} positions to {base['path']} "
                   f"({base['bytes'] / 1e6:.1f} MB); on the board: edgesdk eval BUNDLE --text FILE (the same, with "
                   f"the same settings) --kl-divergence-base {base['path']} --kl-divergence")
    elif base:
        click.echo(f"                     the source model's distributions from --kl-divergence-base {base['path']} "
                   f"(written with bundle {base['bundle_id']}, from {base['source']})")
    for key, label in (("last_word", "last word (bundle)"), ("reference_last_word", "last word (PyTorch)")):
        if key in result:
            found = result[key]
            accuracy = _plus_minus(100 * found["accuracy"], None if found["accuracy_uncertainty"] is None
                                   else 100 * found["accuracy_uncertainty"], ".2f")
            click.echo(f"{label:<21}accuracy {accuracy} %, word perplexity {found['word_perplexity']:.2f} "
                       f"({found['documents']} paragraphs)")
    if "power" in result:
        chosen, curve = result["power"]["chosen"], result["power"]["curve"]
        decimals = _tau_decimals([chosen["tau"], *(point["tau"] for point in curve)])
        click.echo(f"gated, controller    {chosen['perplexity']:.4f} ({chosen['relative_to_off'] * 100:+.2f} % vs "
                   f"gating off; tau {chosen['tau']:.{decimals}f}, {chosen['executed_fraction']:.1%} of FFN blocks "
                   "run)")
        for point in curve:
            click.echo(f"  budget {point['budget']:<5g} tau {point['tau']:.{decimals}f}  FFN blocks run "
                       f"{point['executed_fraction']:6.1%}  perplexity {point['perplexity']:.4f}")


BUDGETS_FIX = "e.g. --budgets 1.0,0.8,0.6 (the default)"
BUDGET_MEANING = "a compute budget is the largest mean fraction of FFN blocks a decode step may run"


def _budget_levels(budgets: str) -> tuple[float, ...]:
    """``--budgets``' compute budgets, each in (0, 1]; an entry that is no number, or out of range, is refused by
    its position and text (an empty entry, ``1,,0.5``, is skipped), and a list with none at all by its own words."""
    entries = [entry.strip() for entry in budgets.split(",")]
    if not any(entries):
        raise click.BadParameter(f"holds no compute budget (got {budgets!r}): pass one or more comma-separated "
                                 f"numbers in (0, 1], {BUDGETS_FIX}; {BUDGET_MEANING}", param_hint="--budgets")
    levels = []
    for position, entry in enumerate(entries, 1):
        if not entry:
            continue
        where = f"entry {position} ({entry!r}) of {budgets!r}" if len(entries) > 1 else repr(entry)
        try:
            level = float(entry)
        except ValueError:
            raise click.BadParameter(f"{where} is not a number: pass comma-separated numbers in (0, 1], "
                                     f"{BUDGETS_FIX}", param_hint="--budgets") from None
        if not 0 < level <= 1:
            raise click.BadParameter(f"{where} is outside (0, 1]: {BUDGET_MEANING}, so 1 runs every block and 0.5 "
                                     f"half of them; set it to a number in (0, 1], {BUDGETS_FIX}",
                                     param_hint="--budgets")
        levels.append(level)
    return tuple(levels)


# The fewest and most decimals a gated evaluation's thresholds are printed with (--json holds them to 5)
TAU_DECIMALS = (3, 5)


def _tau_decimals(taus: list[float]) -> int:
    """The decimals that tell every two different thresholds of the gated evaluation apart (3 at least, 5 at most, as
    --json rounds them): at 3, points 3e-4 apart (0.61909 and 0.61941) both read 0.619."""
    fewest, most = TAU_DECIMALS
    distinct = sorted(set(taus))
    return next((d for d in range(fewest, most) if len({f"{tau:.{d}f}" for tau in distinct}) == len(distinct)), most)


def _default_context_note(default: int, max_context: int) -> int:
    """The context eval scores in where --context was not given and its ``default`` is longer than the bundle's
    ``max_context`` (fixed when it was built): the bundle's, said on stderr with why, since a figure at another
    context than 512 is not the one a -c 512 run gives."""
    click.echo(f"edgesdk eval: context {max_context}, the bundle's max_context (fixed when it was built): the "
               f"default {default} is longer; pass --context N (at most {max_context}) to choose", err=True)
    return max_context


def _bundle_context(bundle: Path) -> int:
    """``--context 0``, as llama.cpp's ``-c 0`` reads in its other tools (common/arg.cpp: "0 = loaded from model";
    llama-perplexity's main refuses it: "perplexity tool requires '--ctx-size' > 0"): the bundle's context, from its
    manifest (graph.max_context), before the text is read and the runtime loads; a bundle that cannot be read is
    refused as the runtime refuses it."""
    from edgesdk.bundle import read_manifest

    max_context = read_manifest(bundle).get("graph", {}).get("max_context")
    if not isinstance(max_context, int) or max_context < 2:
        raise EdgeSDKError(f"--context 0 takes the context of {bundle}, and its manifest records none "
                           f"(graph.max_context is {max_context!r})", "pass --context N, the tokens per window")
    return max_context


def _text_as_llama_perplexity_reads(text_file: Path) -> str:
    """``eval --method llama-perplexity``: the text as ``llama-perplexity -f`` reads it (common/arg.cpp): the
    file's bytes unchanged (no newline translation: a CRLF file keeps its CR) with one trailing newline dropped.

    :func:`read_utf8` reads it, its line breaks kept: once, as llama-perplexity reads it, so that a pipe (``-f
    /dev/stdin``, ``-f <(zcat wiki.raw.gz)``) gives its text, which a second read finds gone; refused, as every
    text input is, where it is not UTF-8, or is UTF-16 / UTF-32 text without a byte-order mark (its NULs)."""
    text = read_utf8(text_file, "--text", newlines=False)
    return text[:-1] if text.endswith("\n") else text


def _last_word_documents(text: str, text_file: Path, max_chars: int | None) -> list[tuple[str, str]]:
    """``eval --last-word``: the paragraphs the task scores, found before any scoring, so that a text without
    them is refused at once rather than after the perplexity windows (minutes on a board) were scored.

    Only whole paragraphs (lines) of the part --max-chars keeps are read: a paragraph the cut falls inside is left
    out, as its tail is not there. Read whole, its head could pass for a paragraph (40-150 words ending in ' .',
    the end of one of its sentences), and the task would score the word before that sentence's full stop as a
    paragraph's last word, which LAMBADA's cloze (and lm-evaluation-harness's lambada) never does."""
    from edgesdk.evaluate import LAST_WORD_MAX_WORDS, LAST_WORD_MIN_WORDS, last_word_documents

    documents = last_word_documents(_whole_lines(text, max_chars))
    if not documents:
        cut, where = _part_scored(text, max_chars)
        raise EdgeSDKError(f"--last-word: --text {text_file} has no paragraph to score in {where}: the task takes "
                           f"paragraphs of {LAST_WORD_MIN_WORDS}-{LAST_WORD_MAX_WORDS} words ending in ' .', "
                           "as WikiText's",
                           ("raise --max-chars (0 scores the whole file), " if cut else "")
                           + "pass WikiText-2 (wiki.valid.raw) or text of that form, or drop --last-word")
    return documents


def _whole_lines(text: str, max_chars: int | None) -> str:
    """``text[:max_chars]`` without the line the cut falls inside (the whole text where nothing is cut, or where
    the cut falls at a line's end)."""
    kept = text[:max_chars]
    if max_chars is None or len(text) <= max_chars or text[max_chars] in "\r\n" or kept.endswith(("\r", "\n")):
        return kept
    return kept[:max(kept.rfind("\n"), kept.rfind("\r")) + 1]


def _part_scored(text: str, max_chars: int | None) -> tuple[bool, str]:
    """Whether --max-chars cuts ``text``, and the part scored as an error names it."""
    cut = max_chars is not None and len(text) > max_chars
    return cut, (f"its first {max_chars:,} characters (--max-chars)" if cut else f"its {len(text):,} characters")


def _reference_model(source, runtime, bundle: Path, reference_model: str | None, threads: int | None):
    """The PyTorch source model for --reference (``source``: :func:`_reference_source`), loaded by
    :func:`_load_reference_model` before the bundle is scored, so that a ``--reference-model`` of another shape than
    the manifest's ``model.before`` is refused before minutes of scoring, not after them: ``--reference-model`` goes
    with the manifest's record of the source it is checked against, and the bundle."""
    before = runtime.bundle.manifest["model"]["before"]
    return _load_reference_model(source, threads, before.get("adapters"),
                                 None if reference_model is None else (reference_model, before, bundle))


# The source's facts (LoadedModel.facts, recorded in the manifest's model.before) a --reference-model must share
SHAPE_FACTS = (("architecture", "architecture"), ("parameters", "parameters"), ("layers", "layers"),
               ("hidden_size", "hidden size"), ("attention_heads", "attention heads"), ("kv_heads", "KV heads"),
               ("intermediate_size", "intermediate size"), ("vocab_size", "vocabulary size"))


def _check_moved_source(facts: dict, moved: tuple[str, dict, Path]) -> None:
    """A ``--reference-model`` checked to be the model the bundle was built from: its shape (architecture, parameters,
    layers, ...) against the manifest's ``model.before``; one that differs is a ModelSourceError naming both. The
    manifest records no digest of the source's weights, so a model of the same shape (another fine-tune of it) is let
    through with a note on stderr that says so."""
    from edgesdk.errors import ModelSourceError

    given, recorded, bundle = moved
    differ = [f"{name} {facts[key]!r} where the manifest records {recorded[key]!r}" for key, name in SHAPE_FACTS
              if key in recorded and key in facts and facts[key] != recorded[key]]
    if differ:
        raise ModelSourceError(f"--reference-model {given} is not the model {bundle} was built from "
                               f"({recorded.get('source')}, as its manifest records): it has " + ", ".join(differ),
                               "pass the model the bundle was built from where it is now, e.g. --reference-model "
                               "DIR (a Hugging Face directory, a .gguf file or an alias), or drop --reference to "
                               "score the bundle alone")
    click.echo(f"edgesdk eval: --reference-model {given} has the shape of the model {bundle} was built from "
               f"({recorded.get('architecture')}, {recorded.get('parameters', 0):,} parameters); the manifest records "
               "no digest of that model's weights, so they are not checked: another fine-tune of the same model "
               "would pass", err=True)


def _load_reference_model(source, threads: int | None, recorded: list | None = None,
                          moved: tuple[str, dict, Path] | None = None):
    """The PyTorch source model for --reference, on as many threads as the bundle ran on (``--threads``;
    PyTorch would otherwise take every core), with the LoRA adapters the build merged merged again (the
    fine-tuned model is the one the bundle was made from), loaded as the build loads it: a Phi-3 or Granite model
    as the Llama it computes, after the adapters are merged into its own modules. The modules an adapter's
    adapter_config.json leaves out (not merged, as PEFT does not load them) are said on stderr as the build says
    them (lora.left_out_warning), not as a Python warning; ``recorded``: the manifest's records of the adapters
    (``model.before.adapters``), whose ``ignored`` says where the bundle's manifest lists all of them; ``moved``:
    the ``--reference-model`` given, checked against the manifest's record of the source (:func:`_check_moved_source`)
    before the adapters are merged."""
    import warnings

    import torch

    from edgesdk.models.loader import load_as_llama, load_model
    from edgesdk.models.lora import LoraMergeNote, gguf_architecture, left_out_warning, merge_adapters

    if threads:
        torch.set_num_threads(threads)
    model_source, adapters = source
    loaded = load_model(model_source, as_llama=False)
    if moved is not None:
        _check_moved_source(loaded.facts(), moved)
    if adapters:
        with warnings.catch_warnings():  # its text is in the records' "ignored", said below
            warnings.simplefilter("ignore", LoraMergeNote)
            records = merge_adapters(loaded.model, adapters, gguf_architecture(model_source, loaded.model))
        for index, record in enumerate(records):
            # the whole list is in the bundle's manifest where its build left out the same modules
            kept = recorded[index] if recorded and index < len(recorded) else {}
            listed = isinstance(kept, dict) and kept.get("ignored") == record.get("ignored")
            warning = left_out_warning(record, "the bundle's manifest" if listed else None)
            if warning is not None:
                click.echo(f"edgesdk eval: {warning}", err=True)
    return load_as_llama(loaded).model


def _reference_asked(reference_model: str | None) -> tuple[str, str]:
    """The option that asked for the PyTorch source model, as the user gave it (``--reference-model``, which implies
    --reference, where given), and the fix that scores the bundle alone: drop it (and --reference, where it was
    given too)."""
    if reference_model is None:
        return "--reference", "drop --reference"
    return "--reference-model", "drop --reference-model" + (" and --reference" if option_given("reference") else "")


def _reference_source(runtime, bundle: Path, reference_model: str | None = None):
    """The model the bundle was built from (its manifest's source, or ``--reference-model`` where the model has moved)
    and the LoRA adapters merged into it (its ``adapters``), for --reference; an error naming the option given
    (:func:`_reference_asked`) and the recorded source or adapter where it is not here (a bundle copied off its build host) or an adapter's weights
    changed since the build."""
    from edgesdk.errors import ModelSourceError
    from edgesdk.models.sources import ALIASES, resolve_model

    before = runtime.bundle.manifest["model"]["before"]
    recorded = before["source"]
    if reference_model is not None:
        try:
            source = resolve_model(reference_model)
        except ModelSourceError as exc:
            raise ModelSourceError(f"--reference-model {reference_model}: {exc.problem}",
                                   re.sub(r"--model\b", "--reference-model", exc.fix or "")
                                   or "pass a Hugging Face directory, a .gguf file or an alias") from exc
        return source, _recorded_adapters(before.get("adapters") or [], bundle, reference_model)
    try:
        source = resolve_model(recorded)
    except ModelSourceError as exc:
        fixes = [exc.fix if recorded in ALIASES and exc.fix else
                 f"run it where {recorded} is (the machine that built the bundle)",
                 "pass the model where it is now, e.g. --reference-model DIR (a Hugging Face directory, a .gguf file "
                 "or an alias, as build's --model takes)"]
        raise ModelSourceError(
            f"--reference scores the model {bundle} was built from, {recorded} (as its manifest records), "
            f"and that model cannot be loaded here: {exc.problem}",
            "; or ".join([*fixes, "drop --reference to score the bundle alone"])) from exc
    return source, _recorded_adapters(before.get("adapters") or [], bundle)


def _recorded_adapters(records: list, bundle: Path, reference_model: str | None = None) -> tuple:
    """The manifest's records of the merged LoRA adapters as adapters to merge again, each checked to be the
    files the build merged (the weights' sha256, and a PEFT adapter's adapter_config.json's, whose alpha and
    patterns decide the merge). ``reference_model``: the --reference-model given, which moves the source model
    only: an adapter is still read where the manifest records it (the build host's path), as the refusal says."""
    from edgesdk.errors import ModelSourceError
    from edgesdk.hashing import sha256_file
    from edgesdk.models.lora import PEFT_CONFIG, LoraAdapter

    adapters = []
    for record in records:
        path = Path(record["path"])
        # a PEFT adapter is a directory whose weights are its recorded file, even where the directory is gone
        peft = record.get("form") == "peft" or path.is_dir()
        checked = [(path / record["file"] if peft else path, record["sha256"], "weights")]
        if record.get("config_sha256"):
            checked.append((path / PEFT_CONFIG, record["config_sha256"], "configuration"))
        for file, digest, what in checked:
            if not file.is_file() or sha256_file(file) != digest:
                found = "is not here" if not file.is_file() else "has changed since the build (another sha256)"
                asked, drop = _reference_asked(reference_model)
                moved = "" if reference_model is None else (
                    f" (--reference-model {reference_model} gives the source model only: the adapters are read "
                    "where the manifest records them, the build host's paths, and no option gives them elsewhere)")
                raise ModelSourceError(f"{asked} scores the model {bundle} was built from, which has the LoRA "
                                       f"adapter {path} merged in (as its manifest records), and the adapter's "
                                       f"{what} {file} {found}{moved}",
                                       f"put the adapter the build merged ({file.name} of sha256 {digest[:16]}...) "
                                       f"back at {path}, or {drop} to score the bundle alone")
        adapters.append(LoraAdapter(str(path), float(record["scale"])))
    return tuple(adapters)
