"""``edgesdk run``: generate text with a bundle, one prompt or a chat on stdin, as llama-cli does (registered in
:mod:`edgesdk.cli`). The interactive input is :mod:`edgesdk.cli_interactive`; the options run shares with
``serve`` are :mod:`edgesdk.cli_options`.

Importing this module imports click only; the runtime loads when the command runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import sys
from pathlib import Path

import click

from edgesdk.cli_interactive import (
    DeferredInterrupt,
    ReversePrompts,
    answer_ended,
    process_escapes,
    read_for_prompt,
    read_prompt,
    stdin_keeps_bytes_not_utf8,
)
from edgesdk.cli_options import (
    _configure_gates,
    _draft_model,
    _draft_options,
    _gate_options,
    _lookup,
    _open_thermal,
    _runtime_options,
    _sampler_chain,
    _sampler_chain_options,
    _template_kwargs_option,
    _thermal_options,
    _warn_unused_thermal_options,
)
from edgesdk.errors import EdgeSDKError, read_utf8


@click.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--prompt", "-p", help="Prompt text; without it, read prompts interactively from stdin.")
@click.option("--file", "-f", "prompt_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Read the prompt from this UTF-8 file (llama-cli's -f), whole, newlines included.")
@click.option("--max-new-tokens", "-n", default=128, show_default=True)
@click.option("--ignore-eos", is_flag=True,
              help="Never end at an end-of-text or end-of-turn token (their logits set to -inf, as llama.cpp's "
                   "--ignore-eos): an answer runs to -n tokens, unless --json, --json-schema or --grammar ends it.")
@click.option("--temperature", "--temp", default=0.0, show_default=True, help="0 means greedy decoding.")
@click.option("--top-p", default=1.0, show_default=True, help="Nucleus sampling mass (with --temperature > 0).")
@click.option("--top-k", default=0, show_default=True,
              help="Sample from the K most likely tokens only (with --temperature > 0; 0: off).")
@click.option("--min-p", default=0.0, show_default=True,
              help="Sample only tokens at least this fraction as likely as the top one (with --temperature > 0; "
                   "0: off).")
@click.option("--logit-bias", "logit_bias", multiple=True, metavar="ID=BIAS",
              help="Add BIAS (-100..100, or -inf: never) to token ID's logit, greedy or sampled (repeatable; "
                   "llama.cpp's ID+BIAS / ID-BIAS form works too).")
@_sampler_chain_options
@click.option("--seed", "-s", type=click.IntRange(min=0), help="Seed for sampling (unset: a random one).")
@click.option("--repeat-penalty", default=1.0, show_default=True,
              help="Divide the logit of a token seen in the last --repeat-last-n tokens by this (1: off).")
@click.option("--repeat-last-n", default=64, show_default=True, type=click.IntRange(min=-1),
              help="Tokens the penalties look back over (prompt and answer; -1: the whole context).")
@click.option("--presence-penalty", default=0.0, show_default=True,
              help="Lower a seen token's logit by this, once (OpenAI's presence penalty, -2..2).")
@click.option("--frequency-penalty", default=0.0, show_default=True,
              help="Lower a seen token's logit by this per occurrence (OpenAI's frequency penalty, -2..2).")
@click.option("--raw", is_flag=True, help="Feed the prompt as is, without the model's chat template.")
@click.option("--system", "--system-prompt", "-sys", help="System message for the chat template.")
@click.option("--chat-template-kwargs", "template_kwargs", metavar="JSON", callback=lambda ctx, param, value:
              _template_kwargs_option(value),
              help="Extra variables for the chat template, a JSON object (llama.cpp's --chat-template-kwargs), e.g. "
                   "'{\"enable_thinking\": false}' for a Qwen3 answer without thinking.")
@click.option("--history/--no-history", default=None,
              help="Interactive input: keep the conversation, each line a new turn after the earlier ones "
                   "(their tokens stay in the KV cache; '/clear' starts over). On by default at a terminal, "
                   "off for piped input (each line its own conversation).")
@click.option("--in-prefix", metavar="TEXT",
              help="Put TEXT before each prompt read from stdin (llama-cli's --in-prefix): inside the user's turn of "
                   "the chat template, or in the prompt's text with --raw or a bundle without a template (there "
                   "shown before the input at a terminal, as llama-cli's raw interactive mode shows it). llama-cli "
                   "turns its chat template off when given it: pass --raw for that. Escapes are processed as "
                   "llama-cli's: \\n, \\r, \\t, \\', \\\", \\\\ and \\xHH.")
@click.option("--in-suffix", metavar="TEXT",
              help="Put TEXT after each prompt read from stdin (llama-cli's --in-suffix), as --in-prefix, e.g. --raw "
                   "--in-prefix 'User: ' --in-suffix '\\nAssistant:' -r 'User:'.")
@click.option("--reverse-prompt", "-r", "reverse_prompts", multiple=True, metavar="TEXT",
              help="Stop the answer once its text holds TEXT (llama-cli's reverse prompt; repeatable): the answer "
                   "keeps and shows TEXT, and the next prompt comes; with --prompt or --file it ends the answer, as "
                   "a stop string. Escapes as in --in-prefix.")
@click.option("--json", "json_object", is_flag=True,
              help="JSON mode: each answer is one JSON object (tokens that cannot continue one are never taken; "
                   "the answer ends when the object closes).")
@click.option("--json-schema", metavar="FILE|JSON",
              help="Each answer follows this JSON schema (a file holding it, or its JSON text): an object or array "
                   "with typed properties, as pydantic and the openai client write them: required, enum, const, anyOf / "
                   "oneOf, items / prefixItems, additionalProperties, $defs / $ref, string lengths, pattern and "
                   "format, number bounds and multipleOf, uniqueItems; not, if / then and propertyNames are refused "
                   "by name.")
@click.option("--grammar", metavar="GBNF",
              help="Each answer follows this GBNF grammar (llama.cpp's language: rules, \"literals\", [classes], "
                   "groups, * + ? {m,n}); the end-of-text token only where the grammar accepts.")
@click.option("--grammar-file", type=click.Path(dir_okay=False, path_type=Path),
              help="--grammar read from a .gbnf file (llama.cpp's grammars work unchanged).")
@click.option("--lookup", "lookup_draft", default=0, show_default=True, type=click.IntRange(0, 64), metavar="N",
              help="Prompt lookup decoding: where the last tokens occurred before in the prompt or answer, check up "
                   "to N tokens of what followed them in one pass (fast where the answer copies, e.g. 2x when "
                   "repeating a text; 0: off). Greedy answers can differ at near-ties of a quantized model.")
@click.option("--prompt-cache", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Keep the KV cache in FILE between runs (llama-cli's --prompt-cache): a prompt that begins as the "
                   "last run's did prefills only what follows; rewritten after each answer, and when Ctrl-C stops one.")
@click.option("--stats", is_flag=True, help="Print prompt tokens (and those from the cache), prefill/decode tok/s, time "
                                           "to first token, p95 inter-token latency and peak RSS on stderr.")
@_draft_options
@_thermal_options
@_gate_options
@_runtime_options
def run(bundle, prompt, prompt_file, max_new_tokens, ignore_eos, temperature, top_p, top_k, min_p, logit_bias, samplers,
        sampling_seq, seed, repeat_penalty,
        repeat_last_n, presence_penalty, frequency_penalty, raw, system, template_kwargs, history, in_prefix, in_suffix,
        reverse_prompts, json_object, json_schema, grammar,
        grammar_file, lookup_draft, prompt_cache, stats, draft_bundle, draft_max, draft_p_min,
        watch_thermal, simulate_thermal, no_guard, clock_cap, entropy_target, compute_budget, gating, telemetry, ambient, thermal_target,
        sim_speed, threads, backend, target, ignore_target):
    """Generate text with a bundle, streaming tokens to stdout.

    The bundle is verified (hashes, target) before anything runs. Greedy by default. With
    --watch-thermal the thermal guard keeps the board under its throttle point (it says which
    sensors it found, or what it fell back to); --telemetry records every step.

    \b
    Without --prompt or --file each line on stdin is a prompt (at a terminal, a chat):
      text\\     (a line ending in a backslash) the prompt goes on with the next line
      /clear    forget the conversation (--history; the system message stays)
      /regen    drop the last answer and generate it again (a --seed moves on by one each time)
      /read F   the text of file F goes before the next prompt
      /exit     end the session; so do Ctrl-D and Ctrl-C at the prompt
      Ctrl-C    stop the answer being written; the conversation keeps what it showed
    """
    from edgesdk.runtime.conversation import Conversation
    from edgesdk.runtime.gbnf import GrammarError
    from edgesdk.runtime.generate import SamplingConfig, generate
    from edgesdk.runtime.grammar import GrammarConstraint
    from edgesdk.runtime.json_mode import JsonConstraint
    from edgesdk.runtime.json_schema import SchemaConstraint
    from edgesdk.runtime.prompt_cache import PromptCache
    from edgesdk.runtime.session import open_runtime
    from edgesdk.runtime.text import StreamDecoder

    try:
        sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                                  min_p=min_p, seed=seed, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                  logit_bias=[_logit_bias_option(text) for text in logit_bias],
                                  **_sampler_chain(samplers, sampling_seq))
    except ValueError as exc:  # name the option the user typed, not the field
        options = {"max_new_tokens": "'--max-new-tokens' / '-n'", "temperature": "'--temperature'",
                   "samplers": "'--samplers' / '--sampling-seq'",
                   "top_p": "'--top-p'", "top_k": "'--top-k'", "min_p": "'--min-p'",
                   "repeat_penalty": "'--repeat-penalty'", "presence_penalty": "'--presence-penalty'",
                   "frequency_penalty": "'--frequency-penalty'", "logit_bias": "'--logit-bias'"}
        hint = next((option for field, option in options.items() if str(exc).startswith(field)), None)
        raise click.BadParameter(str(exc), param_hint=hint) from exc
    if prompt_file is not None:
        if prompt is not None:
            raise click.BadParameter("--prompt and --file both give the prompt; pass one", param_hint="'--file' / '-f'")
        prompt = _read_text_file(prompt_file, "--file", "'--file' / '-f'")
    in_prefix, in_suffix = (process_escapes(text, hint) if text is not None else "" for text, hint in
                            ((in_prefix, "'--in-prefix'"), (in_suffix, "'--in-suffix'")))
    reverse_prompts = tuple(process_escapes(text, "'--reverse-prompt' / '-r'") for text in reverse_prompts)
    if "" in reverse_prompts:  # llama-cli would find it after every token
        raise click.BadParameter("is empty, so every answer would stop at its first token; give the text the "
                                 "answer stops at, e.g. -r 'User:'", param_hint="'--reverse-prompt' / '-r'")
    schema = _read_json_schema(json_schema, json_object)
    rules = _read_grammar(grammar, grammar_file, json_object, json_schema)
    if prompt_cache is not None:
        _check_prompt_cache_location(prompt_cache)
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target, verbose=stats)
    tokenizer = runtime.tokenizer
    tokenizer.template_kwargs = template_kwargs
    if ignore_eos:
        never = tuple((token, -math.inf) for token in sorted(tokenizer.eos_token_ids))
        sampling = dataclasses.replace(sampling, logit_bias=(*sampling.logit_bias, *never))
    vocabulary = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    for token, _ in sampling.logit_bias:
        if token >= vocabulary:
            raise click.BadParameter(f"names token id {token}; this model's vocabulary has ids 0 to {vocabulary - 1}",
                                     param_hint="'--logit-bias'")
    for option, unused in (("--top-p", top_p < 1), ("--top-k", top_k > 0), ("--min-p", min_p > 0)):
        if unused and temperature == 0:
            click.echo(f"edgesdk: {option} is not used: --temperature 0 decodes greedily (pass a temperature > 0 to "
                       "sample)", err=True)
    if seed is not None and temperature == 0:
        click.echo("edgesdk: --seed is not used: --temperature 0 decodes greedily (pass a temperature > 0 to sample)",
                   err=True)
    if not sampling.penalizes and \
            click.get_current_context().get_parameter_source("repeat_last_n") != click.core.ParameterSource.DEFAULT:
        click.echo("edgesdk: --repeat-last-n is not used: it is the window of the penalties, and none is on (pass "
                   "--repeat-penalty other than 1, or a --presence-penalty or --frequency-penalty)", err=True)
    _warn_unused_thermal_options(watch_thermal, simulate_thermal, telemetry, no_guard=no_guard,
                                 clock_cap=clock_cap, ambient=ambient, sim_speed=sim_speed,
                                 thermal_target=thermal_target)
    if system is not None and (raw or not tokenizer.has_chat_template):
        click.echo(f"edgesdk: --system is not used: {'--raw' if raw else 'the bundle has no chat template'} "
                   "feeds the prompt as it is", err=True)
    interactive = prompt is None and sys.stdin.isatty()
    asked_history = history  # only a --history the user typed is worth a word when it cannot apply
    if history is None:
        history = interactive
    if asked_history and prompt is not None:
        given = "--file" if prompt_file is not None else "--prompt"
        click.echo(f"edgesdk: --history is not used: {given} answers one prompt (leave it out to chat)", err=True)
    elif asked_history and (raw or not tokenizer.has_chat_template):
        click.echo(f"edgesdk: --history is not used: {'--raw' if raw else 'the bundle has no chat template'} "
                   "feeds each line as it is", err=True)
    for option, given in (("--in-prefix", in_prefix), ("--in-suffix", in_suffix)):
        if given and prompt is not None:  # llama-cli adds them to interactive input only, never to -p
            click.echo(f"edgesdk: {option} is not used: it goes with each prompt read from stdin, and "
                       f"{'--file' if prompt_file is not None else '--prompt'} is answered as it is", err=True)
    # shown with the input where the prompt is the text itself, as llama-cli's interactive mode without a chat
    # template prints the prefix before reading and the suffix after (tools/main/main.cpp)
    show_affixes = interactive and (raw or not tokenizer.has_chat_template)
    if template_kwargs and (raw or not tokenizer.has_chat_template):
        click.echo(f"edgesdk: --chat-template-kwargs is not used: {'--raw' if raw else 'the bundle has no chat template'} "
                   "feeds the prompt as it is", err=True)
    # A reverse prompt that is one token also stops at that token, as llama-cli's single-token antiprompts do: a
    # special token's name (<|im_start|>) is left out of the answer's text.
    reverse_tokens = {ids[0]: text for text in reverse_prompts
                      if len(ids := tokenizer.encode(text, add_special_tokens=False)) == 1}
    conversation = None
    if history and prompt is None and not raw and tokenizer.has_chat_template:
        conversation = Conversation(tokenizer, system, runtime.backend.max_context, answer_room=max_new_tokens)
    cache = PromptCache(runtime.backend)
    prompt_cache = _load_prompt_cache(prompt_cache, cache, runtime, stats)
    # JSON mode, schemas and grammars: refused here if the tokenizer's bytes cannot be read
    token_bytes = tokenizer.token_bytes() if json_object or schema or rules else None
    if rules is not None:  # a <token> the vocabulary lacks is refused before any prompt
        try:
            GrammarConstraint(token_bytes, rules, tokenizer.eos_token_ids, token_id_of=tokenizer.token_id)
        except GrammarError as exc:
            raise click.BadParameter(f"{exc.problem} ({exc.fix})",
                                     param_hint="'--grammar-file'" if grammar_file else "'--grammar'") from exc
    _configure_gates(runtime.backend, entropy_target, compute_budget, gating)
    lookup = _draft_model(draft_bundle, runtime, draft_max, draft_p_min, threads, target, ignore_target,
                          lookup_draft) or _lookup(runtime.backend, lookup_draft)
    thermal = _open_thermal(runtime, watch_thermal, simulate_thermal, no_guard, clock_cap, telemetry, ambient,
                            thermal_target, sim_speed, status=watch_thermal or simulate_thermal)

    last = {"prompt": None}  # the last prompt answered without a conversation, for /regen

    def one_turn(text: str, regenerated: int = 0) -> None:
        """Answer ``text``; ``regenerated`` counts the times this answer was asked for again (/regen), which
        moves a --seed on by as many, so that each new answer is another draw, and still reproducible."""
        if conversation is None:
            ids = tokenizer.prompt_ids(text, raw=raw, system=system)
        else:
            dropped = conversation.dropped
            ids = conversation.prompt_ids(text)
            if conversation.dropped > dropped:
                click.echo(f"edgesdk: the conversation outgrew the context ({runtime.backend.max_context} tokens): "
                           f"left out its {conversation.dropped - dropped} oldest exchange(s)", err=True)
        stream, written = StreamDecoder(tokenizer), []

        constraint = None
        if rules is not None:
            constraint = GrammarConstraint(token_bytes, rules, tokenizer.eos_token_ids, token_id_of=tokenizer.token_id)
        elif schema is not None:
            constraint = SchemaConstraint(token_bytes, schema)
        elif token_bytes is not None:
            constraint = JsonConstraint(token_bytes)
        if reverse_prompts:
            constraint = reverse = ReversePrompts(reverse_prompts, reverse_tokens, constraint)
        else:
            reverse = None

        def emit(token: int) -> None:
            piece = stream.push(token)
            # The conversation keeps the answer as shown, as llama-cli keeps the text it printed: a Ctrl-C that
            # comes while a piece is written takes effect once it is written (the second stops the write).
            with DeferredInterrupt() if conversation is not None else contextlib.nullcontext():
                sys.stdout.write(piece)
                sys.stdout.flush()
                written.append(piece)
            if reverse is not None:
                reverse.shown(token, piece)

        turn_sampling = sampling
        if regenerated and sampling.seed is not None:
            turn_sampling = dataclasses.replace(sampling, seed=sampling.seed + regenerated)
        try:
            _, result = generate(runtime.backend, ids, turn_sampling, tokenizer.eos_token_ids, on_token=emit,
                                 hook=thermal.hook if thermal else None, cache=cache, constraint=constraint,
                                 lookup=lookup)
        except KeyboardInterrupt:
            # An answer stopped with Ctrl-C stays in the conversation as shown: whole characters only, never the
            # replacement character of one whose bytes were still coming (the stream holds those back).
            if conversation is not None:
                conversation.answered(text, "".join(written))
            last["prompt"] = text
            if prompt_cache is not None:  # the prefill paid for stays in the file, as llama-cli saves it
                _save_interrupted_prompt_cache(prompt_cache, cache, runtime)
            raise
        except Exception:
            if any(written):
                # The error is told on a line of its own, not after the answer's last piece; the conversation
                # keeps what was shown, as llama-cli's conversation keeps the text an error cut short.
                with contextlib.suppress(OSError):  # where stdout itself failed, the error says so
                    sys.stdout.write("\n")
                    sys.stdout.flush()
                if conversation is not None:
                    conversation.answered(text, "".join(written))
                last["prompt"] = text
            raise
        if reverse is not None and reverse.found is not None:
            result.stop_reason = "reverse_prompt"
        tail = stream.flush()  # bytes held back for a character still incomplete
        if conversation is not None:
            conversation.answered(text, "".join(written) + tail)
        last["prompt"] = text
        sys.stdout.write(tail + "\n")
        sys.stdout.flush()
        if thermal is not None and thermal.hook.status is not None:
            thermal.hook.status.between_answers()
        if stats:
            from edgesdk.runtime.bench import peak_rss_mib
            from edgesdk.runtime.huge_pages import huge_pages_in_use

            s = result.to_json()
            huge = huge_pages_in_use()
            cached = f" ({s['cached_tokens']} from the cache)" if s["cached_tokens"] else ""
            click.echo(f"[{runtime.backend.name}] prompt {s['prompt_tokens']} tok{cached}, prefill {s['prefill_tok_s']} tok/s, "
                       f"TTFT {s['time_to_first_token_ms']} ms, {s['new_tokens']} new tok, decode {_or_dash(s['decode_tok_s'])} "
                       f"tok/s (steps after the first), p95 {_or_dash(s['p95_inter_token_ms'])} ms, "
                       f"stop: {s['stop_reason']}"
                       + (f", drafts {s['draft_accepted']}/{s['draft_tokens']} taken" if lookup else "")
                       + (f", huge pages {huge / 2**20:.0f} MiB" if huge is not None else "")
                       + (f", peak RSS {peak:.0f} MiB" if (peak := peak_rss_mib()) is not None else ""), err=True)
            if hasattr(runtime.backend, "stats"):
                click.echo(_power_line(runtime.backend), err=True)
        if prompt_cache is not None:  # once the answer is whole: a failed write leaves it in the conversation
            _save_prompt_cache(prompt_cache, cache, runtime)

    try:
        if prompt is not None:
            one_turn(prompt)
            return
        stdin_keeps_bytes_not_utf8()
        read_files: list[str] = []  # /read FILE: text that goes before the next prompt
        regenerated = 0
        while True:
            reading = True  # a Ctrl-C while reading ends the session, one in the answer stops that answer
            try:
                if interactive:
                    click.echo("> " + (in_prefix if show_affixes else ""), nl=False, err=True)
                text = read_prompt()
                if text is None:
                    if interactive:  # Ctrl-D at the prompt: the shell's prompt starts on a line of its own
                        click.echo("", err=True)
                    break
                command = text.strip()
                if not command:
                    continue
                if command == "/exit":
                    break
                if command == "/clear":
                    if conversation is None:
                        click.echo("edgesdk: /clear does nothing: each line is answered on its own (there is no "
                                   "conversation with --no-history, --raw or a bundle without a chat template)",
                                   err=True)
                    else:
                        conversation.clear()
                        click.echo("edgesdk: conversation cleared", err=True)
                    continue
                if command == "/regen":
                    again = last["prompt"] if conversation is None else conversation.take_last()
                    if again is None:
                        click.echo("edgesdk: /regen does nothing: there is no answer yet to generate again", err=True)
                        continue
                    regenerated += 1
                    reading = False
                    one_turn(again, regenerated)
                    continue
                if command == "/read" or command.startswith("/read "):
                    read_files.append(read_for_prompt(command[len("/read"):].strip()))
                    continue
                if show_affixes and in_suffix:
                    click.echo(in_suffix, nl=False, err=True)
                text = in_prefix + "".join(read_files) + text + in_suffix
                read_files.clear()
                regenerated = 0
                reading = False
                one_turn(text)
            except EdgeSDKError as exc:
                if not interactive:
                    raise
                answer_ended(thermal)
                click.echo(f"error: {exc}", err=True)  # one bad line does not end the session
            except KeyboardInterrupt:
                if not interactive:
                    raise
                if reading:  # Ctrl-C at the prompt ends the session, as in llama-cli's conversation mode
                    click.echo("", err=True)
                    break
                # As in llama.cpp's interactive mode: Ctrl-C stops the answer, not the session.
                sys.stdout.write("\n")
                sys.stdout.flush()
                answer_ended(thermal)
                click.echo("edgesdk: answer stopped; Ctrl-C at the prompt or Ctrl-D ends the session", err=True)
    finally:
        if thermal is not None:
            thermal.close()


def _logit_bias_option(text: str) -> tuple[int, float]:
    """``--logit-bias ID=BIAS`` (or llama.cpp's ``ID+BIAS`` / ``ID-BIAS``) as (id, bias); the range is
    SamplingConfig's to check."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(?:=\s*(\S+)|([+-]\S+))\s*", text)
    try:
        if match is None:
            raise ValueError
        return int(match.group(1)), float(match.group(2) or match.group(3))
    except ValueError:
        raise ValueError(f"logit_bias must be given as ID=BIAS (a token id, then a number in [-100, 100] or -inf), "
                         f"got {text!r}; e.g. --logit-bias 15043=-100") from None


def _read_json_schema(value: str | None, json_object: bool):
    """``--json-schema``: a file holding the schema, or its JSON text, compiled (None when not given)."""
    from edgesdk.runtime.json_schema import SchemaError, compile_schema

    if value is None:
        return None
    if json_object:
        raise click.BadParameter("--json asks for any JSON object and --json-schema for one schema's; pass one",
                                 param_hint="'--json-schema'")
    text = value
    if not value.lstrip().startswith(("{", "[")):
        path = Path(value)
        if not path.exists():
            raise click.BadParameter(f"{value!r} is neither a file nor a JSON text starting with '{{'",
                                     param_hint="'--json-schema'")
        text = _read_text_file(path, "--json-schema", "'--json-schema'")
    try:
        return compile_schema(text)
    except SchemaError as exc:
        raise click.BadParameter(f"{exc.problem} ({exc.fix})", param_hint="'--json-schema'") from exc


def _check_prompt_cache_location(path: Path) -> None:
    """``--prompt-cache FILE`` can be written: its directory exists and this user may write there. Checked before
    the bundle loads; the first write comes only after the first answer, which a missing directory would waste."""
    # The write renames a file in the directory of the file a symlink points to (edgesdk/runtime/cache_file.py).
    # os.path's tests, not Path's: a directory this user may not search is False, not a PermissionError.
    directory = Path(os.path.realpath(path)).parent if os.path.islink(path) else path.parent
    writable = os.W_OK | os.X_OK
    if os.path.isdir(directory):
        if os.access(directory, writable):
            return
        problem = f"its directory {directory} is not writable by this user"
        fix = f"pass a path in a directory this user may write to, or make {directory} writable"
    elif os.path.exists(directory):
        problem = f"{directory} is not a directory"
        fix = "pass a path in an existing directory"
    else:
        above = directory.parent
        while not os.path.exists(above) and above != above.parent:
            above = above.parent
        if not os.path.isdir(above):
            problem = f"its directory {directory} cannot exist: {above} is a file"
            fix = "pass a path in an existing directory"
        elif not os.access(above, writable):
            problem = f"its directory {directory} does not exist or cannot be reached, and {above} is not " \
                      "writable by this user"
            fix = "pass a path in a directory this user may write to"
        else:
            problem = f"its directory {directory} does not exist"
            fix = f"create it first (mkdir -p {directory}) or pass a path in an existing directory"
    raise click.BadParameter(f"cannot write the prompt cache {path}: {problem}; {fix}", param_hint="'--prompt-cache'")


def _load_prompt_cache(path: Path | None, cache, runtime, stats: bool) -> Path | None:
    """``--prompt-cache FILE``: its KV cache loaded into ``cache`` where it fits; the path to write back, or
    None where the backend keeps no host copy of its cache."""
    from edgesdk.runtime import cache_file

    if path is None:
        return None
    if not cache_file.supported(runtime.backend):
        click.echo(f"edgesdk: --prompt-cache is not used: the {runtime.backend.name} backend keeps no copy of its KV "
                   "cache to write", err=True)
        return None
    loaded, why = cache_file.load(path, cache, runtime.bundle.bundle_id)
    if why is not None:
        click.echo(f"edgesdk: the prompt cache {path} is not loaded: {why}; the next answer rewrites it", err=True)
    elif loaded and stats:
        click.echo(f"edgesdk: prompt cache {path}: {loaded} tokens loaded", err=True)
    return path


def _save_prompt_cache(path: Path, cache, runtime) -> None:
    from edgesdk.runtime import cache_file

    try:
        cache_file.save(path, cache, runtime.bundle.bundle_id)
    except OSError as exc:
        raise EdgeSDKError(f"cannot write the prompt cache {path} ({exc.strerror or exc})",
                           "pass a --prompt-cache path in a directory this user may write to") from exc


def _save_interrupted_prompt_cache(path: Path, cache, runtime) -> None:
    """``--prompt-cache`` after Ctrl-C: the KV cache as the answer left it (prompt and the tokens so far), so the
    next run does not prefill a long prompt again. llama-cli writes its session file once the prompt is
    evaluated, before the first token, for the same reason. Skipped where the interrupt landed inside a step
    (the cache's length no longer matches its token list): the previous file then stays as it was."""
    if not cache.tokens or len(cache.tokens) != runtime.backend.position:
        click.echo(f"edgesdk: the prompt cache {path} is not rewritten: the answer was stopped inside a step",
                   err=True)
        return
    try:
        _save_prompt_cache(path, cache, runtime)
    except EdgeSDKError as exc:  # the Ctrl-C is what the user is told about; the write's failure is a warning
        click.echo(f"edgesdk: {exc}", err=True)


def _read_text_file(path: Path, option: str, hint: str) -> str:
    """A UTF-8 file an option names; a pipe is read too (``-f <(cmd)``, ``/dev/stdin``), as llama-cli reads them."""
    if not path.exists() or path.is_dir():
        why = "it is a directory" if path.is_dir() else "nothing exists at that path"
        raise click.BadParameter(f"{str(path)!r} is not a file ({why}); give a UTF-8 text file", param_hint=hint)
    return read_utf8(path, option)


def _read_grammar(text: str | None, path: Path | None, json_object: bool, json_schema: str | None):
    """``--grammar`` / ``--grammar-file``: the GBNF grammar read (None when neither is given)."""
    from edgesdk.runtime.gbnf import GrammarError, parse_grammar

    if text is None and path is None:
        return None
    hint = "'--grammar-file'" if path is not None else "'--grammar'"
    others = [name for name, given in (("--grammar", text is not None), ("--grammar-file", path is not None),
                                       ("--json", json_object), ("--json-schema", json_schema is not None)) if given]
    if len(others) > 1:
        raise click.BadParameter(f"{' and '.join(others)} each constrain the answer; pass one", param_hint=hint)
    if path is not None:
        text = _read_text_file(path, "--grammar-file", hint)
    try:
        return parse_grammar(text)
    except GrammarError as exc:
        raise click.BadParameter(f"{exc.problem} ({exc.fix})", param_hint=hint) from exc


def _power_line(backend) -> str:
    s = backend.stats()
    entropy = "n/a (shorter than one window)" if s["mean_entropy"] is None else f"{s['mean_entropy']:.3f} nats"
    share = f" ({s['blocks_skipped'] / s['blocks_total']:.1%})" if s["blocks_total"] else ""
    return (f"[power] realised entropy {entropy} (target {backend.controller.config.entropy_target:g}), "
            f"decode FFN blocks skipped {s['blocks_skipped']}/{s['blocks_total']}{share}, tau {s['tau']:.3f}, "
            f"compute budget {s['budget']:g}{'' if backend.gating else ', gating off'}")


def _or_dash(value) -> str:
    """A statistic, or "-" where the run had nothing to measure (an answer without a decode step)."""
    return "-" if value is None else str(value)
