"""``edgesdk serve``: a bundle behind an OpenAI-compatible HTTP API, as llama-server serves one (registered in
:mod:`edgesdk.cli`). The server is :mod:`edgesdk.serve`; the options serve shares with ``run`` are
:mod:`edgesdk.cli_options`. Several bundles (``BUNDLE...``, ``--models-dir``) are served one loaded at a time and
swapped when a request names another, as Ollama does on a small machine (:mod:`edgesdk.serve.model_pool`).

Importing this module imports click only; the runtime and the server load when the command runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

import click

from edgesdk.api_checks import gate_options_given
from edgesdk.cli_embed import PoolingChoice
from edgesdk.cli_llama import (
    CTX_SIZE_ENV,
    LLAMA_OPTION_NAMES,
    LlamaCommand,
    LlamaEnvOption,
    checked_ctx_size,
    checked_ctx_size_env,
    ctx_size_env_note,
    ctx_size_source,
    say_model_env_overridden,
    say_unread_llama_env,
    told_from_env,
)
from edgesdk.cli_options import (
    LLAMA_SEED,
    SAMPLING_OPTIONS,
    SEED_RULE,
    bad_sampling_option,
    configure_gates,
    draft_model,
    draft_options,
    exit_on_stop_signals,
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
from edgesdk.errors import EdgeSDKError

# edgesdk serve's default -to / --timeout (edgesdk/serve/http_server.py says why it is not llama-server's 600 s):
# the number itself, since importing the server here would load it for every command
CLIENT_TIMEOUT_S = 60
SERVE_STOP_WAIT_S = 30  # how long a stopped server waits for the answers in flight (a long prompt's prefill on a board)


def _token_limit(value: int) -> int:
    """``-n``, as llama-server reads it (:func:`~edgesdk.cli_options.token_limit`, "-1 = infinity"): a count >= 1,
    or any number below 0 for no limit but the context."""
    return token_limit(value, "-1 for no limit but the context (any number below 0, as llama-server's -n)")


@click.command(cls=LlamaCommand, context_settings=LLAMA_OPTION_NAMES)
@click.argument("bundles", metavar="[BUNDLE]...", nargs=-1, type=click.Path(path_type=Path))
@click.option("--model", "-m", "model", type=click.Path(path_type=Path), metavar="BUNDLE",
              help="A BUNDLE to serve, as llama-server's -m / --model names its model (the same bundle may be given "
                   "as BUNDLE too, another is refused).")
@click.option("--models-dir", type=click.Path(path_type=Path), metavar="DIR", cls=LlamaEnvOption,
              envvar="LLAMA_ARG_MODELS_DIR",
              help="Serve every bundle directory directly in DIR too, each under its directory's name (llama-server's "
                   "router option, which names each model after its file or folder): one model is "
                   "loaded at a time, the first given at start (a BUNDLE given that DIR holds too is served once), and a "
                   "request naming another swaps it in.")
@click.option("--host", "listen_host", default="127.0.0.1", show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_HOST",
              help="Address to listen on (0.0.0.0 or :: for every interface); TCP only: a unix socket path, which "
                   "llama-server takes for a --host ending in .sock, is refused.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), cls=LlamaEnvOption,
              envvar="LLAMA_ARG_PORT",
              help="TCP port (0: a free one, printed at start).")
@click.option("--api-key", cls=LlamaEnvOption, envvar=["EDGESDK_API_KEY", "LLAMA_API_KEY"], secret=True,
              help="Require 'Authorization: Bearer KEY' (or Anthropic's 'x-api-key: KEY') on every route but /health, "
                   "/ and the model list GET /v1/models (/models), which stay open as in llama-server; several keys as "
                   "a comma-separated list (KEY1,KEY2), as llama-server's --api-key takes them. A key on the "
                   "command line shows in 'ps' to every user of the board: prefer the environment variable "
                   "(EDGESDK_API_KEY, or llama-server's LLAMA_API_KEY; where both are set, EDGESDK_API_KEY).")
@click.option("--ollama-origins", envvar="OLLAMA_ORIGINS", metavar="ORIGINS",
              help="Origins whose web pages may use Ollama's routes (/api/...) beside local ones (localhost, 127.0.0.1, "
                   "app://, file://, ...), comma-separated, '*' for any text (https://*.example.com, chrome-extension://*; "
                   "'*' alone: every origin), as Ollama's OLLAMA_ORIGINS; other origins get a 403 there. The other routes "
                   "answer every origin, as llama-server's do.")
@click.option("--model-name", "--alias", "-a", "model_names", multiple=True, metavar="NAME", cls=LlamaEnvOption,
              envvar="LLAMA_ARG_ALIAS",
              help="Model id the API reports (llama-server's --alias) [<model>-<target> from the manifest; a "
                   "bundle found through --models-dir: its directory's name]. With "
                   "several bundles: NAME=BUNDLE, once for each bundle to rename.")
@click.option("--max-new-tokens", "-n", "--predict", "--n-predict", "max_new_tokens", default=512, show_default=True,
              type=int, cls=LlamaEnvOption, envvar="LLAMA_ARG_N_PREDICT",
              callback=lambda ctx, param, value: _token_limit(value),
              help="Tokens per answer for a request that sets no max_tokens (-1, or any number below 0: until the "
                   "answer ends or the context is full, as llama-server's -n (--n-predict)).")
@click.option("--temperature", "--temp", default=0.0, show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_TEMPERATURE",
              help="For a request that sets none; 0 (or below, as llama-server) means greedy decoding. Not given: the model's own, where its "
                   "bundle records one (as --top-p, --top-k, --min-p, --repeat-penalty, --repeat-last-n and --samplers; "
                   "'edgesdk inspect' shows them).")
@click.option("--top-p", default=1.0, show_default=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_TOP_P",
              help="For a request that sets none.")
@click.option("--top-k", default=0, show_default=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_TOP_K",
              help="For a request that sets none (0 or below: off).")
@click.option("--min-p", default=0.0, show_default=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_MIN_P",
              help="For a request that sets none (0: off).")
@click.option("--seed", "-s", type=LLAMA_SEED, metavar="SEED",
              help=f"The seed of a request that sends none, as llama-server's -s: the same request gets the same "
                   f"sampled answer; a random seed for each request is the default ({SEED_RULE}). A request's own "
                   "seed (Ollama's options.seed) goes over it, -1 too.")
@repeat_penalty_options(per_request=True)
@sampler_chain_options
@click.option("--max-queue", default=8, show_default=True, type=click.IntRange(min=0),
              help="Requests that may wait while one generates; more get HTTP 503 at once.")
@click.option("--context-shift/--no-context-shift", default=False, show_default=True, cls=LlamaEnvOption,
              envvar="LLAMA_ARG_CONTEXT_SHIFT", negated_env="LLAMA_ARG_NO_CONTEXT_SHIFT",
              help="Where an answer fills the context, keep its first --keep tokens, drop half of the rest and go on "
                   "(llama-server's option; off: the answer stops at the full context). A request's n_keep and "
                   "n_discard (POST /completion) set it per answer; Ollama's routes shift unless 'shift' is false.")
@click.option("--keep", default=0, show_default=True, type=click.IntRange(min=-1), metavar="N",
              help="With --context-shift: the prompt's first N tokens (and its BOS) stay at a shift (-1: the whole "
                   "prompt), for a request that sends no n_keep (llama-server's --keep).")
@click.option("--quiet", is_flag=True, help="No request log on stderr.")
@click.option("--timeout", "-to", "client_timeout_s", default=CLIENT_TIMEOUT_S, show_default=True,
              type=click.IntRange(min=1), metavar="SECONDS", cls=LlamaEnvOption, envvar="LLAMA_ARG_TIMEOUT",
              help="How long one read or write may wait on a client (llama-server's -to / --timeout): a request that "
                   "stalls, an idle keep-alive connection or a stream nobody reads is let go after it. Shorter than "
                   "llama-server's 600: a board answers one request at a time, and a stalled stream holds the "
                   "others meanwhile. A whole request (its head and body) has 300 s or this, whichever is longer, "
                   "to come in.")
@click.option("no_prompt_cache", "--no-prompt-cache/--cache-prompt", "--no-cache-prompt", default=False,
              cls=LlamaEnvOption, envvar="LLAMA_ARG_CACHE_PROMPT", negated_env="LLAMA_ARG_NO_CACHE_PROMPT",
              env_inverts=True,
              help="Prefill every prompt whole, instead of reusing the previous answer's KV cache for the "
                   "prefix a prompt repeats (a chat's earlier turns). --no-cache-prompt and --cache-prompt (the "
                   "default) are llama-server's names of it; LLAMA_ARG_CACHE_PROMPT false (or "
                   "LLAMA_ARG_NO_CACHE_PROMPT set) is this option.")
@click.option("--cache-ram", "cache_ram_mib", default=256, show_default=True, type=click.IntRange(min=-1),
              cls=LlamaEnvOption, envvar="LLAMA_ARG_CACHE_RAM",
              metavar="MIB", help="Host memory (MiB) for the KV caches of other conversations, so a chat gets its "
                                  "cache back after the server answered another prompt (0: keep only the last one; "
                                  "-1: no limit, as llama-server's).")
@click.option("--metrics", is_flag=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_ENDPOINT_METRICS",
              help="Serve GET /metrics: Prometheus counters (tokens, compute seconds, requests, thermal level).")
@click.option("--lookup", "lookup_draft", default=0, show_default=True, type=click.IntRange(0, 64), metavar="N",
              help="Prompt lookup decoding: where the last tokens occurred before in the prompt or answer, check up "
                   "to N tokens of what followed them in one pass (fast where the answer copies, e.g. 2x when "
                   "repeating a text; 0: off). Greedy answers can differ at near-ties of a quantized model.")
@click.option("--no-prefill-assistant", is_flag=True, cls=LlamaEnvOption, envvar="LLAMA_ARG_PREFILL_ASSISTANT",
              negated_env="LLAMA_ARG_NO_PREFILL_ASSISTANT", env_inverts=True,
              help="A chat ending with an assistant message gets a new assistant turn after it, instead of the "
                   "answer going on from that message's text (llama-server's option of the same name; "
                   "LLAMA_ARG_PREFILL_ASSISTANT false, or LLAMA_ARG_NO_PREFILL_ASSISTANT set, is this option).")
@click.option("--chat-template-kwargs", "template_kwargs", metavar="JSON", cls=LlamaEnvOption,
              envvar=["LLAMA_ARG_CHAT_TEMPLATE_KWARGS", "LLAMA_CHAT_TEMPLATE_KWARGS"], callback=lambda ctx, param, value:
              read_template_kwargs(value),
              help="Extra variables for the chat template, a JSON object (llama-server's option); a request's "
                   "chat_template_kwargs go over them. E.g. '{\"enable_thinking\": false}' for Qwen3.")
@click.option("--reasoning-format", type=click.Choice(["auto", "none", "deepseek", "deepseek-legacy"]),
              cls=LlamaEnvOption, envvar="LLAMA_ARG_THINK",
              default="auto", show_default=True,
              help="A thinking model's <think> block as the message's reasoning_content (deepseek; auto: where the "
                   "chat template writes one; deepseek-legacy: so, but streamed in the content), or left in the "
                   "content (none), as llama-server's option.")
@click.option("--responses-kept", default=256, show_default=True, type=click.IntRange(0), metavar="N",
              help="Responses POST /v1/responses keeps in memory for previous_response_id and GET "
                   "/v1/responses/{id} (the least recently used go first; 0 keeps none; none survive a restart).")
@click.option("--responses-kept-mib", default=16, show_default=True, type=click.IntRange(0), metavar="MIB",
              help="At most this much JSON of kept responses and their input items.")
@click.option("--reasoning-budget", default=-1, show_default=True, type=click.Choice([-1, 0]), metavar="N",
              cls=LlamaEnvOption, envvar="LLAMA_ARG_THINK_BUDGET",
              help="Thinking allowed: -1 without limit, 0 off (the chat template rendered with enable_thinking "
                   "false unless --chat-template-kwargs or a request's chat_template_kwargs set it), as "
                   "llama-server's option; a token budget in between is not taken.")
@click.option("--pooling", type=PoolingChoice(), default=None, cls=LlamaEnvOption, envvar="LLAMA_ARG_POOLING",
              help="How an embedding pools a text's final hidden states (llama-server's option): last (the last "
                   "token's, what decoder embedding models such as Qwen3-Embedding are trained for), mean (their "
                   "average), cls (the first token's), or none (every token's vector: POST /embedding answers it; "
                   "/v1/embeddings and Ollama's /api/embed refuse it).  [default: as the model declares, else mean]")
@click.option("--batch-size", "-b", "batch_size", default=2048, show_default=True, type=click.IntRange(min=1),
              cls=LlamaEnvOption, envvar="LLAMA_ARG_BATCH",
              metavar="N", help="llama-server's logical batch size, as its code infill (POST /infill, Ollama's "
                                "suffix) uses it: of the code before the cursor the last 3N/4 tokens are kept, of "
                                "the code after it the first N/4 (less the cursor line's and 2), and other files' "
                                "chunks get what the context leaves beyond N and twice --max-new-tokens (prefill "
                                "runs as the backend runs it, whatever N).")
@click.option("--spm-infill", is_flag=True,
              help="Code infill prompts put the suffix before the prefix (llama-server's option, for models "
                   "trained on that order); default: the prefix first.")
@draft_options
@thermal_options
@gate_options
@runtime_options(llama_env=True)
def serve(bundles, models_dir, listen_host, port, api_key, ollama_origins, model_names, max_new_tokens, temperature, top_p, top_k, min_p,
          seed, repeat_penalty, repeat_last_n, samplers, sampling_seq, max_queue, context_shift, keep,
          quiet, client_timeout_s,
          no_prompt_cache, cache_ram_mib, metrics, lookup_draft, no_prefill_assistant, template_kwargs, reasoning_format,
          responses_kept, responses_kept_mib, reasoning_budget, pooling, batch_size, spm_infill, draft_bundle, draft_max, draft_min,
          draft_p_min,
          watch_thermal, simulate_thermal, no_guard, clock_cap, telemetry, ambient, thermal_target, sim_speed,
          entropy_target, compute_budget, gating, threads, backend, target, ignore_target, model):
    """Serve a bundle over an OpenAI-compatible HTTP API (chat and text completions, streamed or whole; also
    OpenAI's POST /v1/responses and /v1/embeddings, Anthropic's POST /v1/messages, Ollama's POST /api/chat,
    /api/generate and /api/embed (serve on --port 11434 for Ollama clients) and llama-server's own routes: POST
    /completion, /infill, /embedding, /tokenize, /detokenize and /apply-template, GET /props, /slots and, with
    --metrics, /metrics).

    One answer is generated at a time (a board decodes batch 1); --watch-thermal guards every step
    as in 'edgesdk run', across requests, and GET /health reports the guard's level.

    Several bundles (or --models-dir) are served one loaded at a time: a request naming another model ('model' in
    its body) waits for the answers before it, then that model is loaded in place of the idle one.

    llama-server's environment variables set the options they set there (LLAMA_ARG_HOST, LLAMA_ARG_PORT,
    LLAMA_ARG_N_PREDICT, LLAMA_ARG_ALIAS, LLAMA_API_KEY, ...: each option below names its own; flags take true, 1,
    on, enabled or false, 0, off, disabled), LLAMA_ARG_MODEL is the BUNDLE where none is given, and
    LLAMA_ARG_CTX_SIZE is taken as -c is; the command line goes over them. One set for an option serve lacks is
    named at start.

    -c N (--ctx-size) up to a bundle's context is the context each model runs with, as llama-server's: /props'
    n_ctx, Ollama's num_ctx default and every bound read it (a prompt past it is refused); 0 is the bundle's own, and
    more than it holds, fixed when it was built, is refused with the rebuild.

    llama-server's options that change nothing here are accepted and said so on stderr (-ngl, -fa, --jinja, --mlock,
    --no-mmap, --no-warmup, -np 1, -cb, -ctk / -ctv f16, --embedding: embeddings are always served, ...); those that
    would change what serve does (-np 4: one answer is generated at a time; --lora: a bundle carries its adapters
    merged at build) are refused by name.
    """
    from edgesdk.runtime.session import open_runtime
    from edgesdk.serve.api import default_seed
    from edgesdk.serve.completion import Completer, ServeDefaults
    from edgesdk.serve.http_server import ApiServer
    from edgesdk.serve.ollama import parse_origins
    from edgesdk.serve.openai_answer import served_model_name

    try:
        # as llama-server's common/arg.cpp reads them: -n below 0 no limit but the context, --temp below 0
        # greedy (std::max(temp, 0)), --top-k below 0 off (llama_sampler_top_k: k <= 0 keeps every token)
        defaults = ServeDefaults(max_tokens=max_new_tokens,
                                 temperature=0.0 if temperature < 0 else temperature, top_p=top_p, top_k=max(top_k, 0),
                                 min_p=min_p, seed=default_seed(seed), repeat_penalty=repeat_penalty,
                                 repeat_last_n=repeat_last_n,
                                 max_waiting=max_queue, prompt_cache=not no_prompt_cache,
                                 cache_ram_mib=cache_ram_mib, lookup=lookup_draft,
                                 prefill_assistant=not no_prefill_assistant, reasoning_format=reasoning_format,
                                 reasoning_budget=reasoning_budget, responses_kept=responses_kept,
                                 responses_kept_bytes=responses_kept_mib << 20, pooling=pooling,
                                 batch_size=batch_size, spm_infill=spm_infill, context_shift=context_shift,
                                 n_keep=keep, **sampler_chain(samplers, sampling_seq))
    except ValueError as exc:
        options = {**SAMPLING_OPTIONS, "repeat_penalty": "'--repeat-penalty'"}
        with told_from_env(*options):  # each may come from its LLAMA_ARG_* variable
            raise bad_sampling_option(exc, options) from exc
    with told_from_env("api_key"):
        api_keys = _api_keys(api_key)
    origins = parse_origins(ollama_origins)
    bundles = _bundle_from_env(_with_model_option(bundles, model))
    with told_from_env("models_dir"):
        in_models_dir = _bundles_in(models_dir) if models_dir is not None else []
    paths = _distinct([*bundles, *in_models_dir])
    # a bundle --models-dir found is served under its directory's name (not given as BUNDLE too): _served_models
    given = {Path(path).resolve() for path in bundles}
    by_directory = {path for path in paths if path in in_models_dir and path.resolve() not in given}
    if not paths:
        raise click.UsageError("give the BUNDLE to serve (several are served one loaded at a time), or --models-dir "
                               "DIR holding bundles")
    _check_ctx_size(paths)
    keep_alive_s = _idle_unload_s(len(paths) > 1)
    with told_from_env("model_names"):
        _named(model_names)
    with told_from_env("listen_host"):
        _refuse_empty_host(listen_host)
        _refuse_padded_host(listen_host)
        _refuse_url_or_port(listen_host)
        _refuse_unix_socket(listen_host)
    several, model_name = None, None
    if len(paths) > 1:
        with told_from_env("draft_bundle", "entropy_target", "compute_budget", "gating"):  # or their variables
            _refuse_for_several(draft_bundle, entropy_target, compute_budget, gating, paths)
        with told_from_env("model_names"):  # an --alias refused may be LLAMA_ARG_ALIAS's
            several = _served_models(paths, model_names, by_directory)
    elif paths[0] in by_directory and not model_names:
        model_name = paths[0].name
    elif model_names:  # one bundle: the last name given, as before; NAME=BUNDLE where it names that bundle
        model_name = model_names[-1]
        if "=" in model_name:
            with told_from_env("model_names"):
                model_name = _aliased(model_name, paths, [path.resolve() for path in paths])[0]
    warn_unused_thermal_options(watch_thermal, simulate_thermal, telemetry, no_guard=no_guard, clock_cap=clock_cap,
                                ambient=ambient, sim_speed=sim_speed, thermal_target=thermal_target)
    # llama-server would act on them: said, not ignored silently (LLAMA_ARG_CTX_SIZE is checked as -c is)
    say_unread_llama_env("llama-server", MODEL_ENV, CTX_SIZE_ENV)
    if no_prompt_cache and option_given("cache_ram_mib"):
        click.echo("edgesdk: --cache-ram is not used: --no-prompt-cache keeps no KV cache between requests", err=True)
    warn_unused_draft_options(draft_bundle)
    _check_can_listen(listen_host, port)  # before anything loads, as llama-server listens before it loads its model
    # A service manager's stop (SIGTERM; SIGHUP unless nohup ignores it) ends the server as Ctrl-C does:
    # through the finally below, which lets the answer being generated end and tell its client why.
    exit_on_stop_signals()
    bundle = paths[0]
    # named where its notes stand beside another bundle's: a server's several models, or a draft bundle's
    runtime = open_runtime(bundle, backend=backend, threads=threads, expected_target=target,
                           ignore_target=ignore_target, verbose=True,
                           name=several[0][0] if several else str(bundle) if draft_bundle is not None else None)
    runtime.tokenizer.template_kwargs = template_kwargs
    server_defaults, defaults = defaults, _with_model_defaults(defaults, runtime.bundle.manifest,
                                                               several[0][0] if several else None)
    configure_gates(runtime.backend, entropy_target, compute_budget, gating, bundle=runtime.bundle.path)
    # the draft's notes are said as the bundle's are (its backend, its context: the bundle's -c holds it too)
    with told_from_env("draft_bundle", "draft_min", "draft_max"):  # each may come from LLAMA_ARG_SPEC_DRAFT_*
        draft = draft_model(draft_bundle, runtime, draft_max, draft_min, draft_p_min, threads, target, ignore_target,
                            lookup_draft, verbose=True)
    lookup_config(runtime.backend, lookup_draft)  # says so where the backend cannot draft (the completer decodes then)
    thermal = open_thermal(runtime, watch_thermal, simulate_thermal, no_guard, clock_cap, telemetry, ambient,
                           thermal_target, sim_speed, status=False)
    if thermal is not None and thermal.hook.guard is not None:  # a line on stderr when the guard paces or pauses
        thermal.hook.status = ThermalChanges(thermal.hook)
    try:
        hook = thermal.hook if thermal else None
        completer = Completer(runtime, defaults, hook=hook, draft=draft)
        name = model_name or served_model_name(runtime.bundle.manifest)
        pool, backend_name = None, runtime.backend.name
        if several is not None:
            name = several[0][0]
            pool = _model_pool(several, runtime, completer, server_defaults, hook, template_kwargs, lookup_draft,
                               backend=backend, threads=threads, target=target, ignore_target=ignore_target,
                               keep_alive_s=keep_alive_s)
        try:
            server = ApiServer((listen_host, port), completer, name, api_key=api_keys, log=not quiet,
                               client_timeout_s=float(client_timeout_s),
                               metrics=metrics, pool=pool, ollama_origins=origins)
        except OSError as exc:
            raise listen_error(exc, listen_host, port) from exc
        if pool is not None:  # the pool holds the first model from here on: a swap gives back its ONNX Runtime
            runtime = completer = None  # session and weights only where nothing else keeps it
        served = name if pool is None else ", ".join(pool.models)
        loaded = "" if pool is None else f"; {name} loaded, one model at a time"
        click.echo(f"edgesdk serve: {served} on {server.url}/v1 ({backend_name}{loaded}"
                   f"{', API key required' if api_key else ''}); Ctrl-C stops", err=True)
        try:
            with stops_noted_by(server):
                server.serve_forever()
        except KeyboardInterrupt:
            click.echo("edgesdk serve: stopped", err=True)
        finally:
            try:  # the answers end before the thermal session closes: no guard step after its clock cap is given back
                answering = server.completer
                if answering is not None and answering.busy:
                    click.echo("edgesdk serve: stopping the answer being generated (Ctrl-C again stops at once)",
                               err=True)
                if not server.stop_answers(timeout=SERVE_STOP_WAIT_S):
                    click.echo(f"edgesdk serve: an answer did not end within {SERVE_STOP_WAIT_S} s of the stop; "
                               "its connection is cut", err=True)
            finally:
                server.server_close()
    finally:
        if thermal is not None:
            thermal.close()


class ThermalChanges:
    """``serve``'s thermal status on stderr: the line ``run`` prints to a log (the hook's status text under
    ``edgesdk thermal:``, :class:`~edgesdk.thermal.telemetry.StatusLine`'s log mode), here only when the guard's level
    or its pause changes: the guard paced or paused a request with nothing said (a 5-token answer at 93 °C took 10 s),
    while ``run``'s log prints every 10 s and after each answer, which a server's log would take one line a request
    of. The line goes out at the first record after the change (the hook records a wait at least every second), so a
    board that heated or cooled while the server was idle is said when the next request reads it (``/health`` says it
    at once). A sensor's failure is said by the guard's own warning, once (:meth:`~edgesdk.thermal.guard.Guard._sensor_failed`).
    Set as the session's hook's ``status``, the StepHook's status line, which the session closes."""

    def __init__(self, hook, file=None):
        self.guard, self.file = hook.guard, file  # file: stderr by default
        self._state = self._now()  # the guard's before any request: normal, not paused

    def _now(self) -> tuple:
        return self.guard.level, self.guard.paused

    def update(self, text: str, level: str | None = None, force: bool = False, paused: bool | None = None,
               streams: bool = False) -> None:
        """The hook's status after a record (StatusLine.update's arguments, read from the guard itself here): printed
        where the level or the pause changed since the last line."""
        state = self._now()
        if state == self._state:
            return
        self._state = state
        try:  # a stderr that refuses the line (a full disk, a reader gone) does not fail the request generating
            click.echo(f"edgesdk thermal: {text}", file=self.file, err=self.file is None)
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        """Nothing to clear: no live line is drawn."""


@contextlib.contextmanager
def stops_noted_by(server) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP noted by the server while it serves (``ApiServer.take_stop_signal``: its loop ends
    at its next turn, never inside a lock), the handlers before put back after: a second Ctrl-C while the answers
    end stops at once. A signal the process was started ignoring (SIGHUP under nohup, SIGINT in a background job)
    stays ignored."""
    import signal

    before = {stop: signal.getsignal(stop) for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for stop, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(stop, server.take_stop_signal)
    try:
        yield
    finally:
        for stop, handler in before.items():
            signal.signal(stop, signal.SIG_DFL if handler is None else handler)  # None: not set from Python


MODEL_ENV = "LLAMA_ARG_MODEL"  # llama-server's -m (common/arg.cpp ``set_env("LLAMA_ARG_MODEL")``)


def _with_model_option(bundles: tuple[Path, ...], model: Path | None) -> tuple[Path, ...]:
    """The BUNDLEs with llama-server's ``-m / --model PATH`` (common/arg.cpp: the model path): the bundle served
    where no BUNDLE is given; beside BUNDLEs only where it is one of them (given twice), else refused, as
    llama-server serves the one model -m names."""
    if model is None or not bundles:
        return bundles if model is None else (model,)
    if all(Path(bundle).resolve() != Path(model).resolve() for bundle in bundles):
        raise click.BadParameter(f"names {str(model)!r}, which is none of the BUNDLEs given "
                                 f"({', '.join(map(str, bundles))}): give each bundle once, as BUNDLE (several are "
                                 "served one loaded at a time) or one as -m BUNDLE", param_hint="'--model' / '-m'")
    return bundles


def _check_ctx_size(paths: list[Path]) -> None:
    """llama-server's ``-c N`` against each bundle's context (graph.max_context in its manifest), before any loads
    (:func:`edgesdk.cli_llama.checked_ctx_size`), and LLAMA_ARG_CTX_SIZE, the environment's ``-c`` (common/arg.cpp),
    as ``-c`` is where the command line has none (:func:`edgesdk.cli_llama.checked_ctx_size_env`): 0 is each bundle's
    own context, N up to it the context each model is loaded with while the server runs, as llama-server's ``-c``
    sizes its context (/props' ``n_ctx``, Ollama's ``num_ctx`` default and every bound follow it), more refused with
    the rebuild command; ``-c`` on the command line goes over the variable, which is said, as llama.cpp warns."""
    context = click.get_current_context()
    given = context.meta.get("edgesdk.llama.ctx_size")
    if given is None and not os.environ.get(CTX_SIZE_ENV):
        return
    from edgesdk.bundle import read_manifest
    from edgesdk.runtime.session import context_limits

    limits = {}
    for path in paths:
        max_context = read_manifest(path).get("graph", {}).get("max_context")
        if isinstance(max_context, int):
            checked_ctx_size_env(max_context, path)
            if (size := checked_ctx_size(max_context, path)) < max_context:
                limits[path] = size
    if limits:  # every load of these bundles while the server runs (open_runtime), the first and those on request
        context.with_resource(context_limits(limits, ctx_size_source()))  # -c or LLAMA_ARG_CTX_SIZE, as named
    if given is not None and (note := ctx_size_env_note(0, paths[0])) is not None:
        click.echo(f"edgesdk: {note}", err=True)


def _bundle_from_env(bundles: tuple[Path, ...]) -> tuple[Path, ...]:
    """The BUNDLEs to serve: those given, else LLAMA_ARG_MODEL's path, as llama-server takes its -m from it where the
    command line has none (a Docker image or a systemd unit configured through the environment alone); a BUNDLE or
    -m on the command line goes over it, which is said naming the one given, as llama.cpp warns."""
    from_env = os.environ.get(MODEL_ENV)
    if not from_env:
        return bundles
    if bundles:
        say_model_env_overridden("bundles")
        return bundles
    return (Path(from_env),)


def _with_model_defaults(defaults, manifest: dict, name: str | None = None):
    """``defaults`` with the model's own sampling settings (the bundle's ``generation`` section) for each option not
    given, as llama-server takes a GGUF file's general.sampling keys for its defaults (common/common.cpp,
    common_init_sampler_from_model); said on stderr (with several bundles, after the model's ``name``). A request's
    fields go over either."""
    from edgesdk.models.generation_defaults import with_model_defaults

    defaults, line = with_model_defaults(defaults, manifest, sampling_option_given)
    if line is not None:
        click.echo(f"edgesdk serve: {f'{name}: ' if name else ''}{line}", err=True)
    return defaults


def _bundles_in(directory: Path) -> list[Path]:
    """``--models-dir DIR``: the bundle directories directly in DIR (a directory holding a manifest.json, as 'edgesdk
    verify' reads one), by name; anything else there is skipped with a note (names starting with a dot silently). A
    DIR that is a bundle itself (``--models-dir BUNDLE``, llama-server's -m mistaken for it) is refused as one."""
    from edgesdk.bundle import MANIFEST

    if not directory.is_dir():
        raise click.BadParameter(f"{directory} is not a directory; pass the folder whose subdirectories are bundles",
                                 param_hint="'--models-dir'")
    if (directory / MANIFEST).is_file():  # a bundle itself, not a folder of bundles: its files are no bundles
        raise click.BadParameter(f"{directory} is a bundle itself (it holds {MANIFEST}), not a folder of bundles; "
                                 f"serve it as BUNDLE (or -m {directory}), or pass the folder that holds it "
                                 f"({directory.resolve().parent}) to --models-dir", param_hint="'--models-dir'")
    found = []
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and (entry / MANIFEST).is_file():
            found.append(entry)
            continue
        why = "an archive: unpack it with 'edgesdk unpack ARCHIVE DIR' to serve it" if entry.is_file() and \
            ".tar" in entry.name else f"not a bundle directory (no {MANIFEST})"
        click.echo(f"edgesdk serve: --models-dir: {entry} skipped: {why}", err=True)
    if not found:
        raise EdgeSDKError(f"--models-dir {directory} holds no bundle (a directory with a {MANIFEST})",
                           f"build or deploy bundles into it (edgesdk build --out {directory}/NAME), or pass a bundle's "
                           "path as BUNDLE")
    return found


def listen_error(exc: OSError, listen_host: str, port: int) -> EdgeSDKError:
    """Why ``edgesdk serve`` cannot listen on ``listen_host:port`` (the bind's ``exc``), with the fix that fits it: an
    address this machine lacks (a host name not found, EADDRNOTAVAIL) or cannot listen on (EINVAL: a multicast
    address, a link-local one with no zone or another interface's, which told "pick another --port" for a port that
    was not at fault) wants another --host; a port taken (EADDRINUSE) another --port or the listener stopped; a
    port refused (EACCES) is one below the first port an unprivileged user may bind (1024, Linux's
    net.ipv4.ip_unprivileged_port_start), which needs root or CAP_NET_BIND_SERVICE, as llama-server's bind fails
    there too ("couldn't bind HTTP server socket"): another port, not a port "taken"."""
    import errno
    import socket

    shown = f"[{listen_host.strip('[]')}]" if ":" in listen_host else listen_host
    if isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
        fix = "pass an address of this machine to --host (127.0.0.1; 0.0.0.0 or :: for every interface)"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        first = _first_unprivileged_port()
        fix = (f"ports below {first} need root or the CAP_NET_BIND_SERVICE capability: pass --port {first} or above "
               f"(8080 is llama-server's; 0 takes a free one) and point clients or a reverse proxy at it, or grant "
               f"this Python the capability (sudo setcap cap_net_bind_service=+ep \"$(readlink -f \"$(command -v "
               f"python3)\")\"), or lower net.ipv4.ip_unprivileged_port_start with sysctl")
    else:
        fix = "pick another --port (0 takes a free one), or stop what listens there"
    return EdgeSDKError(f"cannot listen on {shown}:{port} ({exc.strerror or exc})", fix)


def _check_can_listen(listen_host: str, port: int) -> None:
    """Bind ``listen_host:port`` once, as the server binds it (the family and address
    :func:`~edgesdk.serve.http_server.listen_address` gives, the address reused), and let it go, before any bundle
    is verified or loaded: a port taken, an address this machine lacks or a port below 1024 was told only once
    every model had been verified and the first loaded, seconds to minutes on a board, where llama-server binds its
    socket first and fails at once (tools/server/server.cpp: the HTTP context starts before ``load_model``). The
    server's own bind, after the load, is still checked (:func:`listen_error`), for a port taken meanwhile."""
    import socket

    from edgesdk.serve.http_server import listen_address

    family, address = listen_address(listen_host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise listen_error(exc, listen_host, port) from exc


def _first_unprivileged_port() -> int:
    """The first port an unprivileged process may bind: Linux's net.ipv4.ip_unprivileged_port_start, else 1024."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    except (OSError, ValueError):
        return 1024


# The characters no HTTP header value carries (RFC 9110 §5.5: a field value is visible characters, spaces and tabs,
# and bytes from 0x80 up): the other control characters, NUL, CR and LF among them, which clients refuse to send
HEADER_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
NEW_KEY = "python -c 'import secrets; print(secrets.token_urlsafe())'"


def _api_keys(api_key: str | None) -> tuple[str, ...] | None:
    """``--api-key`` as its keys: llama-server's comma-separated list (common/arg.cpp: "multiple keys can be provided
    as a comma-separated list", empty entries dropped; 'a,b' taken as one key was a 401 for every request of a
    llama-server setup), each stripped. A key is taken as llama-server takes it, non-ASCII and inner spaces too (the
    server compares the UTF-8 bytes a client sends: serve/http_server.py); refused are only a key with a character
    no header can carry (:data:`HEADER_FORBIDDEN`), and one with no UTF-8 form (bytes of another encoding on the
    command line, which Python reads as lone surrogates), which no request could match. The key is never shown."""
    if api_key is None:
        return None
    keys = tuple(key.strip() for key in api_key.split(",") if key.strip())
    if not keys:
        raise click.BadParameter("is empty; pass a key (or several, comma-separated), or leave --api-key out to "
                                 "serve without one", param_hint="'--api-key'")
    for number, key in enumerate(keys, 1):
        bad = HEADER_FORBIDDEN.search(key)
        if bad is not None:
            raise click.BadParameter(f"key {number} of {len(keys)} holds the control character U+{ord(bad[0]):04X} "
                                     f"at character {bad.start() + 1}, which no HTTP header can carry, so no request "
                                     f"could send it; pick another key, e.g. from: {NEW_KEY}", param_hint="'--api-key'")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise click.BadParameter(f"key {number} of {len(keys)} is not UTF-8 text (a byte of another encoding at "
                                     f"character {exc.start + 1}), and a request's header is matched as UTF-8; pass "
                                     f"the key in UTF-8, or pick another, e.g. from: {NEW_KEY}",
                                     param_hint="'--api-key'") from None
    return keys


def _named(model_names: tuple[str, ...]) -> None:
    """``--model-name`` (``--alias``, LLAMA_ARG_ALIAS): a blank name refused."""
    if any(not name.strip() for name in model_names):
        raise click.BadParameter("is empty; pass the id the API should report, or leave --model-name out for "
                                 "<model>-<target> from the bundle's manifest", param_hint="'--model-name'")


def _refuse_empty_host(listen_host: str) -> None:
    """An empty (or blank) --host is refused: Python's socket binds "" to every interface (INADDR_ANY), as
    llama-server's cpp-httplib does (an empty host passes no node to getaddrinfo with AI_PASSIVE), so ``--host
    "$HOST"`` with the variable unset served the model to the whole network where the default is this machine only,
    and the start line named no host ("http://:8080"). Every interface is asked for by name."""
    if not listen_host.strip():
        raise click.BadParameter(f"{listen_host!r} is empty: an empty host would listen on every interface; pass "
                                 "127.0.0.1 (the default) for this machine only, or 0.0.0.0 (or :: for IPv6 too) for "
                                 "every interface", param_hint="'--host'")


def _refuse_padded_host(listen_host: str) -> None:
    """A --host with spaces around it (``LLAMA_ARG_HOST="127.0.0.1 "`` from an env file) is refused by name: the
    socket looks the whole text up as a host name, which failed only once the model had loaded, as "Name or service
    not known" with the fix "pass an address of this machine", for an address that was one."""
    if listen_host != listen_host.strip():
        raise click.BadParameter(f"{listen_host!r} has spaces around the address, which no address or host name "
                                 f"holds; pass it without them: --host {listen_host.strip()}", param_hint="'--host'")


def _refuse_url_or_port(listen_host: str) -> None:
    """A --host that is a URL (``http://127.0.0.1:8080``) or an address with a port (``127.0.0.1:8080``,
    ``localhost:8080``, ``[::1]:8080``) is refused naming the --host and --port it meant, before anything loads: a
    host holding a ':' was bound as an IPv6 address once the model had loaded, and failed as "cannot listen on
    [127.0.0.1:8080]:0 (Name or service not known)"; a URL was refused as "a unix socket path". llama-server's bind
    fails on both too (cpp-httplib passes the host to getaddrinfo and the port apart). A socket's path (ending in
    ``.sock``, or starting as a path does: ``/run/llama:1.sock``) is left to :func:`_refuse_unix_socket`."""
    from urllib.parse import urlsplit

    if listen_host.endswith(".sock") or listen_host.startswith(SOCKET_PATH_STARTS):
        return
    if "://" in listen_host:
        text, what = listen_host, "a URL"
    elif ":" in listen_host and not _is_ip_address(listen_host):
        text, what = "//" + listen_host, "an address with a port"
    else:
        return
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # "[::1" ("Invalid IPv6 URL"), or no IP address in the brackets ("[myhost]:8080")
        if "[" not in listen_host and "]" not in listen_host:  # characters NFKC makes '/', '?', '#', '@' or ':'
            raise click.BadParameter(f"{listen_host!r} is no address or host name: {exc}; pass an address of this "
                                     "machine (127.0.0.1; 0.0.0.0 or :: for every interface)",
                                     param_hint="'--host'") from None
        raise click.BadParameter(f"{listen_host!r} has a malformed bracket: '[' and ']' go around an IPv6 address, "
                                 "both of them, and only with a port after them ([::1]:8080); --host takes the address "
                                 "alone (--host ::1) and --port the port", param_hint="'--host'") from None
    try:
        port = parts.port
    except ValueError:  # "myhost:abc": no port number after the ':'
        port = None
    and_port = f" --port {port}" if port is not None else ""
    if parts.hostname:
        meant = f"--host {parts.hostname}{and_port}"
    else:  # "http:///x", ":8080": no address named, none to guess
        meant = ("an address of this machine to --host (127.0.0.1 for this machine only; 0.0.0.0 or :: for every "
                 f"interface){' and' + and_port if and_port else ''}")
    raise click.BadParameter(f"{listen_host!r} is {what}; --host takes the address alone and --port the port: pass "
                             f"{meant}", param_hint="'--host'")


def _is_ip_address(host: str) -> bool:
    """Whether ``host`` is an IP address (an IPv6 one in brackets too, with a zone: ``fe80::1%eth0``)."""
    import ipaddress

    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return False
    return True


SOCKET_PATH_STARTS = ("/", "./", "../", "~")  # a --host that is a file's path


def _refuse_unix_socket(listen_host: str) -> None:
    """llama-server takes a --host ending in ``.sock`` for a unix socket's path and listens there (tools/server/
    server-http.cpp ``server_http_context::start``: ``string_ends_with(hostname, ".sock")`` -> ``AF_UNIX``); this
    server listens on TCP only. Such a host (or a path: one starting with '/', './', '../' or '~') was looked up as a
    host name once the model had loaded, and refused as "Name or service not known" with a fix that said nothing of
    sockets: it is refused by name here, before anything loads. Another '/' (a network, ``192.168.1.0/24``; a path
    after a name, ``localhost/v1``), which no address holds either, is refused as such, not called a socket."""
    if "/" in listen_host and not listen_host.endswith(".sock") and not listen_host.startswith(SOCKET_PATH_STARTS):
        raise click.BadParameter(f"{listen_host!r} holds a '/', which no address or host name does (a network such as "
                                 "192.168.1.0/24 is no address to listen on); pass the one address of this machine "
                                 "to listen on (127.0.0.1; 0.0.0.0 or :: for every interface)", param_hint="'--host'")
    if listen_host.endswith(".sock") or "/" in listen_host:
        raise click.BadParameter(f"{listen_host!r} is a unix socket path (llama-server listens on one for a --host "
                                 "ending in .sock); edgesdk serve listens on TCP only: pass an address of this "
                                 "machine (127.0.0.1; 0.0.0.0 or :: for every interface) and a --port, and point the "
                                 "client (or a reverse proxy such as nginx or socat) at it", param_hint="'--host'")


def _distinct(paths: list[Path]) -> list[Path]:
    """``paths`` with each bundle once, where it first comes: a BUNDLE that --models-dir holds too (given first so
    that it is the one loaded at start, as --models-dir's help says) is one model, not two bundles served under one
    name (which was refused, with a fix, ``--alias NAME=BUNDLE``, that named both at once and was refused too);
    the same for a bundle given twice, or through a symlink (``Path.resolve``)."""
    seen: set[Path] = set()
    kept = []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            kept.append(path)
    return kept


def _refuse_for_several(draft_bundle, entropy_target, compute_budget, gating, paths: list[Path]) -> None:
    """The options that work with one bundle only, given with the bundles ``paths``, each gate option refused naming
    only those typed (``--no-gating`` alone is taken: every model's gates are off when several are served)."""
    if draft_bundle is not None:
        # a draft model is checked against one target's tokenizer, and would take a second model's memory beside
        # each one swapped in
        raise click.BadParameter("drafts for one model, whose tokenizer it must share: serve that bundle alone with "
                                 "--draft, or leave --draft out (--lookup N drafts for every model)",
                                 param_hint="'--draft'")
    options = gate_options_given(entropy_target, compute_budget, gating or None)  # --no-gating: each model's anyway
    if options:
        names = [option.split()[0] for option in options]
        raise click.BadParameter(f"{', '.join(options)}: {'steers' if len(options) == 1 else 'steer'} the power gates "
                                 f"of one bundle, and {len(paths)} are served ({', '.join(map(str, paths))}): serve "
                                 f"the bundle built with the power stage (edgesdk build --target T --recipe power) "
                                 f"alone with {' and '.join(names)}, or drop {' and '.join(names)} to serve several "
                                 "(each model's gates are then off)",
                                 param_hint=", ".join(f"'{name}'" for name in names))


def _served_models(paths: list[Path], aliases: tuple[str, ...],
                   by_directory: set[Path] | frozenset[Path] = frozenset()) -> list[tuple[str, Path]]:
    """Each bundle's served name and path: ``<model>-<target>`` from its manifest for a bundle given as BUNDLE, the
    name of its directory for one found through --models-dir (``by_directory``), as llama-server's router names each
    model in its --models-dir after its file or subdirectory, so that two builds of one model (``tiny-llama-host``
    twice) in one folder are served side by side, each under its folder's name; or an ``--alias NAME=BUNDLE``.
    Every bundle's manifest is checked as ``edgesdk run`` checks it, every graph and model fact, before any is loaded
    (one that cannot be run refuses the server's start; the files are verified at start too, the first's when it is
    loaded, the others' before the server listens). Two bundles under one name are refused, also under two names a request cannot tell apart (:func:`~edgesdk.serve.model_pool.ollama_key`: ones
    that differ in case alone, ``NAME`` and ``NAME:latest``, or ``library/NAME``), as Ollama keeps one model per such
    name (server/
    routes.go ``getExistingName``)."""
    from edgesdk.bundle import Bundle, check_runnable, read_manifest
    from edgesdk.serve.model_pool import ollama_key
    from edgesdk.serve.openai_answer import served_model_name

    manifests = [read_manifest(path) for path in paths]
    for path, manifest in zip(paths, manifests, strict=True):  # every bundle checked as run checks it, not only a name
        check_runnable(Bundle(path, manifest))
    names = [path.name if path in by_directory else served_model_name(manifest)
             for path, manifest in zip(paths, manifests, strict=True)]
    resolved = [path.resolve() for path in paths]
    renamed: dict[int, str] = {}
    for alias in aliases:
        name, index = _aliased(alias, paths, resolved)
        if index in renamed:
            raise click.BadParameter(f"{alias!r}: {paths[index]} is renamed twice (as {renamed[index]!r} first); "
                                     "give one --alias for it", param_hint="'--alias'")
        renamed[index] = name
    names = [renamed.get(index, name) for index, name in enumerate(names)]
    keys = [ollama_key(name) for name in names]  # names a request matches as Ollama does (case, tag, namespace)
    for index, name in enumerate(names):
        first = keys.index(keys[index])
        if first != index:
            same = f"as {name!r}" if names[first] == name else \
                f"as {names[first]!r} and {name!r}, one name to a client (Ollama matches a model's name in any case " \
                "and reads NAME as registry.ollama.ai/library/NAME:latest)"
            raise EdgeSDKError(f"two bundles are served {same}: {paths[first]} and {paths[index]} (a request "
                               "names the model it wants by that name)",
                               f"rename one with --alias NAME={paths[index]}, or serve only one of them")
    return list(zip(names, paths, strict=True))


def _aliased(alias: str, paths: list[Path], resolved: list[Path]) -> tuple[str, int]:
    """An ``--alias NAME=BUNDLE``'s name and the index of the bundle it names among ``paths`` (``resolved``: theirs
    resolved), by its path or, without a slash, by its directory's name (a bundle in --models-dir)."""
    name, equals, where = alias.partition("=")
    if not equals or not name.strip() or not where:
        raise click.BadParameter(f"{alias!r}: with several bundles each --alias is NAME=BUNDLE (and with one, an "
                                 "--alias holding '=' is), the name one bundle is served under, e.g. --alias "
                                 f"'mymodel={paths[0]}'", param_hint="'--alias'")
    matches = [index for index, path in enumerate(resolved) if path == Path(where).resolve()] or \
        [index for index, path in enumerate(paths) if "/" not in where and path.name == where]
    if len(matches) != 1:
        raise click.BadParameter(f"{alias!r}: {where!r} is {'none' if not matches else 'more than one'} of the "
                                 f"bundles served ({', '.join(map(str, paths))}); give its path as served, or the "
                                 "name of its directory in --models-dir", param_hint="'--alias'")
    return name.strip(), matches[0]


def _idle_unload_s(several: bool) -> float:
    """How long a served model stays loaded idle where a request gives no ``keep_alive`` (seconds; ``math.inf``: kept
    loaded, edgesdk's default): llama-server's ``--sleep-idle-seconds N`` (-1: never), else Ollama's
    OLLAMA_KEEP_ALIVE (a Go duration or seconds; negative: never), as ``ollama serve`` reads it. A board's memory
    holds one model: with several bundles served, an idle one then goes and frees it, and a request naming a model
    loads it again. A server of one bundle keeps its model loaded while it runs (it has no other to make room for,
    and nothing here reloads it), and a finite value is said to change nothing there rather than taken silently;
    its /api/ps says so (``expires_at`` Ollama's far-off time). An OLLAMA_KEEP_ALIVE that is no duration is refused
    only with several bundles (where it would decide when a model goes); with one it is said to be ignored."""
    from edgesdk.serve.ollama import KEEP_ALIVE_ENV, keep_alive_from_env

    context = click.get_current_context(silent=True)
    given = None if context is None else context.meta.get("edgesdk.llama.sleep_idle_seconds")
    if given is not None:
        flag, seconds = given
        idle_s, source = (math.inf if seconds < 0 else float(seconds)), f"{flag} {seconds}"
    else:
        text = os.environ.get(KEEP_ALIVE_ENV)
        try:
            idle_s = keep_alive_from_env(text)
        except EdgeSDKError as exc:
            if several:
                raise
            # one bundle: the value changes nothing, so another program's variable does not stop this server
            click.echo(f"edgesdk serve: {exc.problem}; it is ignored: with one bundle served its model stays loaded "
                       "while the server runs", err=True)
            return math.inf
        if idle_s is None:
            return math.inf
        source = f"{KEEP_ALIVE_ENV}={text.strip()}"
    if not several and not math.isinf(idle_s):
        click.echo(f"edgesdk serve: {source} changes nothing with one bundle served: its model stays loaded while the "
                   "server runs (serve several bundles, or --models-dir DIR, to have an idle one unloaded)", err=True)
    return idle_s


def _model_pool(several: list[tuple[str, Path]], runtime, completer, defaults, hook, template_kwargs, lookup_draft: int,
                backend, threads, target, ignore_target, keep_alive_s: float = math.inf):
    """The models of a server with several bundles: the first loaded (``runtime``, ``completer``), the others verified
    now (hashes, target) and loaded when a request names one, each with its own sampling defaults and the server's
    options; one thermal hook for all. ``keep_alive_s``: how long a model stays loaded idle where a request gives no
    ``keep_alive`` (:func:`_idle_unload_s`). A swap verifies the bundle's files again before the loaded model is
    unloaded (serve/model_pool.py), so ``load`` opens a bundle that matched its hashes a moment before."""
    from edgesdk.bundle import check_runnable, verify_bundle
    from edgesdk.runtime.backend import close_backend
    from edgesdk.runtime.session import check_target, open_runtime
    from edgesdk.serve.completion import Completer
    from edgesdk.serve.model_pool import ModelPool, ServedModel, described

    models = [ServedModel(several[0][0], runtime.bundle)]
    settings = {several[0][0]: completer.defaults}
    for name, path in several[1:]:
        bundle = verify_bundle(path)
        check_runnable(bundle)
        note = check_target(bundle, target, ignore_target)
        if note:
            click.echo(f"edgesdk: {name}: {note}", err=True)
        models.append(ServedModel(name, bundle))
        settings[name] = _with_model_defaults(defaults, bundle.manifest, name)

    def load(model: ServedModel) -> Completer:
        opened = open_runtime(model.bundle.path, backend=backend, threads=threads, expected_target=target,
                              ignore_target=ignore_target, name=model.name)
        try:
            opened.tokenizer.template_kwargs = template_kwargs
            configure_gates(opened.backend, None, None, None)  # the gates off: their options take one bundle only
            lookup_config(opened.backend, lookup_draft)  # says so where this backend cannot draft
            return Completer(opened, settings[model.name], hook=hook)
        except BaseException:
            # refused once opened (a manifest's pooling that is none): its ONNX Runtime session and weights go now,
            # not with the traceback that the pool's 500 keeps as its cause
            close_backend(opened.backend)
            raise

    def describe(model: ServedModel) -> Completer:  # the model's tokenizer and settings, nothing loaded
        return described(model.bundle, settings[model.name], template_kwargs)

    return ModelPool(models, load, completer, describe=describe, keep_alive_s=keep_alive_s)
