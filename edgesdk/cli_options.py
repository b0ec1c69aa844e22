"""The options ``run`` and ``serve`` share (and ``--threads`` / ``--backend`` / ``--target``, which ``eval`` and
``bench`` take too), with the code that acts on them: the sampler chain, a draft bundle or prompt lookup, the
thermal guard, the power gates; and the small pieces several commands use (:func:`option_given`,
:func:`exit_on_stop_signals`, :func:`echo_json`). The commands are registered in :mod:`edgesdk.cli`.

Importing this module imports click only; the runtime loads inside the functions that use it.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from edgesdk.api_checks import (
    GATE_TERMS,
    RANDOM_SEED_VALUE,
    GateArgumentError,
    llama_seed,
    load_threads,
    token_count,
)
from edgesdk.api_checks import configure_gates as apply_gates
from edgesdk.cli_llama import LlamaEnvOption, typed_option
from edgesdk.cli_thermal import AMBIENT, FiniteRange


def _stacked(fn, options: list):
    """``fn`` under ``options`` in the order listed, as the same decorators written above it one by one would
    put them (click lists a command's options from the top decorator down)."""
    for option in reversed(options):
        fn = option(fn)
    return fn


def option_given(name: str) -> bool:
    """Whether the running command's option ``name`` (its parameter name) was given, on the command line or
    through its environment variable, rather than left at its default."""
    context = click.get_current_context(silent=True)
    return context is not None and \
        context.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def sampling_option_given(name: str) -> bool:
    """Whether the sampling field ``name`` was set by an option of the running command (``samplers``: by
    --samplers or --sampling-seq), for :func:`edgesdk.models.generation_defaults.with_model_defaults`."""
    if name == "samplers":
        return option_given("samplers") or option_given("sampling_seq")
    return option_given(name)


def sampler_chain_options(fn):
    """llama.cpp's options for the sampler chain's order (common/arg.cpp)."""
    return _stacked(fn, [
        click.option(
            "--samplers", metavar="NAMES",
            help="The sampler chain in order, names separated by ';' as llama.cpp's --samplers [default: "
                 "penalties;top_k;top_p;min_p;temperature]; one left out does not run (without temperature the draw "
                 "is at 1). infill is llama.cpp's infill sampler; dry, typ_p, top_n_sigma and xtc pass everything "
                 "through."),
        click.option(
            "--sampling-seq", "--sampler-seq", "sampling_seq", metavar="LETTERS",
            help="--samplers as llama.cpp's letters, e.g. 'kpmt' (e penalties, k top-k, p top-p, m min-p, t "
                 "temperature, i infill; d, y, s, x pass through)."),
    ])


def escape_option(fn):
    """llama.cpp's -e/--escape, on by default, and --no-escape (common/arg.cpp: ``string_process_escapes`` on the
    prompt, -p's or -f's, and on --in-prefix, --in-suffix and each -r)."""
    return click.option(
        "-e", "--escape/--no-escape", "escape", default=True,
        help="Read \\n, \\r, \\t, \\', \\\", \\\\ and \\xHH in the text given on the command line and in --file "
             "as llama.cpp does (its -e, on by default); --no-escape takes them as written.")(fn)


def repeat_penalty_options(per_request: bool):
    """llama.cpp's --repeat-penalty and --repeat-last-n (common/arg.cpp); ``per_request``: the server's
    defaults, for a request that sets neither."""
    def said(text: str) -> str:
        return f"For a request that sets none: {text}" if per_request else text[0].upper() + text[1:]

    return lambda fn: _stacked(fn, [
        click.option("--repeat-penalty", default=1.0, show_default=True, cls=LlamaEnvOption,
                     envvar="LLAMA_ARG_REPEAT_PENALTY",
                     help=said("divide the logit of a token seen in the last --repeat-last-n tokens by this (1: off), "
                               "as llama.cpp's.")),
        click.option("--repeat-last-n", default=64, show_default=True, type=click.IntRange(min=-1),
                     help=said("the tokens the penalties look back over (prompt and answer; -1: the whole "
                               "context).")),
    ])


# The sampling fields run and serve both take, and the option that sets each: a value SamplingConfig or
# ServeDefaults refuses is a ValueError whose message starts with the field's name.
SAMPLING_OPTIONS = {"temperature": "'--temperature'", "top_p": "'--top-p'", "top_k": "'--top-k'",
                    "min_p": "'--min-p'", "samplers": "'--samplers' / '--sampling-seq'"}


def bad_sampling_option(exc: ValueError, options: dict[str, str] = SAMPLING_OPTIONS) -> click.BadParameter:
    """A refused sampling value told under the option the user typed (``options``: field -> option), not the
    field."""
    hint = next((option for field, option in options.items() if str(exc).startswith(field)), None)
    return click.BadParameter(str(exc), param_hint=hint)


def sampler_chain(samplers: str | None, sampling_seq: str | None) -> dict:
    """The ``samplers`` field of a SamplingConfig from ``--samplers`` or ``--sampling-seq`` (none: the default).

    A name or letter llama.cpp does not know is left out of the chain with a warning on stderr, as llama-cli and
    llama-server read these options (common/sampling.cpp ``common_sampler_types_from_names`` / ``..._from_chars``
    skip it: ``LOG_WRN("unable to match sampler by name '%s'")``) and as serve reads a request's ``samplers``
    (:func:`edgesdk.serve.api.skipped_samplers`); where every one is unknown the chain is empty, as llama.cpp's
    ("logits -> dist"), and the warning says what then runs. adaptive_p, which llama.cpp has and edgesdk does not
    carry, is refused (a ValueError naming it, told under the option by :func:`bad_sampling_option`)."""
    if samplers is not None and sampling_seq is not None:
        raise click.BadParameter("--samplers and --sampling-seq both give the sampler chain; pass one",
                                 param_hint="'--samplers' / '--sampling-seq'")
    if samplers is None and sampling_seq is None:
        return {}
    from edgesdk.runtime.generate import (
        CARRIED_SAMPLERS,
        PASS_THROUGH_SAMPLERS,
        SAMPLER_LETTERS,
    )
    from edgesdk.runtime.generate import sampler_chain as canonical_chain

    given = [name for name in samplers.split(";") if name] if samplers is not None else sampling_seq
    skipped: list[str] = []
    chain = canonical_chain(given, skipped=skipped)
    if skipped:
        if samplers is not None:
            option, what = "--samplers", f"{', '.join(map(repr, skipped))}: no sampler llama.cpp knows by name"
            known = ", ".join(CARRIED_SAMPLERS + PASS_THROUGH_SAMPLERS)
        else:
            option, what = "--sampling-seq", f"{', '.join(map(repr, skipped))}: no sampler letter llama.cpp knows"
            known = ", ".join(f"{letter}={name}" for letter, name in SAMPLER_LETTERS.items())
        left = "" if chain else ("; no sampler is left, as in llama.cpp's chain 'logits -> dist': each token is drawn "
                                 "from the model's own distribution (temperature 1), the likeliest one at "
                                 "--temperature 0")
        click.echo(f"edgesdk: warning: {option}: {what}, left out of the chain as llama.cpp leaves it out "
                   f"(\"unable to match sampler\"){left}; the {'names' if samplers is not None else 'letters'} are "
                   f"{known}", err=True)
    return {"samplers": chain}


def _threads_or_default(ctx, param, value: int | None) -> int | None:
    """``--threads``: a count of at least 1, or None (the profile's count, at most the usable cores) for 0 or
    below, as llama.cpp's ``-t`` takes them (common/arg.cpp: ``if (n_threads <= 0) n_threads =
    std::thread::hardware_concurrency()``; -1 is its default, which scripts pass): the rule :func:`edgesdk.load`
    reads its ``threads`` by (:func:`edgesdk.api_checks.load_threads`)."""
    return load_threads(value)


def runtime_options(fn=None, *, llama_env: bool = False):
    """The runtime's options: threads, a forced backend and the target check, for run, serve, eval and bench.
    ``llama_env`` (``@runtime_options(llama_env=True)``): --threads is read from LLAMA_ARG_THREADS too, as llama.cpp's
    tools read their -t (common/arg.cpp)."""
    if fn is None:
        return lambda command: runtime_options(command, llama_env=llama_env)
    threads_env = {"cls": LlamaEnvOption, "envvar": "LLAMA_ARG_THREADS"} if llama_env else {}
    return _stacked(fn, [
        click.option("--threads", "-t", type=int, callback=_threads_or_default, **threads_env,
                     help="Intra-op threads [from the target profile, at most the usable cores; 0 or below: "
                          "that default, as llama.cpp's -t -1 is its own]."),
        click.option("--backend", help="Force a backend (ort-cpu, ort-cuda, ort-trt, tensorrt, triton) instead of the profile's chain."),
        click.option("--target", help="Refuse the bundle unless it was built for this board."),
        click.option("--ignore-target", is_flag=True, help="Run a bundle built for another board anyway."),
    ])


class NamedPath(click.Path):
    """A path (a :class:`~pathlib.Path`) refused when empty: pathlib reads '' as '.', so ``--to "$SDCARD"`` with the
    variable unset would deploy into the current directory without a word, and ``--hosts ''`` or ``-f ''`` would be
    refused as the directory '.', a path that was not given. ``what`` and ``example`` make the refusal's fix; the
    other arguments are click.Path's (``file_okay``, ``dir_okay``, ``exists``, ...)."""

    def __init__(self, what: str, example: str, **kwargs):
        super().__init__(path_type=Path, **kwargs)
        self.what, self.example = what, example

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value:
            self.fail(f"an empty path names no {self.what} (it is not read as the current directory here); give "
                      f"the {self.what}, e.g. {self.example}", param, ctx)
        return super().convert(value, param, ctx)


class TelemetryFile(NamedPath):
    """``--telemetry FILE`` of run and serve: one JSONL file. A directory (``thermal plan`` takes ``--telemetry-dir``,
    so one is an easy slip) is refused with a file in it to pass, where click said only "File 'tele' is a
    directory"."""

    def convert(self, value, param, ctx):
        if isinstance(value, (str, Path)) and str(value) and Path(value).is_dir():
            self.fail(f"{value} is a directory, and --telemetry writes one JSONL file (the runs appended after those "
                      f"already in it); pass a file, e.g. --telemetry {Path(value) / 'run.jsonl'} ('edgesdk thermal "
                      f"report {value}' draws every .jsonl file in the directory)", param, ctx)
        return super().convert(value, param, ctx)


# -s's rule in words, for the help of run and serve (--help) and the refusals
SEED_RULE = (f"-1 or {RANDOM_SEED_VALUE}: a random seed; another number from 0 to 2**64 - 1: that fixed seed (past 32 "
             "bits too, not wrapped); a number below 0 down to -(2**64 - 1): its 32-bit wrap (the number mod 2**32, as "
             f"llama.cpp's std::stoul into its 32-bit seed makes it), -2 the fixed seed 4294967294 and one that wraps "
             f"to {RANDOM_SEED_VALUE} (-4294967297, ...) a random seed")

def token_limit(value: int, below_zero: str, zero: bool = False) -> int:
    """``-n`` for ``run -n`` and ``serve -n``: :func:`edgesdk.api_checks.token_count` (a count >= 1 as it is, any
    number below 0 :data:`~edgesdk.api_checks.UNLIMITED_TOKENS`, llama.cpp's "-1 = infinity"). 0 is llama.cpp's
    "evaluate the prompt and generate nothing": taken as 0 where the command does that (``zero``: run's one prompt),
    refused otherwise (click.BadParameter) with what llama-server does with it and a fix naming ``below_zero``, what
    the numbers below 0 mean for the command."""
    if value == 0 and not zero:
        raise click.BadParameter(f"is 0, which llama-server takes as its requests' default of no tokens generated "
                                 f"(each prompt only evaluated into the cache), and edgesdk serve has no such "
                                 f"prompt-only answer; give the most tokens an answer may have (a number >= 1), or "
                                 f"{below_zero}", param_hint="'--max-new-tokens' / '-n'")
    return 0 if value == 0 else token_count(value)


class LlamaSeed(click.types.IntParamType):
    """``-s`` / ``--seed`` as llama.cpp reads it: :func:`llama_seed` (:data:`SEED_RULE`)."""

    name = "seed"

    def convert(self, value, param, ctx):
        try:
            seed = super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not a whole number; give a seed (a whole number; -1 or {RANDOM_SEED_VALUE}: a "
                      "random one)", param, ctx)
        try:
            return llama_seed(seed)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


LLAMA_SEED = LlamaSeed()


class _DraftBundle(click.Path):
    """``--draft BUNDLE``'s value: an existing directory. A number that names none is refused with what llama.cpp
    means by it: its ``--draft N`` (common/arg.cpp: ``{"--draft", "--draft-n", "--draft-max"}``) is the tokens
    drafted at a time, which is ``--draft-max N`` here, and its draft model is ``-md/--model-draft FNAME``."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().isdigit() and not Path(value).exists():
            self.fail(f"{value!r} is a number, and --draft names the draft bundle here (llama.cpp's -md / "
                      f"--model-draft); for llama.cpp's --draft {value.strip()}, the tokens drafted at a time, pass "
                      f"--draft-max {value.strip()} with --draft BUNDLE", param, ctx)
        return super().convert(value, param, ctx)


def draft_options(fn):
    """``--draft BUNDLE`` and its settings (llama.cpp's -md, --draft-max, --draft-min, --draft-p-min), for run and
    serve, each under today's llama.cpp names too (common/arg.cpp: ``--spec-draft-model, -md, --model-draft``,
    ``--spec-draft-n-max``, ``--spec-draft-n-min``, ``--spec-draft-p-min, --draft-p-min``; the older --draft-max and
    --draft-min were removed there) and read from llama.cpp's environment variables for it, today's name first and
    the older one after (LLAMA_ARG_SPEC_DRAFT_MODEL / LLAMA_ARG_MODEL_DRAFT and so on; llama-cli and llama-server
    both read them)."""
    return _stacked(fn, [
        click.option(
            "--draft", "--model-draft", "-md", "--spec-draft-model", "draft_bundle",
            type=_DraftBundle(exists=True, file_okay=False, path_type=Path),
            cls=LlamaEnvOption, envvar=["LLAMA_ARG_SPEC_DRAFT_MODEL", "LLAMA_ARG_MODEL_DRAFT"],
            metavar="BUNDLE",
            help="Speculative decoding (llama.cpp's -md / --model-draft / --spec-draft-model): a smaller bundle with the "
                 "same tokenizer drafts tokens that this bundle checks several at a time; the answer is this bundle's "
                 "own, greedy or sampled."),
        click.option("--draft-max", "--draft-n", "--spec-draft-n-max", "draft_max", default=2, show_default=True,
                     cls=LlamaEnvOption,
                     envvar=["LLAMA_ARG_SPEC_DRAFT_N_MAX", "LLAMA_ARG_DRAFT_MAX"],
                     type=click.IntRange(1, 64), metavar="N",
                     help="Draft tokens the bundle checks in one pass (llama.cpp's --spec-draft-n-max; its older "
                          "--draft-max, --draft-n, --draft)."),
        click.option("--draft-min", "--draft-n-min", "--spec-draft-n-min", "draft_min", default=0, show_default=True,
                     cls=LlamaEnvOption,
                     envvar=["LLAMA_ARG_SPEC_DRAFT_N_MIN", "LLAMA_ARG_DRAFT_MIN"],
                     type=click.IntRange(0, 64), metavar="N",
                     help="Check a draft only where it holds at least this many tokens, and draft only where that "
                          "many fit (llama.cpp's --spec-draft-n-min, --draft-min, --draft-n-min); at most "
                          "--draft-max."),
        # FiniteRange: click's FloatRange passes nan; today's llama.cpp name first, as common/arg.cpp lists them
        click.option("--spec-draft-p-min", "--draft-p-min", "draft_p_min", default=0.0, show_default=True,
                     cls=LlamaEnvOption, envvar=["LLAMA_ARG_SPEC_DRAFT_P_MIN", "LLAMA_ARG_DRAFT_P_MIN"],
                     type=FiniteRange(0.0, 1.0, max_open=True, what="a draft token's probability", example="0.75"),
                     metavar="P",
                     help="Stop a draft at a token the draft model gives less than this probability."),
    ])


def thermal_options(fn):
    """The thermal guard's options, shared by ``run`` and ``serve``."""
    return _stacked(fn, [
        click.option("--watch-thermal", is_flag=True,
                     help="Thermal guard: before the firmware throttles, lower the compute budget when warm (a "
                          "power-gated bundle run with --gating skips more FFN blocks), pace tokens when hot, pause "
                          "generation past the hard limit; live status on stderr (run; serve reports it at "
                          "/health)."),
        click.option("--simulate-thermal", is_flag=True,
                     help="Read a simulated board (the target's thermal model driven by the real step times) "
                          "instead of sensors; guards like --watch-thermal unless --no-guard."),
        click.option("--no-guard", is_flag=True, help="Record (and simulate) only, never pace or pause."),
        click.option("--clock-cap", is_flag=True,
                     help="While pacing, the guard also caps the CPU clock (cpufreq scaling_max_freq, needs root; "
                          "restored on exit): about 1.4x the tokens at the same temperature, each a little slower."),
        click.option("--telemetry", type=TelemetryFile("telemetry file", "--telemetry run.jsonl", dir_okay=False),
                     help="Write one JSONL record per step: temperatures, level, tok/s, budget, pacing, power "
                          "(appended after the runs already in FILE; 'thermal report' draws each)."),
        click.option("--ambient", type=AMBIENT, help="Ambient °C of the simulated board [the profile's]."),
        click.option("--thermal-target", help="Profile for the thermal limits and model [the bundle's target]."),
        click.option("--sim-speed", default=1.0, show_default=True,
                     type=FiniteRange(1e-3, 1e6, what="how many times slower the simulated board is", example="1"),
                     help="Simulated board is this many times slower than this machine."),
    ])


def gate_options(fn):
    """The power gates' options, shared by ``run`` and ``serve``."""
    return _stacked(fn, [
        click.option("--entropy-target", type=float,
                     help="Power-gated bundles: windowed power entropy (nats) the gate controller holds, in "
                          "(0.366, 2.079) for the usual window of 8 tokens (up to ln 8) [the bundle's, from its build "
                          "profile: 1.5 for boards, 1.2 for the host; edgesdk inspect shows it]."),
        click.option("--compute-budget", type=float,
                     help="Power-gated bundles: largest mean fraction of FFN blocks run, in (0, 1] [1]."),
        click.option("--gating/--no-gating", default=None,
                     help="Power-gated bundles: skip FFN blocks by the gates. Off unless asked for (or "
                          "--entropy-target / --compute-budget given): the trained gates still cost too much "
                          "quality."),
    ])


def warn_unused_draft_options(draft_bundle: Path | None) -> None:
    """The draft settings given without ``--draft BUNDLE``, said on stderr as --top-p without a temperature is:
    ``serve`` says them before anything opens (a server that then cannot listen has still said them), ``run`` after
    its bundle opens, with its other unused options."""
    if draft_bundle is not None:
        return
    for name, flag in (("draft_max", "--draft-max"), ("draft_min", "--draft-min"), ("draft_p_min", "--draft-p-min")):
        if option_given(name):  # named as typed: --spec-draft-n-max is llama.cpp's --draft-max of today
            click.echo(f"edgesdk: {typed_option(name) or flag} is not used: it works with --draft BUNDLE", err=True)


def draft_model(draft_bundle: Path | None, runtime, draft_max: int, draft_min: int, draft_p_min: float, threads,
                target, ignore_target: bool, lookup_draft: int, verbose: bool = False):
    """``--draft BUNDLE``: the draft bundle opened and checked against the target's tokenizer (None without it,
    or where the target's backend cannot check drafts, which is said); ``verbose`` (``--stats``) prints the draft
    runtime's notes as the bundle's are printed."""
    from edgesdk.runtime.speculative import DraftConfig, DraftError, open_draft_model

    if draft_bundle is None:  # its settings were said unused before the bundle opened (warn_unused_draft_options)
        return None
    if draft_min > draft_max:
        raise click.BadParameter(f"{draft_min} is more than --draft-max ({draft_max}), so no draft could be checked; "
                                 f"pass --draft-max {draft_min} or more, or a smaller --draft-min",
                                 param_hint="'--draft-min' / '--draft-n-min' / '--spec-draft-n-min'")
    if lookup_draft:
        raise click.BadParameter("--draft and --lookup both draft tokens; pass one", param_hint="'--draft'")
    why = _why_no_drafting(runtime.backend)
    if why is not None:
        click.echo(f"edgesdk: --draft is not used: the {runtime.backend.name} backend {why}; it decodes token by "
                   "token", err=True)
        return None
    try:
        return open_draft_model(runtime, draft_bundle, DraftConfig(max_draft=draft_max, p_min=draft_p_min,
                                                                   min_draft=draft_min), threads, target, ignore_target,
                                verbose=verbose)
    except DraftError as exc:
        raise click.BadParameter(f"{exc.problem}; {exc.fix}", param_hint="'--draft'") from exc


def read_template_kwargs(text: str | None) -> dict:
    """``--chat-template-kwargs JSON``: a JSON object of extra chat-template variables."""
    from edgesdk.runtime.text import check_template_kwargs

    if text is None:
        return {}
    try:
        return check_template_kwargs(json.loads(text), "it")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"is not JSON ({exc}); give an object, e.g. '{{\"enable_thinking\": false}}'",
                                 param_hint="'--chat-template-kwargs'") from exc
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--chat-template-kwargs'") from exc


def _why_no_drafting(backend) -> str | None:
    """Why ``backend`` cannot check drafted tokens (runtime.generate.can_draft), None where it can."""
    from edgesdk.runtime.generate import can_draft

    if can_draft(backend):
        return None
    return "steps a power controller with every decode" if hasattr(backend, "controller") \
        else "cannot rewind its KV cache"


def lookup_config(backend, draft: int):
    """``--lookup N``: the prompt lookup settings (None when off), and a word where the backend cannot draft."""
    from edgesdk.runtime.lookup import LookupConfig

    if not draft:
        return None
    why = _why_no_drafting(backend)
    if why is not None:
        click.echo(f"edgesdk: --lookup is not used: the {backend.name} backend {why}; it decodes token by token",
                   err=True)
        return None
    return LookupConfig(max_draft=draft)


def open_thermal(runtime, watch_thermal: bool, simulate_thermal: bool, no_guard: bool, clock_cap: bool, telemetry,
                 ambient, thermal_target, sim_speed: float, status: bool):
    """The thermal session of ``run`` or ``serve`` (None without thermal options), its notes printed.

    Every call first undoes a clock cap that a killed run left. SIGTERM and SIGHUP then end the process
    through ``sys.exit`` so the caller's ``finally`` closes the session: the clock cap goes back, the
    status line gives the terminal its scroll region back, the telemetry file is closed. A signal the
    process was started ignoring (SIGHUP under nohup) stays ignored."""
    from edgesdk.thermal.cpufreq import recover_left_cap

    for note in recover_left_cap():
        click.echo(f"edgesdk thermal: {note}", err=True)
    if not (watch_thermal or simulate_thermal or telemetry):
        return None
    from edgesdk.cli_thermal import thermal_profile
    from edgesdk.profile import bundle_profile
    from edgesdk.thermal.watch import GATES_OFF, bundle_gate, open_session

    profile = (thermal_profile(None, thermal_target) if thermal_target
               else bundle_profile(runtime.bundle.manifest.get("target"), runtime.bundle.path))
    gate = bundle_gate(runtime)
    guard = (watch_thermal or simulate_thermal) and not no_guard
    if gate.gates_off and guard:
        click.echo(f"edgesdk thermal: {GATES_OFF} (--gating turns them on)", err=True)
    thermal = open_session(profile, guard=guard, simulate=simulate_thermal, telemetry_path=telemetry,
                           ambient_c=ambient, sim_speed=sim_speed, budget_target=gate.budget_target, status=status,
                           clock_cap=clock_cap, model_facts=gate.model_facts,
                           warn=lambda message: click.echo(f"edgesdk thermal: warning: {message}", err=True))
    for note in thermal.notes:
        click.echo(f"edgesdk thermal: {note}", err=True)
    exit_on_stop_signals()
    return thermal


def exit_on_stop_signals() -> None:
    """SIGTERM and SIGHUP (a service manager's stop, a closed terminal) end the process through ``sys.exit``
    with the shell's 128 + signal number, so that the caller's ``finally`` runs. A signal the process was started
    ignoring (SIGHUP under nohup) stays ignored."""
    import signal

    for stop in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(stop) is not signal.SIG_IGN:
            signal.signal(stop, lambda signum, frame: sys.exit(128 + signum))


def warn_unused_thermal_options(watch_thermal: bool, simulate_thermal: bool, telemetry, no_guard: bool,
                                clock_cap: bool, ambient, sim_speed: float, thermal_target) -> None:
    """Name the thermal options that do nothing without the mode they belong to (as --top-p is named)."""
    guarded = watch_thermal or simulate_thermal
    modes = "--watch-thermal or --simulate-thermal"
    options = [  # (flag, given, used in this run, what it works with)
        ("--no-guard", no_guard, guarded, modes),
        # beside --telemetry alone the thermal session itself says --clock-cap has no guard to cap for
        ("--clock-cap", clock_cap, guarded or telemetry, modes),
        ("--ambient", ambient is not None, simulate_thermal, "--simulate-thermal"),
        ("--sim-speed", sim_speed != 1.0, simulate_thermal, "--simulate-thermal"),
        ("--thermal-target", thermal_target is not None, guarded or telemetry,
         "--watch-thermal, --simulate-thermal or --telemetry"),
    ]
    for flag, given, used, works_with in options:
        if given and not used:
            click.echo(f"edgesdk: {flag} is not used: it works with {works_with}", err=True)


# The option each power-gate argument that cannot apply is told under (edgesdk.api_checks.GateArgumentError), quoted
# as click quotes an option it names: gating's is refused only where it is off, beside a target or a budget
GATE_OPTIONS = {argument: f"'{GATE_TERMS['cli'][option]}'" for argument, option in
                (("entropy_target", "entropy_target"), ("compute_budget", "compute_budget"), ("gating", "no_gating"))}


def configure_gates(backend, entropy_target, compute_budget, gating, bundle=None) -> None:
    """Apply the power-gate options to a gated backend; refuse them for a bundle without gates, naming ``bundle``
    (:func:`edgesdk.api_checks.configure_gates`, which :func:`edgesdk.load` shares), a value that cannot apply told
    under the option typed."""
    try:
        apply_gates(backend, entropy_target, compute_budget, gating, terms="cli", bundle=bundle)
    except GateArgumentError as exc:  # told under the option typed, not the controller's field
        raise click.BadParameter(str(exc), param_hint=GATE_OPTIONS[exc.argument]) from exc


def finite_or_null(value):
    """``value`` with every infinite or NaN float replaced by None (JSON has no such numbers)."""
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def echo_json(value) -> None:
    """``value`` printed as strict JSON (indented): a perplexity that overflowed (inf) or a broken bundle's NaN
    is null, as JSON has no such numbers."""
    click.echo(json.dumps(finite_or_null(value), indent=2, allow_nan=False))
