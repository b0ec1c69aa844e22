"""``edgesdk run``: generate text with a bundle, one prompt or a chat on stdin, as llama-cli does (registered in
:mod:`edgesdk.cli`). The interactive input is :mod:`edgesdk.cli_interactive`, ``--prompt-cache`` is
:mod:`edgesdk.cli_prompt_cache`; the options run shares with ``serve`` are :mod:`edgesdk.cli_options`.

Importing this module imports click only; the runtime loads when the command runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import click

from edgesdk.api_checks import UNLIMITED_TOKENS
from edgesdk.cli_interactive import (
    AnswerNotWritten,
    Chat,
    DeferredInterrupt,
    ReversePrompts,
    Transcript,
    TypedPrompt,
    process_escapes,
    typed_prompt_ids,
    write_answer,
)
from edgesdk.cli_llama import (
    CTX_SIZE_ENV,
    LLAMA_OPTION_NAMES,
    MODEL_ENV,
    LlamaCommand,
    LlamaEnvOption,
    bundle_or_model,
    checked_ctx_size,
    ctx_size_env_note,
    ctx_size_source,
    llama_switch_given,
    say_model_env_overridden,
    say_unread_llama_env,
    told_from_env,
    typed_option,
)
from edgesdk.cli_options import (
    LLAMA_SEED,
    SAMPLING_OPTIONS,
    SEED_RULE,
    NamedPath,
    bad_sampling_option,
    configure_gates,
    draft_model,
    draft_options,
    escape_option,
    gate_options,
    lookup_config,
    open_thermal,
    option_given,
    read_template_kwargs,
    repeat_penalty_options,
    runtime_options,
    sampler_chain,
    sampler_chain_options,
    sampling_option_given,
    thermal_options,
    token_limit,
    warn_unused_draft_options,
    warn_unused_thermal_options,
)
from edgesdk.cli_prompt_cache import load_prompt_cache, prompt_cache_mode, writable_prompt_cache
from edgesdk.errors import EdgeSDKError, read_utf8

if TYPE_CHECKING:
    from edgesdk.runtime.generate import SamplingConfig


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The options of ``edgesdk run`` that say what to answer and how, checked before the bundle loads (the
    runtime's, the draft's, the thermal guard's and the gates' options go to :mod:`edgesdk.cli_options`)."""

    sampling: SamplingConfig  # as typed; --ignore-eos and the vocabulary check come with the model
    prompt: str | None  # --prompt, or the text of --file; None: the prompts come from stdin
    prompt_option: str  # "--prompt" or "--file", as a warning names the prompt
    in_prefix: str  # --in-prefix with its escapes processed ("" when not given)
    in_suffix: str  # --in-suffix, likewise
    reverse_prompts: tuple[str, ...]  # -r, escapes processed
    json_object: bool  # --json
    schema: object | None  # --json-schema, compiled
    grammar: object | None  # --grammar / --grammar-file, parsed (runtime.gbnf)
    grammar_option: str  # the option that gave the grammar, as an error about its tokens names it
    prompt_cache: Path | None  # --prompt-cache, its directory writable (unless --prompt-cache-ro)
    ignore_eos: bool  # --ignore-eos
    raw: bool  # --raw: the prompt as it is, without the chat template
    system: str | None  # --system
    template_kwargs: dict  # --chat-template-kwargs
    history: bool | None  # --history / --no-history as typed (None: on at a terminal)
    stats: bool  # --stats
    context_shift: bool = False  # --context-shift: a full context shifts and the answer goes on
    keep: int = 0  # --keep: the prompt's tokens a shift keeps (-1: all of them)
    prompt_cache_mode: str | None = None  # "prompt", "all" (--prompt-cache-all), "ro" (--prompt-cache-ro); None: none
    multiline_input: bool = False  # --multiline-input: a prompt read from stdin ends at a line ending in '\\' or '/'
    shift_refused: bool = False  # --context-shift given with -n -2, which stops at the full context instead
    chat: bool = False  # -cnv, -i or -if: the history is kept unless --no-history, also for piped input
    go_on: bool = False  # -cnv / -i with --prompt or --file: after its answer the chat goes on reading stdin
    single_turn: bool = False  # -st: one prompt answered, then the session ends
    raw_option: str = "--raw"  # the option that fed the prompt as it is, as a warning names it (-no-cnv too)
    in_prefix_bos: bool = False  # --in-prefix-bos: the vocabulary's BOS before each prompt read from stdin
    system_option: str = "--system"  # "--system" or "--system-prompt-file", as a warning names the system message
    prompt_only: bool = False  # -n 0: the prompt prefilled (and its --prompt-cache written), no answer generated
    verbose_prompt: bool = False  # llama.cpp's --verbose-prompt: each prompt's tokens on stderr before its answer
    # -if with --prompt / --file: fed as it is (--raw, -no-cnv, no chat template) that text is prefilled and the first
    # line read from stdin goes on it before anything is generated; through the chat template it is -cnv -p's first turn
    user_first: bool = False
    default_limit: bool = False  # -n not given (128): an answer cut there says so, as llama-cli's default is -1


@click.command(cls=LlamaCommand, context_settings=LLAMA_OPTION_NAMES)
# LLAMA_ARG_MODEL: llama-cli's -m (common/arg.cpp), read where no BUNDLE is given
@click.argument("bundle", type=click.Path(path_type=Path), envvar=MODEL_ENV, required=False)
@click.option("--model", "-m", "model", type=click.Path(path_type=Path), metavar="BUNDLE",
              help="The BUNDLE, as llama-cli's -m / --model names its model (give it once: as BUNDLE or -m).")
@click.option("--prompt", "-p", help="Prompt text; without it, read prompts interactively from stdin.")
@click.option("--file", "-f", "prompt_file", type=NamedPath("prompt file", "-f prompt.txt", dir_okay=False),
              help="Read the prompt from this UTF-8 file (llama-cli's -f), whole, its line ends as they are (a CRLF "
                   "file keeps its CR) but for one newline at its end, as llama-cli drops it; its escapes are "
                   "read as --prompt's (--no-escape: as written). '-' reads it from stdin (as /dev/stdin does).")
@click.option("--max-new-tokens", "-n", "--predict", "--n-predict", "max_new_tokens", default=128, show_default=True,
              cls=LlamaEnvOption, envvar="LLAMA_ARG_N_PREDICT",
              help="The answer's token limit: -1 no limit but the context (with --context-shift none at all), -2 "
                   "until the context is full (also with --context-shift), any other number below 0 as -1, as "
                   "llama-cli's -n (--predict); 0: prefill the prompt only (with -p / -f), as llama.cpp, e.g. to "
                   "write its --prompt-cache. In a "
                   "plain-text session (--raw or -no-cnv, reading stdin) one budget that the answers and the typed "
                   "lines spend, starting over once spent, as llama-completion's. Not given, an answer cut at the "
                   "default 128 says so on stderr (llama-cli's default is -1).")
@click.option("--ignore-eos", is_flag=True,
              help="Never end at an end-of-text or end-of-turn token (their logits set to -inf, as llama.cpp's "
                   "--ignore-eos): an answer runs to -n tokens, unless --json, --json-schema or --grammar ends it.")
@click.option("--temperature", "--temp", default=0.0, show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_TEMPERATURE",
              help="0 (or below, as llama-cli) means greedy decoding. Not given: the model's own, where its bundle records one (as --top-p, "
                   "--top-k, --min-p, --repeat-penalty, --repeat-last-n and --samplers; 'edgesdk inspect' shows "
                   "them).")
@click.option("--top-p", default=1.0, show_default=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_TOP_P",
              help="Nucleus sampling mass (with --temperature > 0).")
@click.option("--top-k", default=0, show_default=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_TOP_K",
              help="Sample from the K most likely tokens only (with --temperature > 0; 0 or below: off, as llama-cli).")
@click.option("--min-p", default=0.0, show_default=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_MIN_P",
              help="Sample only tokens at least this fraction as likely as the top one (with --temperature > 0; "
                   "0: off).")
@click.option("--logit-bias", "-l", "logit_bias", multiple=True, metavar="ID=BIAS",
              help="Add BIAS (-100..100, or -inf: never) to token ID's logit, greedy or sampled (repeatable; "
                   "llama.cpp's ID+BIAS / ID-BIAS form works too, e.g. 15043-inf).")
@sampler_chain_options
@click.option("--seed", "-s", type=LLAMA_SEED,
              help=f"Seed for sampling (unset: a random one, as llama-cli's default -1; {SEED_RULE}).")
@repeat_penalty_options(per_request=False)
@click.option("--presence-penalty", default=0.0, show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_PRESENCE_PENALTY",
              help="Lower a seen token's logit by this, once (OpenAI's presence penalty; any number, as llama-cli's).")
@click.option("--frequency-penalty", default=0.0, show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_FREQUENCY_PENALTY",
              help="Lower a seen token's logit by this per occurrence (OpenAI's frequency penalty; any number, as "
                   "llama-cli's).")
@click.option("--no-display-prompt", "no_display_prompt", is_flag=True,
              help="Accepted for llama-cli's scripts: run never shows the prompt, only the answer (llama-cli shows "
                   "it unless given this).")
@click.option("--raw", is_flag=True, help="Feed the prompt as is, without the model's chat template.")
@click.option("--system", "--system-prompt", "-sys", help="System message for the chat template.")
@click.option("--system-prompt-file", "-sysf", "system_file",
              type=NamedPath("system prompt file", "-sysf system.txt", dir_okay=False),
              metavar="FILE",
              help="--system read from a UTF-8 file, one line end at its end dropped (llama-cli's -sysf).")
@click.option("--chat-template-kwargs", "template_kwargs", metavar="JSON", cls=LlamaEnvOption,
              envvar=["LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "LLAMA_CHAT_TEMPLATE_KWARGS"], callback=lambda ctx, param, value:
              read_template_kwargs(value),
              help="Extra variables for the chat template, a JSON object (llama.cpp's --chat-template-kwargs), e.g. "
                   "'{\"enable_thinking\": false}' for a Qwen3 answer without thinking.")
@click.option("--conversation/--no-conversation", "-cnv/-no-cnv", "conversation", default=None,
              help="llama-cli's -cnv / --conversation: a chat, through the chat template, keeping the history "
                   "(--history); with --prompt or --file, that prompt is its first turn and the chat goes on reading "
                   "stdin. -no-cnv / --no-conversation: no chat template (--raw) and no history: the prompt is "
                   "continued as plain text, as llama-cli's completion mode.")
@click.option("--single-turn", "-st", "single_turn", is_flag=True,
              help="llama-cli's -st / --single-turn: answer one prompt, then exit (with --prompt or --file that "
                   "prompt, as without -st; else the first one read from stdin).")
@click.option("--interactive", "-i", "interactive_mode", is_flag=True,
              help="llama-cli's -i / --interactive: after the answer to --prompt or --file, go on reading prompts "
                   "from stdin, keeping the history (--history): through the chat template, or with --raw or -no-cnv "
                   "as one plain text that each line and answer go on, as llama-cli's interactive completion; "
                   "without them prompts are read from stdin anyway.")
@click.option("--interactive-first", "-if", "interactive_first", is_flag=True,
              help="llama-cli's -if / --interactive-first: the user speaks first, the history kept (what run does "
                   "without --prompt or --file). With --prompt or --file fed as it is (--raw, -no-cnv or a bundle "
                   "without a chat template) that text is prefilled and the first line read from stdin goes on it "
                   "before anything is generated, as llama-completion's -if (e.g. -f chat.txt -if --in-prefix 'User: ' "
                   "--in-suffix '\\nBot:' -r 'User:'); through the chat template it is the first user turn, answered "
                   "before stdin is read, as -cnv -p (llama.cpp's conversation mode turns -if on by itself and answers "
                   "-p first). With -st the prompt is answered alone, as there.")
@click.option("--history/--no-history", default=None,
              help="Interactive input: keep the conversation, each line a new turn after the earlier ones "
                   "(their tokens stay in the KV cache; '/clear' starts over); with --raw, -no-cnv or a bundle "
                   "without a chat template, one plain text that each line and answer go on. On by default at a "
                   "terminal and with -cnv, -i or -if, off for piped input (each line its own conversation).")
@click.option("--in-prefix", metavar="TEXT",
              help="Put TEXT before each prompt read from stdin (llama-cli's --in-prefix): inside the user's turn of "
                   "the chat template, or in the prompt's text with --raw or a bundle without a template (there "
                   "shown before the input at a terminal, as llama-cli's raw interactive mode shows it). llama-cli "
                   "turns its chat template off when given it: pass --raw for that. Escapes are processed as "
                   "llama-cli's: \\n, \\r, \\t, \\', \\\", \\\\ and \\xHH.")
@click.option("--in-prefix-bos", "in_prefix_bos", is_flag=True,
              help="Put the vocabulary's BOS token before each prompt read from stdin, before --in-prefix "
                   "(llama-cli's --in-prefix-bos), also where the tokenizer adds none (SmolLM2's, Qwen's): with "
                   "--raw, -no-cnv or a bundle without a chat template, as llama-cli turns its chat template off "
                   "for it.")
@click.option("--in-suffix", metavar="TEXT",
              help="Put TEXT after each prompt read from stdin (llama-cli's --in-suffix), as --in-prefix, e.g. --raw "
                   "--in-prefix 'User: ' --in-suffix '\\nAssistant:' -r 'User:'.")
@click.option("--reverse-prompt", "-r", "reverse_prompts", multiple=True, metavar="TEXT",
              help="Stop the answer once its text holds TEXT (llama-cli's reverse prompt; repeatable), and the next "
                   "prompt comes; with --prompt or --file it ends the answer. Through the chat template TEXT is a "
                   "stop string, as in llama-cli's chat: left out of the answer shown and kept. With --raw, -no-cnv "
                   "or a bundle without a chat template the answer shows and keeps TEXT, and special tokens such as <|im_start|> count as their "
                   "text, as in llama-completion. Escapes as in --in-prefix.")
@click.option("--multiline-input", "-mli", "multiline_input", is_flag=True,
              help="Prompts read from stdin go on over the lines typed or pasted, without a '\\' at each line's end "
                   "(llama-cli's -mli): end a prompt with a line ending in '\\' (or in '/': no line break at the "
                   "end), or with Ctrl-D.")
@escape_option
@click.option("--json", "json_object", is_flag=True,
              help="JSON mode: each answer is one JSON object (tokens that cannot continue one are never taken; "
                   "the answer ends when the object closes).")
@click.option("--json-schema", "-j", "json_schema", metavar="FILE|JSON",
              help="Each answer follows this JSON schema (a file holding it, or its JSON text): an object or array "
                   "with typed properties, as pydantic and the openai client write them: required, enum, const, anyOf / "
                   "oneOf, items / prefixItems, additionalProperties, $defs / $ref, string lengths, pattern and "
                   "format, number bounds and multipleOf, uniqueItems; not, if / then and propertyNames are refused "
                   "by name.")
@click.option("--json-schema-file", "-jf", "json_schema_file",
              type=NamedPath("schema file", "-jf schema.json", dir_okay=False),
              metavar="FILE", help="--json-schema read from a file (llama-cli's -jf).")
@click.option("--grammar", metavar="GBNF",
              help="Each answer follows this GBNF grammar (llama.cpp's language: rules, \"literals\", [classes], "
                   "groups, * + ? {m,n}); the end-of-text token only where the grammar accepts.")
@click.option("--grammar-file", type=NamedPath("grammar file", "--grammar-file json.gbnf", dir_okay=False),
              help="--grammar read from a .gbnf file (llama.cpp's grammars work unchanged).")
@click.option("--lookup", "lookup_draft", default=0, show_default=True, type=click.IntRange(0, 64), metavar="N",
              help="Prompt lookup decoding: where the last tokens occurred before in the prompt or answer, check up "
                   "to N tokens of what followed them in one pass (fast where the answer copies, e.g. 2x when "
                   "repeating a text; 0: off). Greedy answers can differ at near-ties of a quantized model.")
@click.option("--prompt-cache",
              type=NamedPath("prompt cache file", "--prompt-cache prompt.cache", dir_okay=False), metavar="FILE",
              help="Keep the KV cache in FILE between runs (llama-cli's --prompt-cache): a prompt that begins as the "
                   "one the file holds prefills only what follows; the prompt's cache is written where the file did "
                   "not hold the whole prompt (once the answer ends, or Ctrl-C stops it). A read-only FILE (chmod "
                   "a-w) is read and never written, as with --prompt-cache-ro; with the power gates steered (--gating) "
                   "FILE is not used.")
@click.option("--prompt-cache-all", is_flag=True,
              help="With --prompt-cache: write the prompt and the answer to FILE after each answer, and what it "
                   "reached at a Ctrl-C (llama-cli's --prompt-cache-all; here in a chat too).")
@click.option("--prompt-cache-ro", is_flag=True,
              help="With --prompt-cache: use FILE but never write it (llama-cli's --prompt-cache-ro), e.g. a shared "
                   "cache of a long system prompt; a missing FILE is said and the prompt prefilled whole.")
@click.option("--stats", is_flag=True, help="Print prompt tokens (and those from the cache), prefill/decode tok/s, time "
                                           "to first token, p95 inter-token latency, why the answer stopped, the "
                                           "bundle's load time, the time since it began loading and peak RSS on "
                                           "stderr after each answer, one stopped with Ctrl-C too ('stop: "
                                           "interrupted'), as llama.cpp prints its timings then; under the thermal "
                                           "guard also its waits and the decode rate with them.")
@click.option("--context-shift/--no-context-shift", default=False, show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_CONTEXT_SHIFT", negated_env="LLAMA_ARG_NO_CONTEXT_SHIFT",
              help="Where the answer fills the context, keep its first --keep tokens, drop half of the rest and go on "
                   "(llama-cli's option; off: the answer stops at the full context). Each shift prefills the tokens "
                   "kept again.")
@click.option("--keep", default=0, show_default=True, type=click.IntRange(min=-1), metavar="N",
              help="With --context-shift: the prompt's first N tokens (and its BOS) stay in the context at a shift "
                   "(-1: the whole prompt), as llama-cli's --keep.")
@draft_options
@thermal_options
@gate_options
@runtime_options(llama_env=True)
def run(bundle, prompt, prompt_file, max_new_tokens, ignore_eos, temperature, top_p, top_k, min_p, logit_bias,
        samplers, sampling_seq, seed, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty,
        no_display_prompt, raw, system, system_file, template_kwargs, history, in_prefix, in_prefix_bos, in_suffix,
        reverse_prompts,
        multiline_input, escape, json_object, json_schema, json_schema_file, grammar, grammar_file, lookup_draft,
        prompt_cache, prompt_cache_all, prompt_cache_ro,
        stats, context_shift, keep,
        draft_bundle, draft_max, draft_min, draft_p_min,
        watch_thermal, simulate_thermal, no_guard, clock_cap, telemetry, ambient, thermal_target, sim_speed,
        entropy_target, compute_budget, gating,
        threads, backend, target, ignore_target, model, conversation, single_turn, interactive_mode,
        interactive_first):
    """Generate text with a bundle, streaming tokens to stdout.

    llama-cli's environment variables set the options they set there (LLAMA_ARG_N_PREDICT, LLAMA_ARG_TEMPERATURE,
    LLAMA_ARG_THREADS, ...: each option below names its own; LLAMA_ARG_MODEL is the BUNDLE where none is given), as
    llama.cpp reads them for every tool; the command line goes over them.

    The bundle is verified (hashes, target) before anything runs. Greedy by default, unless the model publishes
    sampling settings (its generation_config.json or GGUF general.sampling keys, which 'edgesdk inspect' shows):
    those apply to each sampling option not given, as llama-cli takes them, and a line on stderr says so. With
    --watch-thermal the thermal guard keeps the board under its throttle point (it says which
    sensors it found, or what it fell back to); --telemetry records every step.

    \b
    Without --prompt or --file each line on stdin is a prompt (at a terminal, a chat), taken as typed (no escapes,
    as llama-cli's chat; -e is for the command line):
      text\\     (a line ending in a backslash) the prompt goes on with the next line
                (with --multiline-input every line does, and this one ends the prompt)
      text/     (a line ending in a slash) the prompt ends here, the slash left out
      /clear    forget the conversation (--history; the system message stays)
      /regen    drop the last answer and generate it again (a --seed moves on by one each time)
      /read F   the text of file F goes before the next prompt
      /exit     end the session; so do Ctrl-D and Ctrl-C at the prompt (exit 130 with --raw or -no-cnv)
      (empty)   with --raw or -no-cnv and the history kept, the answer goes on where the text stands
      Ctrl-C    stop the answer being written; the conversation keeps what it showed

    -c N (--ctx-size) up to the bundle's context is the context the run holds (a prompt past it is refused); 0 is
    the bundle's own, and more than it holds, fixed when it was built, is refused with the rebuild.
    llama-cli's options that change nothing here are accepted and said so on stderr (-ngl, -fa, --jinja, --mlock,
    --no-mmap, --no-warmup, --color, -np 1, -ctk / -ctv f16, ...); those that would change what run does are refused
    by name.
    """
    from edgesdk.runtime.prompt_cache import PromptCache
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.api import default_seed

    bundle = bundle_or_model(bundle, model, "BUNDLE")
    raw, chat, go_on = _llama_cli_mode(conversation, interactive_mode, interactive_first, single_turn,
                                       prompt is not None or prompt_file is not None, raw)
    user_first = interactive_first and go_on  # with --prompt / --file (go_on: a prompt given, no -st)
    limit = _env_token_limit(max_new_tokens, alone=(prompt is not None or prompt_file is not None) and not go_on)
    # The options are checked in the order of these arguments, all before the bundle loads.
    settings = RunSettings(
        sampling=_sampling_config(max_new_tokens=limit or 1,  # -n 0 generates nothing: RunSettings.prompt_only
                                  temperature=_llama_temperature(temperature), top_p=top_p,
                                  top_k=max(top_k, 0), min_p=min_p,
                                  seed=default_seed(seed),
                                  repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  logit_bias=logit_bias, samplers=samplers, sampling_seq=sampling_seq),
        prompt=_one_prompt(prompt, prompt_file, escape),
        prompt_option="--file" if prompt_file is not None else "--prompt",
        in_prefix=_escaped_affix(in_prefix, "'--in-prefix'", escape),
        in_suffix=_escaped_affix(in_suffix, "'--in-suffix'", escape),
        reverse_prompts=_reverse_prompts(reverse_prompts, escape),
        json_object=json_object,
        schema=_read_json_schema(json_schema, json_object, json_schema_file),
        grammar=_read_grammar(grammar, grammar_file, json_object, json_schema, json_schema_file),
        grammar_option="'--grammar-file'" if grammar_file else "'--grammar'",
        prompt_cache=writable_prompt_cache(prompt_cache, read_only=prompt_cache_ro),
        ignore_eos=ignore_eos, raw=raw, system=_system_message(system, system_file), template_kwargs=template_kwargs,
        history=history, stats=stats,
        context_shift=context_shift and max_new_tokens != UNTIL_THE_CONTEXT_IS_FULL, keep=keep,
        multiline_input=multiline_input, shift_refused=context_shift and max_new_tokens == UNTIL_THE_CONTEXT_IS_FULL,
        prompt_cache_mode=prompt_cache_mode(prompt_cache, prompt_cache_all, prompt_cache_ro),
        chat=chat, go_on=go_on, single_turn=single_turn,
        raw_option="-no-cnv" if conversation is False else "--raw", in_prefix_bos=in_prefix_bos,
        system_option="--system-prompt-file" if system_file is not None else "--system",
        prompt_only=limit == 0, verbose_prompt=llama_switch_given("verbose_prompt"), user_first=user_first,
        default_limit=not option_given("max_new_tokens"))
    settings = _without_closed_stdin(settings)
    _check_stdout_open()
    # llama-cli would act on them: said, as serve says them, not ignored silently (LLAMA_ARG_CTX_SIZE once the
    # bundle's context is known); a LLAMA_ARG_MODEL that the BUNDLE or -m goes over is said too, as llama-cli warns
    say_model_env_overridden()
    say_unread_llama_env("llama-cli", MODEL_ENV, CTX_SIZE_ENV)
    started = time.perf_counter()  # --stats' load and total times count from here, as llama.cpp's from the model load
    # with a draft bundle, two bundles open: the lines saying which backend each runs on name them
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target, verbose=stats,
                           name=str(bundle) if draft_bundle is not None and not settings.prompt_only else None,
                           context=asked_context(bundle),  # -c N: the run's context, said with --stats
                           context_source=ctx_size_source())  # -c or LLAMA_ARG_CTX_SIZE, as a refusal names it
    if (note := ctx_size_env_note(runtime.backend.max_context, bundle)) is not None:
        click.echo(f"edgesdk: {note}", err=True)
    tokenizer = runtime.tokenizer
    tokenizer.template_kwargs = template_kwargs
    loaded_s = time.perf_counter() - started
    _check_in_prefix_bos(settings, tokenizer)
    _check_user_first(settings, tokenizer)
    sampling = _with_model_defaults(_sampling_for_model(settings, tokenizer), runtime.bundle.manifest)
    thermal_settings = {"watch_thermal": watch_thermal, "simulate_thermal": simulate_thermal, "telemetry": telemetry,
                       "no_guard": no_guard, "clock_cap": clock_cap, "ambient": ambient, "sim_speed": sim_speed,
                       "thermal_target": thermal_target}
    _warn_unused_options(settings, sampling, tokenizer, thermal_settings)
    interactive = (settings.prompt is None or settings.go_on) and sys.stdin.isatty()
    _check_system_fits(settings, runtime)
    conversation = _open_conversation(settings, runtime, interactive)
    cache = PromptCache(runtime.backend)
    # the gates first: a cache file is loaded only where it was computed with the gates this run computes with
    configure_gates(runtime.backend, entropy_target, compute_budget, gating, bundle=runtime.bundle.path)
    cache_file = load_prompt_cache(settings.prompt_cache, cache, runtime, settings.stats, settings.prompt_cache_mode)
    token_bytes = _check_constraint_tokens(settings, tokenizer)
    if settings.prompt_only:  # -n 0 drafts nothing: --draft and --lookup were said unused (_warn_unused_options)
        draft_bundle, lookup_draft = None, 0
    else:
        warn_unused_draft_options(draft_bundle)
    with told_from_env("draft_bundle", "draft_min", "draft_max"):  # each may come from LLAMA_ARG_SPEC_DRAFT_*
        draft = draft_model(draft_bundle, runtime, draft_max, draft_min, draft_p_min, threads, target, ignore_target,
                            lookup_draft, verbose=settings.stats)
    lookup = draft or lookup_config(runtime.backend, lookup_draft)
    thermal = open_thermal(runtime, **thermal_settings, status=watch_thermal or simulate_thermal)
    try:
        answerer = Answerer(runtime, settings, sampling, conversation=conversation, cache=cache,
                            cache_file=cache_file, token_bytes=token_bytes, lookup=lookup, thermal=thermal,
                            clock=(started, loaded_s))
        _answer_all(answerer, settings, thermal, interactive)
    finally:
        if thermal is not None:
            thermal.close()


def _answer_all(answerer: Answerer, settings: RunSettings, thermal, interactive: bool) -> None:
    """The run's prompts answered: --prompt / --file alone, or a session reading stdin (after --prompt's answer with
    -i / -cnv, after its prefill with -if fed as it is). An answer Ctrl-C stopped has its --stats line printed
    before the run exits 130, as llama.cpp prints its timings before it exits (an interactive session prints it
    where the answer stopped, cli_interactive.Chat)."""
    try:
        _answer_prompts(answerer, settings, thermal, interactive)
    except KeyboardInterrupt:
        answerer.say_stopped_stats(new_line=True)
        raise


def _answer_prompts(answerer: Answerer, settings: RunSettings, thermal, interactive: bool) -> None:
    """:func:`_answer_all`'s prompts, as llama-cli takes them (see there)."""
    if settings.prompt is not None and not settings.go_on:
        answerer.answer(settings.prompt)
        return
    # The affixes are shown with the input where the prompt is the text itself, as llama-cli's interactive
    # mode without a chat template prints the prefix before reading and the suffix after (tools/main/main.cpp).
    show_affixes = interactive and answerer.as_it_is
    chat = Chat(answerer, thermal, interactive=interactive, in_prefix=settings.in_prefix,
                in_suffix=settings.in_suffix, show_affixes=show_affixes, multiline=settings.multiline_input,
                single_turn=settings.single_turn)
    if settings.prompt is not None and settings.user_first and answerer.as_it_is:
        answerer.prefill_first(settings.prompt)  # -if fed as it is: the user speaks first, after the prompt
    elif settings.prompt is not None:  # -i / -cnv (-if through the chat template): its answer first
        chat.answer_first(settings.prompt)
    chat.run()


def _llama_cli_mode(conversation: bool | None, interactive: bool, interactive_first: bool, single_turn: bool,
                    prompt_given: bool, raw: bool) -> tuple[bool, bool, bool]:
    """llama-cli's conversation options read as run's own: (--raw, whether the history is kept by default, whether
    the chat goes on reading stdin after --prompt's or --file's answer). As tools/completion/completion.cpp runs
    them: -cnv renders the prompt through the chat template as the first user turn, answers it and goes on
    interactively (``conversation_mode`` implies interactive); -no-cnv feeds the prompt as it is, without the chat
    template ("otherwise use the prompt as is"), and ends after it; -i goes on interactively after the prompt's
    answer, with -no-cnv too (llama-completion's interactive completion: ``params.interactive`` is -i's own, apart
    from ``conversation_mode``), each line and answer going on the same text, so the history is kept; -if waits
    for input first: with a prompt fed as it is, after that prompt is prefilled (``embd_inp`` holds the prompt and
    ``is_interacting = params.interactive_first``, so the user's line is read before a token is sampled), while in
    conversation mode, which sets ``interactive_first`` by itself, the prompt is the first user turn and is answered
    first (its ``is_interacting`` is cleared once the prompt is in), as -cnv -p; -st ends after one turn
    (common/arg.cpp: "will not be interactive if first turn is predefined with --prompt"), with -if and a prompt too
    (conversation mode turns ``interactive_first`` off there)."""
    if conversation is True and raw:
        raise click.BadParameter("renders the chat through the chat template, and --raw feeds the prompt as it is; "
                                 "pass one", param_hint="'--conversation' / '-cnv'")
    if conversation is False:  # no chat template; -i / -if read stdin as llama-completion's interactive completion,
        # each line going on the text before it (cli_interactive.Transcript)
        return True, interactive or interactive_first, \
            (interactive or interactive_first) and prompt_given and not single_turn
    chat = conversation is True or interactive or interactive_first
    return raw, chat, chat and prompt_given and not single_turn


def asked_context(bundle: Path) -> int | None:
    """The context ``-c N`` (or LLAMA_ARG_CTX_SIZE) holds a run of ``bundle`` to, checked against its manifest's
    ``graph.max_context`` before the bundle loads (:func:`~edgesdk.cli_llama.checked_ctx_size`), as serve checks it:
    a size past the bundle's is refused before a load that took the board seconds, and the runtime opens capped
    (``open_runtime(context=...)``), so that --stats' notes say the context it holds beside the bundle's. None: the
    bundle's own (neither given, 0, or the bundle's size)."""
    given = click.get_current_context().meta.get("edgesdk.llama.ctx_size")
    if given is None and not os.environ.get(CTX_SIZE_ENV):
        return None
    from edgesdk.bundle import read_manifest

    max_context = read_manifest(bundle).get("graph", {}).get("max_context")
    if isinstance(max_context, bool) or not isinstance(max_context, int):
        return None  # a manifest without it is refused by name as the bundle opens (verify_bundle)
    size = checked_ctx_size(max_context, bundle)
    return size if size < max_context else None


def _without_closed_stdin(settings: RunSettings) -> RunSettings:
    """``settings`` where this process has no stdin (started with it closed, ``<&-``: ``sys.stdin`` is None), which
    ended the run with an AttributeError traceback once the bundle had loaded. Without --prompt or --file the prompts
    come from stdin: refused by name. With them and -i / -cnv, the chat that reads stdin after their answer ends at
    once, as llama-cli's ends at the end of its input: the prompt is answered alone. So does -if's through the chat
    template, which answers the prompt first as -cnv -p does; -if with the prompt fed as it is waits for stdin's
    first line after it (:func:`_closed_stdin_user_first`): refused here with --raw / -no-cnv, and once the bundle
    is known to have no chat template (:func:`_check_user_first`)."""
    if sys.stdin is not None or (settings.prompt is not None and not settings.go_on):
        return settings
    if settings.prompt is None:
        raise EdgeSDKError("without --prompt or --file the prompts are read from stdin, and this process has none "
                           "(it was closed)", "pass -p TEXT or -f FILE, or pipe the prompts in "
                           "(echo TEXT | edgesdk run BUNDLE)")
    if settings.user_first and settings.raw:
        raise _closed_stdin_user_first(settings)
    return dataclasses.replace(settings, go_on=False)


def _closed_stdin_user_first(settings: RunSettings) -> EdgeSDKError:
    """-if with the prompt fed as it is prefills it and reads the first line from stdin before anything is
    generated: without stdin there is nothing for it to wait for."""
    return EdgeSDKError(f"-if with {settings.prompt_option} fed as it is reads the first line from stdin after it, "
                        "and this process has none (it was closed)", "pipe the lines in (echo TEXT | edgesdk run "
                        "BUNDLE ...), or pass -i for the prompt's own answer first")


def _check_stdout_open() -> None:
    """The answers go to stdout: a process started with it closed (``>&-``: ``sys.stdout`` is None) ended in an
    AttributeError traceback at the answer's first token, once the bundle had loaded and the prompt was prefilled.
    Refused by name before the bundle loads (llama-cli writes into the closed descriptor, and its answer is lost
    without a word)."""
    if sys.stdout is None:
        raise EdgeSDKError("the answers are written to stdout, and this process has none (it was closed)",
                           "redirect it where the answers should go (> answer.txt), or to /dev/null to discard them")


RUN_SAMPLING_OPTIONS = {**SAMPLING_OPTIONS, "max_new_tokens": "'--max-new-tokens' / '-n'",
                        "repeat_penalty": "'--repeat-penalty'", "presence_penalty": "'--presence-penalty'",
                        "frequency_penalty": "'--frequency-penalty'", "logit_bias": "'--logit-bias'"}


UNTIL_THE_CONTEXT_IS_FULL = -2  # -n -2: llama-cli's "until context filled", also with --context-shift


def _llama_temperature(value: float) -> float:
    """``--temperature`` as llama-cli reads it (common/arg.cpp: ``temp = std::max(temp, 0.0f)``): below 0 is greedy,
    as 0 is; NaN stays NaN, for SamplingConfig to refuse by name."""
    return 0.0 if value < 0 else value


_OTHER_LIMITS = ("-1 (any number below 0 but -2) for no limit but the context, or -2 to stop when the context is "
                 "full, as llama-cli's -n")


def _token_limit(value: int, alone: bool = True) -> int:
    """``-n``, as llama-cli reads it (:func:`~edgesdk.cli_options.token_limit`; tools/main/main.cpp stops at a full
    context where ``n_predict == -2`` even with context shifting on): a count >= 1 as it is, any number below 0 no
    count at all (the full context then ends the answer, unless --context-shift goes on past it with any but -2).
    0 is llama.cpp's "evaluate the prompt, generate nothing" (llama-server: "the prompt is evaluated into the
    cache"), for writing a --prompt-cache that later runs start from: taken for a prompt answered ``alone``
    (--prompt or --file without -i / -cnv), and refused by name where prompts are read from stdin, each of whose
    answers it would leave empty."""
    if value == 0 and not alone:
        raise click.BadParameter("is 0, which prefills a prompt and generates nothing (llama.cpp's -n 0, e.g. to "
                                 "write only the prompt's --prompt-cache), and here the prompts are read from stdin, "
                                 "each of whose answers it would leave empty; give the most tokens an answer may "
                                 "have (a number >= 1), or " + _OTHER_LIMITS + ", or pass the one prompt with -p "
                                 "TEXT or -f FILE (without -i / -cnv) for -n 0",
                                 param_hint="'--max-new-tokens' / '-n'")
    return token_limit(value, _OTHER_LIMITS, zero=True)


def _env_token_limit(value: int, alone: bool = True) -> int:
    """:func:`_token_limit`, its refusal naming LLAMA_ARG_N_PREDICT where the variable gave ``-n``."""
    with told_from_env("max_new_tokens"):
        return _token_limit(value, alone)


def _sampling_config(*, logit_bias: tuple[str, ...], samplers: str | None, sampling_seq: str | None, **fields):
    """The sampling options as a SamplingConfig; a value it refuses is told under the option that gave it, and with
    the variable that did where one did (LLAMA_ARG_TOP_P=nan: the user typed no --top-p)."""
    from edgesdk.runtime.generate import SamplingConfig

    try:
        return SamplingConfig(logit_bias=[_parse_logit_bias(text) for text in logit_bias],
                              **fields, **sampler_chain(samplers, sampling_seq))
    except ValueError as exc:
        with told_from_env(*RUN_SAMPLING_OPTIONS):  # each field is named as its option's parameter
            raise bad_sampling_option(exc, RUN_SAMPLING_OPTIONS) from exc


def _one_prompt(prompt: str | None, prompt_file: Path | None, escape: bool = True) -> str | None:
    """The prompt --prompt or --file gives (llama-cli's -p / -f), None when neither does; with ``escape`` (-e, on
    by default) its escapes processed, as llama-cli processes its prompt's, from -p or -f alike."""
    if prompt_file is None:
        return prompt if prompt is None or not escape else process_escapes(prompt, "'--prompt' / '-p'")
    if prompt is not None:
        raise click.BadParameter("--prompt and --file both give the prompt; pass one", param_hint="'--file' / '-f'")
    text = _read_stdin_prompt() if str(prompt_file) == "-" else \
        _read_text_file(prompt_file, "--file", "'--file' / '-f'", as_is=True)
    text = text.removesuffix("\n")  # the file's last line end, which an editor adds: llama-cli's -f drops it too
    return process_escapes(text, "'--file' / '-f'") if escape else text


def _read_stdin_prompt() -> str:
    """``-f -``: the prompt is all of stdin, read to its end, as ``-f /dev/stdin`` reads it (and as '-' names stdin
    for most Unix tools; llama-cli's -f opens '-' as a file name and fails). It was refused as "nothing exists at
    that path", with a fix that said nothing of stdin. Not UTF-8: refused as a --file that is not."""
    if sys.stdin is None:  # started with stdin closed (<&-)
        raise EdgeSDKError("--file - reads the prompt from stdin, and this process has none (it was closed)",
                           "pipe the prompt in (echo TEXT | edgesdk run BUNDLE -f -), or pass -f FILE or -p TEXT")
    data = sys.stdin.buffer.read()
    try:  # line ends as they are, as -f reads a file's (llama-cli's read_file), so that -f - is -f /dev/stdin
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        from edgesdk.runtime.text import iconv_to_utf8

        raise EdgeSDKError(f"--file - (stdin) is not UTF-8 text ({exc.reason} at byte {exc.start})",
                           f"convert it first, e.g. ... | {iconv_to_utf8(data)} | edgesdk run BUNDLE -f -") from exc


def _escaped_affix(text: str | None, hint: str, escape: bool = True) -> str:
    """--in-prefix / --in-suffix with llama-cli's escapes processed (unless --no-escape); "" when not given."""
    return "" if text is None else process_escapes(text, hint) if escape else text


def _reverse_prompts(texts: tuple[str, ...], escape: bool = True) -> tuple[str, ...]:
    """-r texts with llama-cli's escapes processed (unless --no-escape); an empty one is refused."""
    if escape:
        texts = tuple(process_escapes(text, "'--reverse-prompt' / '-r'") for text in texts)
    if "" in texts:  # llama-cli would find it after every token
        raise click.BadParameter("is empty, so every answer would stop at its first token; give the text the "
                                 "answer stops at, e.g. -r 'User:'", param_hint="'--reverse-prompt' / '-r'")
    return texts


def _sampling_for_model(settings: RunSettings, tokenizer) -> SamplingConfig:
    """The sampling settings against the model: --ignore-eos bans its end tokens (logit -inf, as llama.cpp's
    --ignore-eos), and a --logit-bias id past its vocabulary is refused."""
    sampling = settings.sampling
    if settings.ignore_eos:
        never = tuple((token, -math.inf) for token in sorted(tokenizer.eos_token_ids))
        sampling = dataclasses.replace(sampling, logit_bias=(*sampling.logit_bias, *never))
    vocabulary = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    for token, _ in sampling.logit_bias:
        if token >= vocabulary:
            raise click.BadParameter(f"names token id {token}; this model's vocabulary has ids 0 to {vocabulary - 1}",
                                     param_hint="'--logit-bias'")
    return sampling


def _with_model_defaults(sampling: SamplingConfig, manifest: dict) -> SamplingConfig:
    """``sampling`` with the model's own settings (the bundle's ``generation`` section: its generation_config.json
    or GGUF general.sampling keys) for each sampling option not given, as llama-cli takes a GGUF file's
    general.sampling keys (common/common.cpp, common_init_sampler_from_model); said on stderr."""
    from edgesdk.models.generation_defaults import with_model_defaults

    sampling, line = with_model_defaults(sampling, manifest, sampling_option_given)
    if line is not None:
        click.echo(f"edgesdk: {line}", err=True)
    return sampling


# the options that only shape the tokens generated (sampled, constrained, drafted, ended), by parameter name: -n 0
# generates none, so each one given is said unused with it (_warn_unused_options)
ANSWER_ONLY_OPTIONS = ("temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "repeat_last_n",
                       "presence_penalty", "frequency_penalty", "logit_bias", "samplers", "sampling_seq",
                       "ignore_eos", "reverse_prompts", "json_object", "json_schema", "json_schema_file", "grammar",
                       "grammar_file", "lookup_draft", "draft_bundle", "draft_max", "draft_min", "draft_p_min")


def _given_names(names: tuple[str, ...]) -> list[str]:
    """Of the running command's options ``names`` (parameter names), those given, each by the name typed (its long
    name where its environment variable gave it)."""
    context = click.get_current_context()
    params = {param.name: param for param in context.command.params}
    return [typed_option(name) or next((flag for flag in params[name].opts if flag.startswith("--")),
                                       params[name].opts[0])
            for name in names if option_given(name)]


def _warn_unused_options(settings: RunSettings, sampling: SamplingConfig, tokenizer, thermal_settings: dict) -> None:
    """Name each option given that does nothing in this run, and why, on stderr; the run goes on. ``sampling`` is
    the run's (the options with the model's defaults for those not given, :func:`_with_model_defaults`). With -n 0
    the options that shape an answer (:data:`ANSWER_ONLY_OPTIONS`) are said unused together: no token is
    generated."""
    typed = settings.sampling
    if settings.prompt_only:  # the sampling options below are said with -n 0's note
        unanswered = _given_names(ANSWER_ONLY_OPTIONS)
        if unanswered:
            several = len(unanswered) > 1
            click.echo(f"edgesdk: {', '.join(unanswered)} {'are' if several else 'is'} not used: -n 0 prefills the "
                       "prompt and generates no token (pass -n N, the most tokens to answer with, to use "
                       f"{'them' if several else 'it'})", err=True)
    else:
        # greedy through infill or in-chain penalties takes the top token the chain keeps: the cuts change it
        cuts_matter = "infill" in sampling.samplers or sampling.penalizes_in_chain
        for option, unused in (("--top-p", typed.top_p < 1), ("--top-k", typed.top_k > 0),
                               ("--min-p", typed.min_p > 0)):
            if unused and sampling.temperature == 0 and not cuts_matter:
                click.echo(f"edgesdk: {option} is not used: --temperature 0 decodes greedily (pass a temperature > 0 "
                           "to sample)", err=True)
        if sampling.seed is not None and sampling.temperature == 0:
            click.echo("edgesdk: --seed is not used: --temperature 0 decodes greedily (pass a temperature > 0 to "
                       "sample)", err=True)
        if not sampling.penalizes and option_given("repeat_last_n"):
            click.echo("edgesdk: --repeat-last-n is not used: it is the window of the penalties, and none is on "
                       "(pass --repeat-penalty other than 1, or a --presence-penalty or --frequency-penalty)", err=True)
    warn_unused_thermal_options(**thermal_settings)
    if settings.shift_refused:
        click.echo("edgesdk: --context-shift is not used: -n -2 ends the answer when the context is full, as in "
                   "llama-cli (pass -n -1 to shift the context and go on)", err=True)
    elif settings.keep and not settings.context_shift:
        click.echo("edgesdk: --keep is not used: it is the tokens a context shift keeps, and the context does not "
                   "shift (pass --context-shift)", err=True)
    as_it_is = None
    if settings.raw or not tokenizer.has_chat_template:
        as_it_is = settings.raw_option if settings.raw else "the bundle has no chat template"
    if settings.system is not None and as_it_is:
        click.echo(f"edgesdk: {settings.system_option} is not used: {as_it_is} feeds the prompt as it is", err=True)
    answered_alone = settings.prompt is not None and not settings.go_on  # no prompt is read from stdin
    if settings.history and answered_alone:  # only a --history the user typed is worth a word
        click.echo(f"edgesdk: --history is not used: {settings.prompt_option} answers one prompt (leave it out to "
                   "chat)", err=True)
    for option, given in (("--in-prefix", settings.in_prefix), ("--in-prefix-bos", settings.in_prefix_bos),
                          ("--in-suffix", settings.in_suffix)):
        if given and answered_alone:  # llama-cli adds them to interactive input only, never to -p
            click.echo(f"edgesdk: {option} is not used: it goes with each prompt read from stdin, and "
                       f"{settings.prompt_option} is answered as it is", err=True)
    if settings.multiline_input and answered_alone:
        click.echo(f"edgesdk: --multiline-input is not used: it is how prompts are read from stdin, and "
                   f"{settings.prompt_option} is answered as it is", err=True)
    if settings.template_kwargs and as_it_is:
        click.echo(f"edgesdk: --chat-template-kwargs is not used: {as_it_is} feeds the prompt as it is", err=True)


def vocabulary_bos(tokenizer) -> int | None:
    """The vocabulary's BOS token id (the model's ``bos_token``, llama.cpp's ``llama_vocab_bos``), whether or not
    the tokenizer puts it in front of a text (:meth:`ChatTokenizer.added_bos`); None where it has none."""
    added = tokenizer.added_bos()
    if added is not None:
        return added
    text = getattr(tokenizer, "bos_token", None)
    return tokenizer.token_id(text) if text else None


def _check_in_prefix_bos(settings: RunSettings, tokenizer) -> None:
    """--in-prefix-bos (llama-cli's: ``embd_inp.push_back(llama_vocab_bos(vocab))`` before each interactive input's
    --in-prefix, tools/main/main.cpp; common/arg.cpp sets ``enable_chat_template = false`` with it) against the
    model: the line must be answered as it is (--raw, -no-cnv or a bundle without a chat template: a BOS inside a
    chat template's user turn is not what llama-cli feeds), and the vocabulary must have a BOS token."""
    if not settings.in_prefix_bos or (settings.prompt is not None and not settings.go_on):
        return  # no prompt is read from stdin: said to be unused (_warn_unused_options)
    if not (settings.raw or not tokenizer.has_chat_template):
        raise click.BadParameter("puts the BOS token before each prompt read from stdin, which llama-cli does with "
                                 "its chat template off, and this bundle's chat template renders each prompt: pass "
                                 "--raw (or -no-cnv) with it, or leave it out", param_hint="'--in-prefix-bos'")
    if vocabulary_bos(tokenizer) is None:
        raise click.BadParameter(f"puts the BOS token before each prompt read from stdin, and this model's vocabulary "
                                 f"has none (its bos_token is {getattr(tokenizer, 'bos_token', None)!r}): leave it "
                                 "out, or put the text it should start with in --in-prefix",
                                 param_hint="'--in-prefix-bos'")


def _check_user_first(settings: RunSettings, tokenizer) -> None:
    """-if with --prompt / --file fed as it is (--raw, -no-cnv, a bundle without a chat template) prefills the prompt
    for the lines read after it to go on (:meth:`Answerer.prefill_first`), which --no-history, answering each line on
    its own, would drop unread: refused by name; so is a process without stdin (closed), which has no line for the
    prefilled prompt to wait for (:func:`_without_closed_stdin` refuses it before the load with --raw / -no-cnv)."""
    if settings.user_first and sys.stdin is None and (settings.raw or not tokenizer.has_chat_template):
        raise _closed_stdin_user_first(settings)
    if settings.user_first and settings.history is False and (settings.raw or not tokenizer.has_chat_template):
        raise click.BadParameter(f"answers each line on its own, and -if prefills {settings.prompt_option} for the "
                                 "lines read after it to go on: leave --no-history out, or pass -i to have the "
                                 "prompt answered first", param_hint="'--no-history'")


def _check_system_fits(settings: RunSettings, runtime) -> None:
    """--system / --system-prompt-file against the bundle's context, before any prompt: where the system message,
    rendered through the chat template with an empty prompt after it, fills the context, every prompt was refused
    as "the prompt has N tokens", even "hi", and the system message was never named."""
    tokenizer = runtime.tokenizer
    if settings.system is None or settings.raw or not tokenizer.has_chat_template:
        return  # said to be unused (_warn_unused_options)
    from edgesdk.bundle import capped_context, context_fix

    tokens, max_context = len(tokenizer.prompt_ids("", raw=False, system=settings.system)), runtime.backend.max_context
    if tokens < max_context:
        return
    option = settings.system_option
    hint = "'--system-prompt-file' / '-sysf'" if option == "--system-prompt-file" else "'--system' / '-sys'"
    # a run held below the bundle's context by -c names that context, and raising -c before any rebuild
    built, source = getattr(runtime.backend, "built_context", None), getattr(runtime.backend, "context_source", "-c")
    capped = capped_context(max_context, built, source)
    held = capped if capped else f"the bundle's max_context is {max_context}"
    fix = context_fix(f"shorten {option}", max_context, getattr(runtime.backend, "model_positions", None), tokens + 1,
                      built=built, source=source)
    raise click.BadParameter(f"the system message is {tokens} tokens in the chat template (with an empty prompt after "
                             f"it), and {held}: it leaves no room for a prompt and its answer, so every prompt would "
                             f"be refused; {fix}", param_hint=hint)


def _open_conversation(settings: RunSettings, runtime, interactive: bool):
    """The conversation kept over the prompts read from stdin (--history; on by default at a terminal and with
    llama-cli's -cnv, -i or -if), or None where each prompt is answered on its own: --prompt / --file (unless -cnv
    or -i go on after it), or --no-history. With --raw (-no-cnv) or a bundle without a chat template it is a
    plain-text transcript (cli_interactive.Transcript), as llama-completion's interactive completion keeps one."""
    from edgesdk.runtime.conversation import Conversation

    tokenizer = runtime.tokenizer
    history = (interactive or settings.chat) if settings.history is None else settings.history
    if not history or (settings.prompt is not None and not settings.go_on):
        return None
    if settings.raw or not tokenizer.has_chat_template:
        return _open_transcript(settings, runtime)
    return Conversation(tokenizer, settings.system, runtime.backend.max_context,
                        answer_room=settings.sampling.max_new_tokens)


def _open_transcript(settings: RunSettings, runtime) -> Transcript:
    """The plain-text transcript of --raw / -no-cnv with the history kept: it starts with the BOS the tokenizer puts
    in front (llama-completion's first prompt, tokenized with ``add_special``), and -r's first reverse prompt goes
    after an answer that ends at an end-of-generation token, tokenized with its special tokens, as
    llama-completion injects it (``common_tokenize(ctx, antiprompt.front(), false, true)``). With --context-shift
    the first --keep tokens of --prompt / --file stay once its exchange is left out, as llama-completion's shift
    keeps ``n_keep`` tokens of its initial prompt; without it --keep is said to be unused, and none stay."""
    tokenizer = runtime.tokenizer
    bos = tokenizer.added_bos()
    after_end = tokenizer.encode(settings.reverse_prompts[0], add_special_tokens=False) \
        if settings.reverse_prompts else []
    prefix_bos = vocabulary_bos(tokenizer) if settings.in_prefix_bos else None
    return Transcript(_transcript_turn_ids(tokenizer, prefix_bos), [] if bos is None else [bos],
                      runtime.backend.max_context, settings.sampling.max_new_tokens, after_end,
                      keep=settings.keep if settings.context_shift else 0)


def _transcript_turn_ids(tokenizer, prefix_bos: int | None):
    """How a plain-text transcript tokenizes a prompt (the BOS the tokenizer puts in front is the transcript's
    start, not each prompt's): a line read from stdin as llama-completion tokenizes an interactive line
    (--in-prefix-bos's BOS, --in-prefix, the line as plain text, --in-suffix: cli_interactive.typed_prompt_ids), and
    --prompt / --file as its first prompt, special tokens' text read as the tokens."""
    from edgesdk.runtime.generate import starts_with_added_bos

    def turn_ids(text: str) -> list[int]:
        if isinstance(text, TypedPrompt):
            return typed_prompt_ids(tokenizer, text, bos=prefix_bos, alone=False)
        ids = tokenizer.prompt_ids(text, raw=True)
        return ids[1:] if starts_with_added_bos(tokenizer, ids) else ids

    return turn_ids


def _check_constraint_tokens(settings: RunSettings, tokenizer):
    """The tokenizer's bytes where --json, --json-schema or --grammar constrain the answers (None otherwise): a
    tokenizer whose bytes cannot be read, and a grammar's <token> the vocabulary lacks, are refused before any
    prompt."""
    from edgesdk.runtime.gbnf import GrammarError
    from edgesdk.runtime.grammar import GrammarConstraint

    if not (settings.json_object or settings.schema is not None or settings.grammar is not None):
        return None
    token_bytes = tokenizer.token_bytes()
    if settings.grammar is None:
        return token_bytes
    try:
        GrammarConstraint(token_bytes, settings.grammar, tokenizer.eos_token_ids, token_id_of=tokenizer.token_id)
    except GrammarError as exc:
        raise click.BadParameter(f"{exc.problem} ({exc.fix})", param_hint=settings.grammar_option) from exc
    return token_bytes


def _parse_logit_bias(text: str) -> tuple[int, float]:
    """``--logit-bias ID=BIAS`` (or llama.cpp's ``ID+BIAS`` / ``ID-BIAS``) as (id, bias); the range is
    SamplingConfig's to check. The sign form is read as common/arg.cpp reads it: the sign, then a number of its own
    (``stof``, spaces before it allowed) that the sign multiplies, so ``15043-inf`` is -inf, ``15043+-5`` is -5 and
    ``15043--5`` is 5."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([=+-])\s*(\S+)\s*", text)
    try:
        if match is None:
            raise ValueError
        bias = float(match.group(3))
        return int(match.group(1)), -bias if match.group(2) == "-" else bias
    except ValueError:
        raise ValueError(f"logit_bias must be given as ID=BIAS (a token id, then a number in [-100, 100] or -inf), "
                         f"got {text!r}; e.g. --logit-bias 15043=-100") from None


def _read_json_schema(value: str | None, json_object: bool, path: Path | None = None):
    """``--json-schema`` (a file holding the schema, or its JSON text) or ``--json-schema-file`` (llama-cli's -j and
    -jf), compiled (None when neither is given). A file's UTF-8 byte-order mark is skipped, as llama.cpp's JSON
    parser (nlohmann::json, whose lexer skips a BOM at the start) reads -jf's file and Python's json does not."""
    from edgesdk.runtime.json_schema import SchemaError, compile_schema

    if value is None and path is None:
        return None
    option, hint = ("--json-schema", "'--json-schema'") if path is None else \
        ("--json-schema-file", "'--json-schema-file' / '-jf'")
    if value is not None and path is not None:
        raise click.BadParameter("--json-schema and --json-schema-file both give the schema; pass one", param_hint=hint)
    if json_object:
        raise click.BadParameter(f"--json asks for any JSON object and {option} for one schema's; pass one",
                                 param_hint=hint)
    if value == "":  # Path("") is the current directory, which was told as "'.' is not a file"
        raise click.BadParameter("is empty: an empty path names no schema file (it is not read as the current "
                                 "directory here), and no JSON text is empty; give the schema's JSON text or its file, "
                                 "e.g. -j schema.json", param_hint=hint)
    if path is None and value.lstrip().startswith(("{", "[")):
        text = value
    else:
        if path is None:
            path = Path(value)
            try:
                exists, why = path.exists(), ""
            except OSError as exc:  # no file can have that name (too long), or one on a path this user cannot search
                exists, why = False, f" (as a path: {exc.strerror or exc})"
            if not exists:
                raise click.BadParameter(f"{value!r} is neither a file nor a JSON text starting with '{{'{why}",
                                         param_hint=hint)
        text = _read_text_file(path, option, hint).removeprefix("\ufeff")
    try:
        return compile_schema(text)
    except SchemaError as exc:
        raise click.BadParameter(f"{exc.problem} ({exc.fix})", param_hint=hint) from exc


def _system_message(text: str | None, path: Path | None) -> str | None:
    """``--system`` or ``--system-prompt-file`` (llama-cli's -sys / -sysf: the file whole, one '\\n' at its end
    dropped, as common/arg.cpp reads it; no escapes processed in either, as llama-cli processes none there)."""
    if path is None:
        return text
    if text is not None:
        raise click.BadParameter("--system and --system-prompt-file both give the system message; pass one",
                                 param_hint="'--system-prompt-file' / '-sysf'")
    return _read_text_file(path, "--system-prompt-file", "'--system-prompt-file' / '-sysf'",
                           as_is=True).removesuffix("\n")


def _read_text_file(path: Path, option: str, hint: str, as_is: bool = False) -> str:
    """A UTF-8 file an option names; a pipe is read too (``-f <(cmd)``, ``/dev/stdin``), as llama-cli reads them.
    ``as_is``: its line ends as they are (read_utf8's ``newlines=False``), as llama-cli's -f and -sysf read the
    file (common/arg.cpp ``read_file``, no newline translation: a CRLF file's CR is part of the prompt)."""
    found = _looked_up(path, hint)
    if not found.exists or found.is_dir:
        why = "it is a directory" if found.is_dir else "nothing exists at that path"
        raise click.BadParameter(f"{str(path)!r} is not a file ({why}); give a UTF-8 text file", param_hint=hint)
    return read_utf8(path, option, newlines=not as_is)


@dataclasses.dataclass(frozen=True)
class _LookedUp:
    """What a lookup of an option's path found (:func:`_looked_up`)."""

    exists: bool
    is_dir: bool


def _looked_up(path: Path, hint: str) -> _LookedUp:
    """Whether ``path``, a file an option names, exists and is a directory. ``Path.exists`` and ``is_dir`` raise where
    the path cannot be looked up at all (a directory on the way this user may not search, a name too long), which
    came out as a traceback: refused under the option, naming the path and why."""
    try:
        return _LookedUp(path.exists(), path.is_dir())
    except OSError as exc:
        raise click.BadParameter(f"{str(path)!r} cannot be looked up ({exc.strerror or exc}); give a UTF-8 text file "
                                 "this user can reach (check the directories on its way: ls -ld each)",
                                 param_hint=hint) from exc


def _read_grammar(text: str | None, path: Path | None, json_object: bool, json_schema: str | None,
                  json_schema_file: Path | None = None):
    """``--grammar`` / ``--grammar-file``: the GBNF grammar read (None when neither is given)."""
    from edgesdk.runtime.gbnf import GrammarError, parse_grammar

    if text is None and path is None:
        return None
    hint = "'--grammar-file'" if path is not None else "'--grammar'"
    others = [name for name, given in (("--grammar", text is not None), ("--grammar-file", path is not None),
                                       ("--json", json_object), ("--json-schema", json_schema is not None),
                                       ("--json-schema-file", json_schema_file is not None)) if given]
    if len(others) > 1:
        raise click.BadParameter(f"{' and '.join(others)} each constrain the answer; pass one", param_hint=hint)
    if path is not None:
        text = _read_text_file(path, "--grammar-file", hint)
    try:
        return parse_grammar(text)
    except GrammarError as exc:
        raise click.BadParameter(f"{exc.problem} ({exc.fix})", param_hint=hint) from exc


class Answerer:
    """Answers one prompt at a time, as llama-cli does: the answer streamed to stdout as its characters complete,
    kept by the conversation where there is one (--history), its KV cache reused by the next prompt that begins
    the same way, and written to --prompt-cache once whole (cli_prompt_cache.PromptCacheFile says what)."""

    def __init__(self, runtime, settings: RunSettings, sampling: SamplingConfig, *, conversation, cache,
                 cache_file, token_bytes, lookup, thermal, clock: tuple[float, float] | None = None):
        self.runtime, self.tokenizer, self.settings, self.sampling = runtime, runtime.tokenizer, settings, sampling
        self.conversation = conversation  # None: each prompt is answered on its own
        self.cache = cache  # the KV cache's token list (runtime.prompt_cache.PromptCache)
        self.cache_file = cache_file  # --prompt-cache's file (cli_prompt_cache.PromptCacheFile); None: not kept
        self.token_bytes = token_bytes  # each token's bytes, where --json, --json-schema or --grammar constrain
        self.lookup, self.thermal = lookup, thermal  # the drafter (--draft, --lookup) and thermal session, or None
        # A reverse prompt that is one token also stops at that token, as llama-cli's single-token antiprompts do:
        # a special token's name (<|im_start|>) is left out of the answer's text.
        self.reverse_tokens = {ids[0]: text for text in settings.reverse_prompts
                               if len(ids := self.tokenizer.encode(text, add_special_tokens=False)) == 1}
        self.last_prompt: str | None = None  # the last prompt answered, which /regen answers again
        # Through the chat template the -r texts are stop strings, as llama-cli's chat (tools/cli, on llama-server's
        # slots) takes its antiprompts: searched in the answer's text, special tokens left out as it renders them,
        # and cut from what is shown and kept; fed as it is (--raw, or no chat template), the answer shows and keeps
        # them and special tokens count as their text, as llama-completion's reverse prompts.
        self.stop_strings = bool(settings.reverse_prompts) and not settings.raw and self.tokenizer.has_chat_template
        self.special_texts = _special_texts(self.tokenizer) if settings.reverse_prompts and not self.stop_strings \
            else {}
        # --in-prefix-bos: the vocabulary's BOS before each line read from stdin (checked by _check_in_prefix_bos)
        self.prefix_bos = vocabulary_bos(self.tokenizer) if settings.in_prefix_bos else None
        # -n over a plain-text transcript: one budget for the session, as llama-completion's; None: -n per answer
        limit = settings.sampling.max_new_tokens
        self.budget = SessionBudget(limit) if isinstance(conversation, Transcript) and limit != UNLIMITED_TOKENS \
            else None
        self.clock = clock  # (perf_counter when the bundle began loading, its load seconds), for --stats; or None
        self.stopped = None  # the figures of the answer Ctrl-C stopped last, until --stats prints them
        # --verbose-prompt in a session: the tokens the model was fed and gave in the last turn (the prompt and the
        # answer), and in the one before it (for /regen, which answers the last prompt again): a turn's prompt is
        # told from where it leaves them, as llama-completion logs only the tokens each turn adds
        self.fed: list[int] | None = None
        self.fed_before: list[int] | None = None

    @property
    def as_it_is(self) -> bool:
        """Whether the prompts are fed as they are, without the chat template (--raw, -no-cnv, or none)."""
        return self.settings.raw or not self.tokenizer.has_chat_template

    def answer(self, text: str, regenerated: int = 0) -> None:
        """Answer ``text``; ``regenerated`` counts the times this answer was asked for again (/regen), which
        moves a --seed on by as many, so that each new answer is another draw, and still reproducible."""
        from edgesdk.runtime.generate import ContextShift, GenerationStats, generate, starts_with_added_bos

        self.stopped = None
        room = self._answer_room(text)
        if room == 0:
            self._no_room(text)
            return
        if self._ends_in_reverse_prompt(text):
            return
        try:
            ids = self._prompt_ids(text)
            if self.settings.verbose_prompt:
                self._say_prompt(ids, regenerated)
            if self.cache_file is not None:
                self.cache_file.begin(ids)
            shift = None
            if self.settings.context_shift:  # llama-cli keeps the BOS on top of --keep where the vocabulary adds one
                shift = ContextShift(keep=self._shift_keep(text), bos=starts_with_added_bos(self.tokenizer, ids))
            constraint, reverse = self._constraint()
        except BaseException:  # the line is not kept, so its tokens are not spent
            if self.budget is not None:
                self.budget.take_back()
            raise
        if self.settings.prompt_only:
            self._prefill_only(text, ids)
            return
        shown = _ShownAnswer(self.tokenizer, reverse, defer_interrupts=self.conversation is not None,
                             stop_strings=self.stop_strings)
        sampling = self.sampling if room is None else dataclasses.replace(self.sampling, max_new_tokens=room)
        if regenerated and sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=sampling.seed + regenerated)
        figures = GenerationStats()  # filled in as the answer goes: read for --stats where Ctrl-C stops it
        try:
            _, result = generate(self.runtime.backend, ids, sampling, self.tokenizer.eos_token_ids,
                                 on_token=shown.emit if self.cache_file is None else self.cache_file.watch(shown.emit),
                                 hook=self.thermal.hook if self.thermal else None,
                                 cache=self.cache, constraint=constraint, lookup=self.lookup,
                                 vocabulary=self.tokenizer, shift=shift, stats=figures)
        except KeyboardInterrupt:
            self._spent(len(shown.tokens))
            self._keep_stopped(text, shown)
            self._turn_fed(ids, shown.tokens, regenerated)
            self._stopped(figures)
            raise
        except Exception:
            self._keep_failed(text, shown)
            self._turn_fed(ids, shown.tokens, regenerated)
            raise
        self._turn_fed(ids, [*shown.tokens, *([result.stop_token] if result.stop_reason == "eos" else [])],
                       regenerated)
        self._spent(result.new_tokens + (result.stop_reason == "eos"))  # the end token was sampled too
        if reverse is not None and reverse.found is not None:
            result.stop_reason = "reverse_prompt"
        self._finish(text, shown, result)

    def _prefill_only(self, text: str, ids: list[int], stats: bool = True) -> None:
        """-n 0, as llama.cpp runs it: the prompt evaluated into the KV cache and nothing generated, so nothing is
        written to stdout; --prompt-cache FILE is written with the prompt's cache (later runs start from it), and
        --stats says the prefill (``stats`` False: not here, the prefill being no answer's). The prefill is
        generate's own (the cache reused, the thermal guard's steps); the token it picks from the prompt's last
        logits is neither fed to the cache nor shown."""
        from edgesdk.runtime.generate import GenerationStats, generate

        on_token = None if self.cache_file is None else self.cache_file.watch(lambda token: None)
        figures = GenerationStats()
        try:
            _, result = generate(self.runtime.backend, ids, dataclasses.replace(self.sampling, max_new_tokens=1),
                                 self.tokenizer.eos_token_ids, on_token=on_token,
                                 hook=self.thermal.hook if self.thermal else None, cache=self.cache,
                                 vocabulary=self.tokenizer, stats=figures)
        except KeyboardInterrupt:
            if self.cache_file is not None:
                self.cache_file.interrupted()
            figures.new_tokens = 0
            self._stopped(figures)
            raise
        result.new_tokens, result.stop_reason, result.stop_token = 0, "max_new_tokens", None
        self.last_prompt = text
        if self.settings.stats and stats:
            _print_stats(self.runtime, result, drafting=False, thermal=self.thermal, clock=self.clock)
        if self.cache_file is not None:
            self.cache_file.finished()

    def prefill_first(self, text: str) -> None:
        """-if with --prompt / --file fed as it is, as llama-completion runs it: the prompt starts the transcript
        and is prefilled (``embd_inp`` holds it, and ``is_interacting = params.interactive_first`` keeps a token
        from being sampled), so the user speaks first and the first line read goes on it, only its own tokens
        prefilled (the classic ``-f chat.txt -if --in-prefix 'User: ' --in-suffix '\\nBot:' -r 'User:'``). Its
        tokens spend nothing of -n, as llama-completion's n_remain spends none for the prompt; --keep keeps its
        first tokens at a context shift."""
        self.stopped = None
        ids = self._prompt_ids(text)
        if self.settings.verbose_prompt:
            self._say_prompt(ids, 0)
        if self.cache_file is not None:
            self.cache_file.begin(ids)
        self._prefill_only(text, ids, stats=False)
        self.conversation.answered(text, [])
        self._turn_fed(ids, [], 0)

    def _stopped(self, figures) -> None:
        """Ctrl-C stopped the answer whose figures (a GenerationStats, filled in as it went) are ``figures``: kept
        for :meth:`say_stopped_stats`, which prints them once the answer's line is closed."""
        figures.stop_reason = "interrupted"
        self.stopped = figures

    def say_stopped_stats(self, new_line: bool = False) -> None:
        """--stats for the answer Ctrl-C stopped last, ``stop: interrupted``, once (nothing without --stats, or
        where no answer was stopped): llama.cpp prints its timings when Ctrl-C ends it, and they were lost here.
        ``new_line``: the answer's line was left open (the run exits 130 after it), so the figures start a line."""
        figures, self.stopped = self.stopped, None
        if figures is None or not self.settings.stats:
            return
        if new_line:
            click.echo("", err=True)
        _print_stats(self.runtime, figures, drafting=bool(self.lookup), thermal=self.thermal, clock=self.clock)

    def _say_prompt(self, ids: list[int], regenerated: int) -> None:
        """--verbose-prompt for the prompt ``ids``: in a session (a chat or a transcript) only the tokens this turn
        adds after what the model was fed and gave in the turn before (the earlier turns and the system message are
        in the KV cache already; /regen: in the turn before the one it answers again), as llama-completion logs only
        each new turn's tokens; the first turn, and a prompt answered on its own, whole."""
        before = None
        if self.conversation is not None:
            before = self.fed_before if regenerated else self.fed
        _say_prompt_tokens(self.tokenizer, ids, before)

    def _turn_fed(self, ids: list[int], answer: list[int], regenerated: int) -> None:
        """Record the tokens this turn fed and gave (the prompt ``ids``, the ``answer``'s tokens), for
        :meth:`_say_prompt`; /regen's turn keeps the turn before the one it answered again."""
        if not regenerated:
            self.fed_before = self.fed
        self.fed = [*ids, *map(int, answer)]

    def forget_fed(self) -> None:
        """/clear: the conversation starts over, so the next turn's --verbose-prompt is a first turn's, whole (the
        turns before it are no longer in the KV cache for it to follow)."""
        self.fed = self.fed_before = None

    def take_back_last(self) -> str | None:
        """/regen: the prompt answered last (None before the first answer); a conversation gives its last
        exchange back, so that the answer is generated again in its place (with the -n budget it had)."""
        if self.conversation is None:
            return self.last_prompt
        if self.budget is not None and self.conversation.exchanges:
            self.budget.take_back()
        return self.conversation.take_last()

    def _shift_keep(self, text: str) -> int:
        """--keep for the context shift of the answer to ``text``. A line that goes on a plain-text transcript has
        the whole transcript for its prompt, and llama-completion resolves n_keep against its initial prompt alone
        (--prompt / --file; none without one: ``n_keep`` is at most ``embd_inp.size()`` at the start): at most that
        prompt's tokens, which stand first in the transcript (or its kept tokens, once its exchange is left out)."""
        keep = self.settings.keep
        if not isinstance(self.conversation, Transcript) or not isinstance(text, TypedPrompt):
            return keep
        first = self.conversation.first
        size = 0 if first is None else len(first[1])
        return size if keep < 0 or keep > size else keep

    def _answer_room(self, text: str) -> int | None:
        """The most tokens the answer to ``text`` may have where -n is a session's budget (:class:`SessionBudget`),
        once the typed line's own tokens are spent: 0 where they spent what was left; None: -n (per answer)."""
        if self.budget is None:
            return None
        typed = 0
        if isinstance(text, TypedPrompt):  # the line and its /read files, not --in-prefix, --in-suffix or the BOS
            line = TypedPrompt("", text.files, text.typed, "")
            typed = len(typed_prompt_ids(self.tokenizer, line, alone=False))
        return self.budget.typed(typed)

    def _ends_in_reverse_prompt(self, text: str) -> bool:
        """Whether ``text``, a prompt that goes on a plain-text transcript, ends in a -r reverse prompt, so that it
        goes on the transcript unanswered and the next line is read: llama-completion checks its reverse prompts
        once a prompt's tokens are in (the text of the last tokens, the prompt's own) and hands control back before
        it samples a token, as the classic ``-no-cnv -i -r 'User:' -f chat-with-bob.txt`` (whose text ends in
        'User:') relies on. A chat renders the prompt into its template, which ends in the assistant's turn."""
        if not isinstance(self.conversation, Transcript):
            return False
        found = next((reverse for reverse in self.settings.reverse_prompts if text.endswith(reverse)), None)
        if found is None:
            return False
        self.conversation.answered(text, [])
        self.last_prompt = text
        click.echo(f"edgesdk: the prompt ends in the reverse prompt {found!r}: no answer, the next line is read, as "
                   "llama-completion hands control back there", err=True)
        return True

    def _no_room(self, text: str) -> None:
        """A typed line whose tokens spent the rest of the -n budget: it goes on the transcript unanswered and the
        budget starts over, as llama-completion hands control back to the user there."""
        self.conversation.answered(text, [])
        self.last_prompt = text
        limit = self.budget.limit
        click.echo(f"edgesdk: no answer: the line's tokens spent what was left of -n {limit}, which a plain-text "
                   f"session counts over the session, typed tokens too, as llama-completion does; press Enter on an "
                   f"empty line to let the model go on (up to {limit} tokens), or pass -n -1 for no limit", err=True)

    def _spent(self, sampled: int) -> None:
        """The answer's sampled tokens spent from the session's -n budget, where there is one."""
        if self.budget is not None:
            self.budget.sampled(sampled)

    def _prompt_ids(self, text: str) -> list[int]:
        """The prompt's ids: a line read from stdin and answered as it is (--raw, or no chat template) has its typed
        text read as plain text (cli_interactive.typed_prompt_ids, as llama-completion reads it); -p / --file, and
        a line rendered into the chat template, are read with their special tokens."""
        if self.conversation is None:
            if isinstance(text, TypedPrompt) and (self.settings.raw or not self.tokenizer.has_chat_template):
                return typed_prompt_ids(self.tokenizer, text, bos=self.prefix_bos)
            return self.tokenizer.prompt_ids(text, raw=self.settings.raw, system=self.settings.system)
        dropped = self.conversation.dropped
        ids = self.conversation.prompt_ids(text)
        if self.conversation.dropped > dropped:
            click.echo(f"edgesdk: the conversation outgrew the context ({self.runtime.backend.max_context} tokens): "
                       f"left out its {self.conversation.dropped - dropped} oldest exchange(s)", err=True)
        return ids

    def _constraint(self):
        """A new constraint for the next answer (it keeps that answer's state) from --grammar, --json-schema or
        --json, wrapped in the -r reverse prompts; and the reverse prompts' part, or None without -r."""
        from edgesdk.runtime.grammar import GrammarConstraint
        from edgesdk.runtime.json_mode import JsonConstraint
        from edgesdk.runtime.json_schema import SchemaConstraint

        settings, constraint = self.settings, None
        if settings.grammar is not None:
            constraint = GrammarConstraint(self.token_bytes, settings.grammar, self.tokenizer.eos_token_ids,
                                           token_id_of=self.tokenizer.token_id)
        elif settings.schema is not None:
            constraint = SchemaConstraint(self.token_bytes, settings.schema)
        elif self.token_bytes is not None:
            constraint = JsonConstraint(self.token_bytes)
        if not settings.reverse_prompts:
            return constraint, None
        reverse = ReversePrompts(settings.reverse_prompts, self.reverse_tokens, constraint, self.special_texts)
        return reverse, reverse

    def _keep_stopped(self, text: str, shown: _ShownAnswer) -> None:
        """An answer stopped with Ctrl-C stays in the conversation as shown: whole characters only, never the
        replacement character of one whose bytes were still coming (the stream holds those back)."""
        self._remember(text, shown)
        self.last_prompt = text
        if self.cache_file is not None:  # the prefill paid for stays in the file, as llama-cli saves it
            self.cache_file.interrupted()

    def _keep_failed(self, text: str, shown: _ShownAnswer) -> None:
        """An answer an error cut short, once it showed something: the error is told on a line of its own, not
        after the answer's last piece; the conversation keeps what was shown, as llama-cli's conversation keeps
        the text an error cut short."""
        if not any(shown.pieces):
            if self.budget is not None:  # the line is not kept, so its tokens are not spent
                self.budget.take_back()
            return
        with contextlib.suppress(OSError, AnswerNotWritten):  # where stdout itself failed, the error says so
            write_answer("\n")
        self._spent(len(shown.tokens))  # kept in the transcript: spent, as an answer stopped with Ctrl-C
        self._remember(text, shown)
        self.last_prompt = text

    def _remember(self, text: str, shown: _ShownAnswer, tail: str = "", end_token: int | None = None) -> None:
        """The exchange kept by the conversation, where there is one: a chat's keeps the answer's text as shown
        (``tail``: its last characters, held back until the answer ended), a transcript the answer's tokens as they
        were generated, and the end-of-generation token it stopped at (``end_token``)."""
        if isinstance(self.conversation, Transcript):
            self.conversation.answered(text, shown.tokens, end_token)
        elif self.conversation is not None:
            self.conversation.answered(text, shown.text + tail)

    def _finish(self, text: str, shown: _ShownAnswer, result) -> None:
        """The answer's end: its last characters written, then the thermal status line, --stats and the prompt
        cache's file."""
        tail = shown.rest()  # bytes held back for a character still incomplete, and text that began a stop string
        self._remember(text, shown, tail, result.stop_token if result.stop_reason == "eos" else None)
        self.last_prompt = text
        try:
            write_answer(tail + "\n")
        except (BrokenPipeError, AnswerNotWritten):  # at the last characters: the answer is whole, its file too
            if self.cache_file is not None:
                self.cache_file.finished()
            raise
        if self.settings.default_limit and result.stop_reason == "max_new_tokens":
            self._say_cut()
        if self.thermal is not None and self.thermal.hook.status is not None:
            self.thermal.hook.status.between_answers()
        if self.settings.stats:
            _print_stats(self.runtime, result, drafting=bool(self.lookup), thermal=self.thermal, clock=self.clock)
        if self.cache_file is not None:  # once the answer is whole: a failed write leaves it in the conversation
            self.cache_file.finished()


    def _say_cut(self) -> None:
        """An answer that stopped at -n where -n was not given: the default, 128, is run's own (llama-cli and
        llama-server default to -1, no limit), and an answer cut there stayed in the conversation with no word but
        --stats' ``stop: max_new_tokens``. Said once per answer, on stderr, with the way to lift it."""
        over = ", spent over the session's answers and typed lines" if self.budget is not None else ""
        click.echo(f"edgesdk: answer cut at -n {self.settings.sampling.max_new_tokens} (the default{over}); pass "
                   "-n -1 for no limit", err=True)


class SessionBudget:
    """``-n`` in a plain-text interactive session (a transcript: --raw / -no-cnv), as llama-completion counts it
    (tools/completion/completion.cpp ``n_remain``): one budget over the session, not one per answer. Each sampled
    token spends one (``--n_remain``), and so does each token of a typed line (``n_remain -= line_inp.size()``),
    though not --prompt / --file; where it runs out, control comes back to the user and it starts over at -n
    (``n_remain = params.n_predict``). -n -1 and -2 have none. A chat (llama-cli's tools/cli) keeps -n per answer."""

    def __init__(self, limit: int):
        self.limit = limit  # -n
        self.remaining = self.before = limit  # before: what was left before the last line, for /regen

    def typed(self, tokens: int) -> int:
        """Spend a line's ``tokens``: the most its answer may have now, 0 where none (the budget starts over)."""
        self.before = self.remaining
        self.remaining -= tokens
        if self.remaining > 0:
            return self.remaining
        self.remaining = self.limit
        return 0

    def sampled(self, tokens: int) -> None:
        """Spend an answer's sampled ``tokens``; the budget starts over where they spent it all."""
        self.remaining -= tokens
        if self.remaining <= 0:
            self.remaining = self.limit

    def take_back(self) -> None:
        """The last line and its answer taken back (/regen, or an error before the answer showed anything): the
        budget is what it was before that line."""
        self.remaining = self.before


def _special_texts(tokenizer) -> dict[int, str]:
    """The special tokens' ids and text (``<|im_start|>``, ``<|im_end|>``): the answer shown leaves them out (they
    decode to nothing), and the -r reverse prompts are searched with them in, as llama-cli renders them there."""
    decoder = getattr(tokenizer.tokenizer, "get_added_tokens_decoder", None)
    if decoder is None:
        return {}
    return {int(token): added.content for token, added in decoder().items() if added.special}


class _ShownAnswer:
    """An answer as it is written to stdout, token by token: each token's text once its characters are whole
    (runtime.text.StreamDecoder), and the text written so far.

    With ``stop_strings`` (a chat through the chat template) the -r texts are stop strings, as llama-server's slots
    (which llama-cli's chat, tools/cli, runs on) take them: text that may begin one is held back until the next
    tokens tell, and the one found is cut, with what follows it, from the text shown and kept."""

    def __init__(self, tokenizer, reverse: ReversePrompts | None, defer_interrupts: bool, stop_strings: bool = False):
        from edgesdk.runtime.text import StreamDecoder

        self.stream = StreamDecoder(tokenizer)
        self.tokens: list[int] = []  # the answer's tokens as generated (a plain-text transcript keeps them)
        self.pieces: list[str] = []
        self.reverse = reverse  # told each piece shown, to stop at a reverse prompt
        self.defer_interrupts = defer_interrupts  # with a conversation, which keeps the text shown
        self.stop_strings = reverse.texts if stop_strings and reverse is not None else ()
        self.held = ""  # with stop strings: the text's end that begins one, not shown yet

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def rest(self) -> str:
        """The answer's last text, once it ended: the bytes of a character still incomplete, and the text held back
        as the start of a stop string (the answer ended before the rest of it came); nothing after a stop string."""
        tail = self.stream.flush()
        if self.reverse is not None and self.reverse.found is not None and self.stop_strings:
            return ""
        held, self.held = self.held, ""
        return held + tail

    def _before_stop(self, piece: str) -> str:
        """What of ``piece`` to show now (stop strings): the text before a stop string found (the answer stops
        there), or all but its end that begins a stop string, held back (:attr:`held`)."""
        text = self.held + piece
        found = [at for stop in self.stop_strings if (at := text.find(stop)) >= 0]
        if found:
            self.held = ""
            return text[:min(found)]
        if self.reverse.found is not None:  # a single-token reverse prompt (a special token's text is not shown)
            self.held = ""
            return text
        begins = max((size for stop in self.stop_strings for size in range(min(len(stop) - 1, len(text)), 0, -1)
                      if text.endswith(stop[:size])), default=0)
        self.held = text[len(text) - begins:] if begins else ""
        return text[:len(text) - begins]

    def emit(self, token: int) -> None:
        piece = self.stream.push(token)
        if self.stop_strings:
            self.reverse.shown(token, piece)
            piece = self._before_stop(piece)
        # The conversation keeps the answer as shown, as llama-cli keeps the text it printed: a Ctrl-C that
        # comes while a piece is written takes effect once it is written (the second stops the write); the token
        # is kept with its piece, so a transcript never holds one that was not shown.
        with DeferredInterrupt() if self.defer_interrupts else contextlib.nullcontext():
            write_answer(piece)
            self.tokens.append(token)
            self.pieces.append(piece)
        if self.reverse is not None and not self.stop_strings:
            self.reverse.shown(token, piece)


def _say_prompt_tokens(tokenizer, ids: list[int], before: list[int] | None = None) -> None:
    """llama.cpp's --verbose-prompt: the prompt's tokens as the model is fed them (through the chat template, the
    BOS in), each id and its piece with special tokens written out, on stderr, as llama-cli prints them
    (``%6d -> '%s'``) before the answer. With ``before`` (a session's turn after the first: what the model was fed
    and gave the turn before) only the tokens after the part of ``ids`` that begins as ``before`` does, and their
    count, as llama-completion logs each turn's new tokens (``embd_inp.size() - original_size``): re-dumping the
    whole conversation every turn buried them."""
    from edgesdk.runtime.text import pieces_text

    if before is None:
        lines = [f"edgesdk: number of tokens in prompt = {len(ids)}"]
    else:
        kept = next((at for at, (token, old) in enumerate(zip(ids, before, strict=False)) if token != old),
                    min(len(ids), len(before)))
        lines = [f"edgesdk: number of tokens in prompt = {len(ids) - kept} (this turn's; {len(ids)} with the "
                 "conversation before them)"]
        ids = ids[kept:]
    lines += [f"{token:6d} -> '{pieces_text(tokenizer, [token])}'" for token in ids]
    click.echo("\n".join(lines), err=True)


def _print_stats(runtime, result, drafting: bool, thermal=None, clock: tuple[float, float] | None = None) -> None:
    """--stats: the answer's figures on a line of stderr, and the power gates' on another where the backend has
    them; ``thermal`` (the run's thermal session, or None) adds the guard's waits (:func:`_pacing`), ``clock`` (when
    the bundle began loading, on perf_counter, and its load seconds) the load time and the time since it began, as
    llama.cpp's ``load time`` and ``total time``."""
    pacing = _pacing(result, thermal.hook) if thermal is not None else None
    times = None if clock is None else (clock[1], time.perf_counter() - clock[0])
    click.echo(_stats_line(runtime.backend.name, result.to_json(), drafting, pacing, times), err=True)
    if hasattr(runtime.backend, "stats"):
        click.echo(_power_line(runtime.backend), err=True)


class Pacing(NamedTuple):
    """What the thermal guard's waits did to an answer (:func:`_pacing`), on the guard's clock: simulated seconds on a
    simulated board (``--simulate-thermal``), whose rates are the board's."""

    prefill_wait_s: float  # before the prompt's steps: the time to first token is later by this
    decode_wait_s: float  # before the decode steps
    decode_tok_s: float | None  # the decode rate with the waits in (None: no decode step)
    board_tok_s: float | None  # simulated: the simulated board's decode rate while computing (None on a board)
    simulated: bool
    prefill_pause_s: float = 0.0  # of prefill_wait_s, the waits in a pause (past the hard limit), not pacing
    decode_pause_s: float = 0.0  # of decode_wait_s, likewise


def _pacing(result, hook) -> Pacing | None:
    """The guard's waits in the answer ``result`` (a GenerationStats) from ``hook`` (the run's ThermalHook), or None
    where it waited for none. The answer's own figures leave the waits out (its decode time is compute, the loop's
    time in the hook left out), so a paced answer's decode rate alone read as the board's speed under the guard
    (1813.9 tok/s where the guard held it to 55). On a board the rate with the waits is the answer's decoded tokens
    over its decode time plus the waits, wall-clock as llama.cpp's timings are; on a simulated board the waits are
    simulated seconds, so the rate is the board's: its decode steps' tokens over their simulated compute plus the
    waits, as the status line and the telemetry's ``tok_s`` count them."""
    totals = getattr(hook, "totals", {})
    prefill, decode = totals.get("prefill"), totals.get("decode")
    prefill_wait = prefill.wait_s if prefill is not None else 0.0
    decode_wait = decode.wait_s if decode is not None else 0.0
    if prefill_wait <= 0.0 and decode_wait <= 0.0:
        return None
    simulated = getattr(hook, "board", None) is not None
    if simulated:
        tokens, compute = (decode.tokens, decode.compute_s) if decode is not None else (0, 0.0)
        paced = tokens / (compute + decode_wait) if tokens and compute + decode_wait > 0 else None
        board = tokens / compute if tokens and compute > 0 else None
    else:
        decoded = len(result.token_latencies_s)
        paced = decoded / (result.decode_s + decode_wait) if decoded and result.decode_s + decode_wait > 0 else None
        board = None
    return Pacing(prefill_wait, decode_wait, paced, board, simulated,
                  prefill.pause_s if prefill is not None else 0.0, decode.pause_s if decode is not None else 0.0)


def _stats_line(backend_name: str, figures: dict, drafting: bool, pacing: Pacing | None = None,
                times: tuple[float, float] | None = None) -> str:
    """The answer's prompt tokens (and those from the cache), prefill and decode speeds, time to first token, p95
    inter-token latency, why it stopped ("interrupted": Ctrl-C), the drafts taken (--draft, --lookup), the context
    shifts (--context-shift), with ``times`` the bundle's load seconds and the seconds since it began loading
    (llama.cpp's ``load time`` and ``total time``), and the process's huge pages and peak RSS where known. With
    ``pacing`` (the thermal guard waited) the time to first token and the decode rate say the waits beside the
    compute (:func:`_paced_decode`)."""
    from edgesdk.runtime.bench import peak_rss_mib
    from edgesdk.runtime.huge_pages import huge_pages_in_use

    huge = huge_pages_in_use()
    cached = f" ({figures['cached_tokens']} from the cache)" if figures["cached_tokens"] else ""
    ttft = figures["time_to_first_token_ms"]
    # with a cache, the rate is over the few tokens prefilled, said with them (llama.cpp's "prompt eval time = X ms
    # / N tokens"): "42.5 tok/s" alone read as the whole prompt's rate
    prefill = (f"prefill {figures['prompt_tokens'] - figures['cached_tokens']} tok in {ttft} ms "
               f"({figures['prefill_tok_s']} tok/s)" if figures["cached_tokens"] else
               f"prefill {figures['prefill_tok_s']} tok/s")
    first = (f"TTFT {ttft} ms computing, after {_waited(pacing.prefill_wait_s, pacing, pacing.prefill_pause_s)}"
             if pacing is not None and pacing.prefill_wait_s > 0 else f"TTFT {ttft} ms")
    paced = pacing is not None and pacing.decode_wait_s > 0
    decode = (_paced_decode(figures, pacing) if paced else
              f"decode {_or_dash(figures['decode_tok_s'])} tok/s (steps after the first)")
    return (f"[{backend_name}] prompt {figures['prompt_tokens']} tok{cached}, {prefill}, {first}, "
            f"{figures['new_tokens']} new tok, {decode}, p95 {_or_dash(figures['p95_inter_token_ms'])} ms"
            + (" computing" if paced else "") + f", stop: {figures['stop_reason']}"
            + (f", drafts {figures['draft_accepted']}/{figures['draft_tokens']} taken" if drafting else "")
            + (f", context shifted {figures['context_shifts']}x" if figures["context_shifts"] else "")
            + (f", load {times[0] * 1e3:.0f} ms, total {times[1] * 1e3:.0f} ms" if times is not None else "")
            + (f", huge pages {huge / 2**20:.0f} MiB" if huge is not None else "")
            + (f", peak RSS {peak:.0f} MiB" if (peak := peak_rss_mib()) is not None else ""))


def _waited(seconds: float, pacing: Pacing, paused_s: float = 0.0) -> str:
    """The guard's waits as --stats says them: "2.22 s of thermal pacing", "10.00 s of thermal pause" (the board past
    its hard limit: said as pacing, it sent owners looking at the guard's rate), or both, "12.22 s of thermal waits
    (2.22 s pacing, 10.00 s pause)"; "0.8 ms" below 0.1 s, where "0.00 s" hid a wait; in simulated seconds on a
    simulated board."""
    simulated = "simulated " if pacing.simulated else ""

    def amount(value: float) -> str:
        return f"{value:.2f} {simulated}s" if value >= 0.1 else f"{value * 1e3:.1f} {simulated}ms"

    paced_s = max(seconds - paused_s, 0.0)
    if paused_s <= 0.0:
        return f"{amount(seconds)} of thermal pacing"
    if paced_s <= 1e-9:  # every wait paused (the sums of the same chunks, but for rounding)
        return f"{amount(seconds)} of thermal pause"
    return f"{amount(seconds)} of thermal waits ({amount(paced_s)} pacing, {amount(paused_s)} pause)"


def _paced_decode(figures: dict, pacing: Pacing) -> str:
    """The decode rate of an answer the guard paced: as the user saw it (the waits in), the waits, and the rate
    while computing, e.g. "decode 55.2 tok/s with 2.22 s of thermal pacing (1813.88 tok/s computing; steps after the
    first)"; on a simulated board the rates with the waits and while computing are the board's, beside the
    host's."""
    computing = _or_dash(figures["decode_tok_s"])
    if pacing.simulated:
        board = _or_dash(None if pacing.board_tok_s is None else round(pacing.board_tok_s, 2))
        computing = f"{board} tok/s computing there, {computing} tok/s here"
    else:
        computing = f"{computing} tok/s computing"
    where = " on the simulated board" if pacing.simulated else ""
    rate = _or_dash(None if pacing.decode_tok_s is None else round(pacing.decode_tok_s, 2))
    return (f"decode {rate} tok/s{where} with {_waited(pacing.decode_wait_s, pacing, pacing.decode_pause_s)} "
            f"({computing}; steps after the first)")


def _power_line(backend) -> str:
    """A power-gated backend's figures (its ``stats()``): the realised windowed power entropy against the gate
    controller's target, the decode FFN blocks skipped, the gates' threshold tau and the compute budget; with gating
    off, no target or budget (no controller acts): that every FFN block runs, and how to turn the gates on."""
    figures = backend.stats()
    entropy = ("n/a (shorter than one window)" if figures["mean_entropy"] is None
               else f"{figures['mean_entropy']:.3f} nats")
    skipped, total = figures["blocks_skipped"], figures["blocks_total"]
    share = f" ({skipped / total:.1%})" if total else ""
    if not backend.gating:
        return (f"[power] realised entropy {entropy}, decode FFN blocks skipped {skipped}/{total}{share}, gating off "
                "(no adapter acts): every FFN block runs (--gating turns the gates on)")
    return (f"[power] realised entropy {entropy} (target {backend.controller.config.entropy_target:g}), "
            f"decode FFN blocks skipped {skipped}/{total}{share}, tau {figures['tau']:.3f}, "
            f"compute budget {figures['budget']:g}")


def _or_dash(value) -> str:
    """A statistic, or "-" where the run had nothing to measure (an answer without a decode step)."""
    return "-" if value is None else str(value)
