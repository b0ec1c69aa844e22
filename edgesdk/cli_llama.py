"""llama.cpp's command-line habits, read as llama.cpp's tools read them (common/arg.cpp), for ``run``, ``serve``,
``embed``, ``eval`` and ``bench``: option names with ``_`` for ``-`` (:data:`LLAMA_OPTION_NAMES`), the
``LLAMA_ARG_*`` environment variables (:class:`LlamaEnvOption`, :func:`unread_llama_env`), and llama.cpp's options
edgesdk has no counterpart for (:class:`LlamaCommand`: accepted with a note where they change nothing here, refused
by name otherwise, never misread as another option's value).

Importing this module imports click (and pathlib) only.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import click


def _llama_option_name(name):
    """An option's name as llama.cpp's tools match it: '_' read as '-' (common/arg.cpp, ``common_params_parse_ex``:
    ``std::replace(arg.begin(), arg.end(), '_', '-')`` for each argument starting with "--"), so the names its older
    scripts and docs spell ``--n_predict``, ``--repeat_penalty``, ``--top_k`` or ``--embd_normalize`` still work.
    click applies it to option names alone (and to a Choice's value and choices alike), never to a value; click 8.1
    hands a Choice of numbers (serve's --reasoning-budget -1|0) to it as they are, and gets them back."""
    return name.replace("_", "-") if isinstance(name, str) else name


# A command's context_settings that read its options' names as llama.cpp's tools do (run and embed).
LLAMA_OPTION_NAMES = {"token_normalize_func": _llama_option_name}


# llama.cpp's words for a boolean option's environment variable (common/arg.cpp ``is_truthy`` / ``is_falsey``)
LLAMA_TRUTHY = ("true", "1", "on", "enabled")
LLAMA_FALSEY = ("false", "0", "off", "disabled")
# llama.cpp's variables that are not LLAMA_ARG_* (common/arg.cpp: --api-key's, and --chat-template-kwargs' and the
# log options' before they were renamed LLAMA_ARG_CHAT_TEMPLATE_KWARGS and LLAMA_ARG_LOG_*)
_LLAMA_OTHER_ENV = ("LLAMA_API_KEY", "LLAMA_CHAT_TEMPLATE_KWARGS", "LLAMA_LOG_COLORS", "LLAMA_LOG_VERBOSITY",
                    "LLAMA_LOG_PREFIX", "LLAMA_LOG_TIMESTAMPS")


_TYPED = "edgesdk.llama.typed"  # the context's meta key of the names the options were given by (LlamaCommand)
_GIVEN = "edgesdk.llama.given"  # the meta key of llama.cpp's options read by LlamaCommand: long name -> name typed


def typed_option(name: str, ctx: click.Context | None = None) -> str | None:
    """The name the running command's option ``name`` (its parameter name) was given by on the command line, the last
    one where it was given more than once (``-n``, ``--n-predict``, ``--no-context-shift``), as llama.cpp names the
    argument it read (common/arg.cpp: "... will be overwritten by command line argument %s"); None where it was not
    given there or the command is no :class:`LlamaCommand`."""
    context = ctx if ctx is not None else click.get_current_context(silent=True)
    return None if context is None else context.meta.get(_TYPED, {}).get(name)


class LlamaEnvOption(click.Option):
    """An option that is also read from llama.cpp's environment variable(s) for it, as llama.cpp's tools read them
    (common/arg.cpp ``common_params_parse_ex``: each option's ``set_env`` name is read where the option is not on the
    command line; the command line wins, with a warning), so that a Docker image's or a systemd unit's
    ``LLAMA_ARG_PORT=8081``-style configuration takes effect instead of being silently ignored. ``envvar``'s names
    are read in order, the first one set (non-empty) wins, and ``--help`` shows them.

    A flag reads llama.cpp's words, true/1/on/enabled and false/0/off/disabled (``is_truthy`` / ``is_falsey``; any
    other value is refused by name, where llama.cpp ignores it for a plain switch); ``negated_env``, llama.cpp's
    ``LLAMA_ARG_NO_...`` name of a ``--x/--no-x`` option (``common_arg::get_value_from_env``), turns it off when
    set, before the others are read; ``env_inverts``: the flag says the opposite of the variable (``--no-prompt-cache``
    against llama-server's LLAMA_ARG_CACHE_PROMPT). A value the option refuses is refused naming the variable and
    its value (``secret``: naming the variable alone, as for an API key), and so is one the command's body refuses
    within :func:`told_from_env`: not the option, which the user did not type. A repeatable option takes the
    variable's value as one value (click would split it at spaces)."""

    def __init__(self, *decls, negated_env: str | None = None, env_inverts: bool = False, secret: bool = False,
                 **kwargs):
        kwargs.setdefault("show_envvar", True)
        envvar = kwargs.pop("envvar", None)
        names = [envvar] if isinstance(envvar, str) else list(envvar or ())
        self.env_names = tuple(names)
        self.negated_env = negated_env
        self.env_inverts = env_inverts
        self.secret = secret
        super().__init__(*decls, envvar=names + ([negated_env] if negated_env else []), **kwargs)

    def env_source(self) -> tuple[str, str] | None:
        """The variable that sets this option and its value, None where none is set (empty counts as unset)."""
        for name in ((self.negated_env,) if self.negated_env else ()) + self.env_names:
            if os.environ.get(name):
                return name, os.environ[name]
        return None

    def value_from_envvar(self, ctx):
        found = self.env_source()
        if found is None:
            return None
        name, raw = found
        ctx.meta[f"edgesdk.env.{self.name}"] = found
        if self.is_flag and self.is_bool_flag:
            if name == self.negated_env:
                return self.env_inverts
            word = raw.strip().lower()
            if word not in LLAMA_TRUTHY + LLAMA_FALSEY:
                raise click.BadParameter(
                    f"{name}={raw!r} is neither on nor off: set it to {', '.join(LLAMA_TRUTHY)} (on) or "
                    f"{', '.join(LLAMA_FALSEY)} (off), as llama.cpp reads it, or unset it", ctx=ctx, param=self)
            return (word in LLAMA_TRUTHY) != self.env_inverts
        return [raw] if self.multiple else raw

    def consume_value(self, ctx, opts):
        value, source = super().consume_value(ctx, opts)
        found = self.env_source()
        if found is not None and source is click.core.ParameterSource.COMMANDLINE:
            # common/arg.cpp: "warn: %s environment variable is set, but will be overwritten by command line argument"
            name, alias = self._given_as(ctx)
            click.echo(f"edgesdk: {found[0]} is set, but {name} on the command line goes over it{alias}", err=True)
        return value, source

    def _given_as(self, ctx) -> tuple[str, str]:
        """The option as the command line gave it, and the alias typed for it said after: its negation where that was
        typed (--no-context-shift, not --context-shift, which means the opposite); else its name, with " (given as
        -n)" where -n was typed for --max-new-tokens."""
        typed = typed_option(self.name, ctx)
        if typed is None or typed == self.opts[0]:
            return self.opts[0], ""
        if typed in self.secondary_opts:
            return typed, ""
        return self.opts[0], f" (given as {typed})"

    def get_error_hint(self, ctx) -> str:
        """The option's names alone, as for any option: a refused value is said with the variable that gave it where
        one did (:meth:`process_value`), not with every variable that could have (click 8.2+ lists them all)."""
        return click.Parameter.get_error_hint(self, ctx)

    def process_value(self, ctx, value):
        try:
            return super().process_value(ctx, value)
        except click.BadParameter as exc:
            told = self.told_from_env(ctx, exc)
            if told is exc:
                raise
            raise told from exc

    def told_from_env(self, ctx, exc: click.BadParameter) -> click.BadParameter:
        """``exc``, a refusal of this option's value, with the variable that gave the value where one did (its value
        too unless ``secret``): the option was not typed, so the fix is the variable's; ``exc`` itself otherwise."""
        found = ctx.meta.get(f"edgesdk.env.{self.name}")
        if found is None or ctx.get_parameter_source(self.name) is not click.core.ParameterSource.ENVIRONMENT \
                or found[0] in exc.message:
            return exc
        variable = found[0] if self.secret else f"{found[0]}={found[1]!r}"
        return click.BadParameter(f"{exc.message} (read from the environment, {variable}: set it right or unset it; "
                                  f"{self.opts[0]} on the command line goes over it)",
                                  ctx=ctx, param=self, param_hint=exc.param_hint)


@contextlib.contextmanager
def told_from_env(*names: str) -> Iterator[None]:
    """A refusal of the running command's option ``names[0]`` (its parameter name) made after parsing, in the
    command's body, told with the variable that gave the value where one did (:meth:`LlamaEnvOption.told_from_env`),
    as one made while parsing is. With several names, the option the refusal names (one of its names, quoted, in the
    refusal's param_hint, as click writes it: ``'--draft-min' / '--draft-n-min'``); none: the refusal as it is."""
    try:
        yield
    except click.BadParameter as exc:
        context = click.get_current_context()
        options = [param for param in context.command.params if param.name in names]
        if len(names) > 1:
            options = [option for option in options if _named_in_hint(option, exc.param_hint)]
        option = options[0] if len(options) == 1 else None
        if not isinstance(option, LlamaEnvOption):
            raise
        told = option.told_from_env(context, exc)
        if told is exc:
            raise
        raise told from exc


def _named_in_hint(option: click.Parameter, hint) -> bool:
    """Whether a refusal's ``hint`` (click's param_hint: a string, or a list of names) names ``option``."""
    text = " / ".join(hint) if isinstance(hint, (list, tuple)) else str(hint or "")
    return any(f"'{name}'" in text or text == name for name in option.opts)


def unread_llama_env(command: click.Command, *read: str) -> list[str]:
    """The llama.cpp environment variables set here (``LLAMA_ARG_*`` and the others of ``_LLAMA_OTHER_ENV``) that
    ``command`` does not read (no option of its has them, nor ``read``): llama.cpp's tools would act on them, so the
    command says it does not, instead of ignoring them silently."""
    known = set(read)
    for param in command.params:
        if isinstance(param, LlamaEnvOption):
            known.update(param.env_names + ((param.negated_env,) if param.negated_env else ()))
    return sorted(name for name, value in os.environ.items() if value and name not in known and
                  (name.startswith("LLAMA_ARG_") or name in _LLAMA_OTHER_ENV))


def _accepted_env(command: click.Command) -> dict[str, _LlamaOnly]:
    """The variables of llama.cpp's options that ``command`` accepts with a note (:class:`LlamaCommand`), each with
    its option; an option the command has itself (serve's -b) is not here, its own option reads the variable."""
    table = getattr(command, "llama_table", None)
    own = {name for param in command.params if isinstance(param, click.Option)
           for name in param.opts + param.secondary_opts}
    return {variable: option for option in _llama_only_by_name(table).values()
            if option.accepted_in(command.name or "") and not own.intersection(option.names)
            for variable in option.env}


def _say_accepted_env(context: click.Context, unread: list[str]) -> list[str]:
    """Of the ``unread`` variables, those of llama.cpp's options the command accepts said as their options are (the
    same note on stderr; a value the option's check refuses is refused, naming the variable): the others are left.
    Where the option is on the command line too, that goes over the variable, which is neither checked nor read:
    said, as common/arg.cpp warns ("... is set, but will be overwritten by command line argument %s"), so that
    LLAMA_ARG_N_PARALLEL=4 with -np 1 typed runs as -np 1 does."""
    accepted = _accepted_env(context.command) if isinstance(context.command, LlamaCommand) else {}
    typed = context.meta.get(_GIVEN, {})
    notes, overridden = [], []
    for variable in [name for name in unread if name in accepted]:
        option, value = accepted[variable], os.environ[variable]
        if option.long in typed:
            if option not in overridden:  # LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K and its older name: said once
                overridden.append(option)
                click.echo(f"edgesdk: {variable} is set, but {typed[option.long]} on the command line goes over it",
                           err=True)
            continue
        refusal = option.check(option.long, value, context.command.name) if option.check and option.value else None
        if refusal is not None:
            raise click.BadParameter(f"{refusal} (read from the environment, {variable}={value!r}: set it right or "
                                     "unset it)", ctx=context, param_hint=f"{variable} (llama.cpp's {option.long})")
        if all(noted is not option for _, noted in notes):  # LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K and its older name
            notes.append((variable, option))
    for variable, option in notes:
        click.echo(f"edgesdk: {variable} (llama.cpp's {option.long}) is accepted for llama.cpp's scripts and changes "
                   f"nothing here: {option.why}", err=True)
    return [name for name in unread if name not in accepted]


def say_unread_llama_env(tool: str, *read: str) -> None:
    """Say on stderr which llama.cpp environment variables set here the running command does not read
    (:func:`unread_llama_env`; ``read``: those it reads other than through its options, such as LLAMA_ARG_MODEL for
    its BUNDLE), as llama.cpp's ``tool`` (llama-server, llama-embedding, ...) would act on them: its
    ``common_params_parse`` reads every option's ``set_env`` variable for each tool sharing the option
    (common/arg.cpp), so one a command ignored silently left a Docker image's or a systemd unit's setting off.
    The variable of an option the command accepts with a note (LLAMA_ARG_N_GPU_LAYERS: -ngl) is said as its option
    is, with that note, and its value checked as the option's (LLAMA_ARG_N_PARALLEL=4 refused as -np 4 is)."""
    context = click.get_current_context()
    unread = _say_accepted_env(context, unread_llama_env(context.command, *read))
    if unread:
        name = context.command.name
        click.echo(f"edgesdk {name}: not read: {', '.join(unread)} ({tool}'s, for options edgesdk {name} does not "
                   f"have; 'edgesdk {name} --help' names the variables it reads)", err=True)


MODEL_ENV = "LLAMA_ARG_MODEL"  # llama.cpp's -m / --model (common/arg.cpp ``set_env("LLAMA_ARG_MODEL")``)


def say_model_env_overridden(parameter: str = "bundle") -> None:
    """Where LLAMA_ARG_MODEL is set and the command's BUNDLE argument (``parameter``, which reads it where none is
    given) or its ``-m`` (:func:`model_option`) is on the command line: said on stderr, as common/arg.cpp warns
    that an environment variable "is set, but will be overwritten by command line argument"."""
    context = click.get_current_context()
    if not os.environ.get(MODEL_ENV):
        return
    if context.get_parameter_source(parameter) is click.core.ParameterSource.COMMANDLINE:
        click.echo(f"edgesdk: {MODEL_ENV} is set, but the BUNDLE on the command line goes over it", err=True)
    elif context.params.get("model") is not None:
        click.echo(f"edgesdk: {MODEL_ENV} is set, but -m on the command line goes over it", err=True)


def model_option(tool: str):
    """``-m / --model BUNDLE``: the BUNDLE argument as ``tool`` (llama-cli, llama-embedding, llama-perplexity) names
    its model (common/arg.cpp ``-m, --model FNAME``), for the command's BUNDLE argument to be given either way
    (:func:`bundle_or_model`); the argument must then be ``required=False``."""
    return click.option("--model", "-m", "model", type=click.Path(path_type=Path), metavar="BUNDLE",
                        help=f"The BUNDLE, as {tool}'s -m / --model names its model (give it once: as BUNDLE or "
                             "-m).")


def bundle_or_model(bundle: Path | None, model: Path | None, what: str, tool: str = "llama-cli") -> Path:
    """The BUNDLE argument, or ``tool``'s ``-m / --model PATH`` for it (common/arg.cpp: the model path, also read
    from LLAMA_ARG_MODEL): one of them; both on the command line only where they name the same bundle. A BUNDLE
    read from LLAMA_ARG_MODEL gives way to -m, as llama.cpp's command line goes over its environment."""
    from_env = click.get_current_context().get_parameter_source("bundle") is click.core.ParameterSource.ENVIRONMENT
    if model is None:
        if bundle is None:
            raise click.UsageError(f"Missing argument '{what}': give the bundle's directory (or -m {what}, as "
                                   f"{tool} names its model)")
        return bundle
    if bundle is None or from_env:
        return model
    if Path(bundle).resolve() != Path(model).resolve():
        raise click.BadParameter(f"names {str(model)!r} and the BUNDLE argument {str(bundle)!r}: give the bundle "
                                 "once, as BUNDLE or as -m BUNDLE", param_hint="'--model' / '-m'")
    return bundle


# --- llama.cpp's options that edgesdk has no counterpart for -------------------------------------------------------
#
# llama-cli and llama-server users type their options out of habit. click reads a single-dash token it does not know
# as short options and their value (``-ngl 99`` as ``-n gl``, ``-np 1`` as ``-n p``, ``-st`` as ``-s t``,
# ``-no-cnv`` as ``-n o-cnv``), so such a flag was refused as a bad value of another option, or worse, taken as one.
# :class:`LlamaCommand` reads llama.cpp's options (common/arg.cpp, ``common_params_parser_init``) by name before
# click parses: one that changes nothing here is accepted and said once on stderr, with why; one that would mean
# something edgesdk cannot do is refused by its own name, with the fix.

_PLACEMENT = "the backend and where it runs come from the bundle's target profile (--backend forces another)"
_CPU_PLACEMENT = "the runtime places its threads itself (--threads sets how many)"
_WEIGHTS = "the runtime (ONNX Runtime or TensorRT) loads the bundle's weights itself"
_ONE_AT_A_TIME = "one sequence is decoded at a time (a board decodes batch 1)"
_OWN_TEMPLATE = "the chat template is the model's own, recorded in the bundle at build: leave it out"
_SWITCH_WORDS = LLAMA_TRUTHY + LLAMA_FALSEY + ("auto", "-1")  # common/arg.cpp is_truthy / is_falsey / is_autoy


def whole_number(text: str) -> bool:
    """Whether ``text`` is a whole number as ``std::stoi`` reads one, so that ``int(text)`` takes it: ASCII digits
    after at most one sign, spaces around (``str.isdigit`` alone takes '²' or '¹²', and stripping every sign takes
    '+-5' or '--5': ``int`` refuses them all, as ``std::stoi`` refuses the signs)."""
    text = text.strip()
    digits = text[1:] if text[:1] in ("+", "-") else text
    return digits.isascii() and digits.isdigit()


_DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_FLT_MIN = 2.0 ** -126  # a float's smallest normal value (FLT_MIN)


def stof_number(text: str) -> float | None:
    """``text`` as a plain number llama.cpp's ``std::stof`` reads alike (None otherwise): a decimal of ASCII digits
    after at most one sign, with an exponent or not, spaces around, as a float's (32-bit) value, as llama.cpp then
    holds it. Stricter than ``std::stof`` (``strtof``), which also reads 'inf', 'nan', hex floats and a number with
    text after it ('0.5abc' as 0.5): those, Python's wider ``float`` forms (other scripts' digits '٠', '_' between
    digits '0_5') and values past a float's range or under its smallest normal one (``std::stof``'s ERANGE) are not
    taken."""
    if not text.isascii() or _DECIMAL.fullmatch(text.strip()) is None:
        return None
    number = float(text)
    try:
        single = struct.unpack("f", struct.pack("f", number))[0]
    except OverflowError:
        return None
    if math.isinf(single) or (number != 0 and abs(single) < _FLT_MIN):
        return None
    return single


def _stoi_number(text: str) -> int | None:
    """``text`` as ``std::stoi`` reads a whole number (:func:`whole_number`), None where it is none."""
    return int(text) if whole_number(text) else None


def _gpu_layers(flag: str, value: str, command: str) -> str | None:
    """``-ngl N``: a number, 'auto' or 'all', as common/arg.cpp reads it (``std::stoi`` otherwise)."""
    if whole_number(value) or value in ("auto", "all"):
        return None
    return f"{value!r} is not a layer count: give a number, 'auto' or 'all' (it changes nothing here: {_PLACEMENT})"


def _one_sequence(flag: str, value: str, command: str) -> str | None:
    """``-np N``: 1 (and llama-server's -1, auto) is what edgesdk does; more slots would mislead."""
    if not whole_number(value):
        return f"{value!r} is not a number of slots: give 1, or leave {flag} out"
    if int(value) == 1 or (int(value) == -1 and command == "serve"):  # as std::stoi reads it; llama-server's -1: auto
        return None
    waits = ": the other requests wait in the queue (--max-queue sets how many)" if command == "serve" else ""
    return (f"is {value}, and edgesdk {command} decodes one sequence at a time (a board decodes batch 1){waits}; "
            f"pass {flag} 1 or leave it out")


def _models_max(flag: str, value: str, command: str) -> str | None:
    """llama-server's ``--models-max N`` (the most models its router keeps loaded; 0: no limit): 1 is what edgesdk
    serve does, a board's memory holding one model; another number would promise models kept loaded side by side."""
    if _stoi_number(value) == 1:
        return None
    return (f"is {value}, and edgesdk serve keeps one model loaded at a time (a board's memory holds one; a request "
            f"naming another swaps it in): pass {flag} 1 or leave it out")


def _kv_type(flag: str, value: str, command: str) -> str | None:
    """``-ctk/-ctv TYPE``: f16, llama.cpp's default, asks for nothing but the default and is accepted; another type
    would mislead (the cache's type is the bundle's, fixed when it was built)."""
    if value.strip().lower() == "f16":
        return None
    return (f"is {value!r}, and the KV cache's data type is the bundle's, fixed when it was built (its quantization "
            f"is edgesdk build's recipe): pass {flag} f16 (llama.cpp's default) or leave it out")


def _count(flag: str, value: str, command: str) -> str | None:
    """An ``N`` llama.cpp reads with ``std::stoi`` (-b, -ub, -tb, ...): a whole number, refused by name otherwise, as
    llama.cpp refuses it, rather than taken (and the token after the flag, e.g. ``-b --temp``, with it)."""
    if whole_number(value):
        return None
    return f"{value!r} is not a whole number, which llama.cpp's {flag} takes: give one, or leave {flag} out"


def _fraction(flag: str, value: str, command: str) -> str | None:
    """A value llama.cpp reads with ``std::stof`` (-sps; :func:`stof_number`): a number, refused by name otherwise."""
    if stof_number(value) is None:
        return f"{value!r} is not a number, which llama.cpp's {flag} takes: give one, e.g. 0.5, or leave {flag} out"
    return None


def _priority(flag: str, value: str, command: str) -> str | None:
    """``--prio N``: llama.cpp's process/thread priority, -1 (low) to 3 (realtime), 0 (normal) its default: 0 is what
    runs here; another would mislead, as edgesdk sets no priority (nice and chrt do)."""
    if not whole_number(value) or not -1 <= int(value) <= 3:
        return (f"{value!r} is not a priority llama.cpp's {flag} takes: give -1 (low), 0 (normal), 1 (medium), "
                f"2 (high) or 3 (realtime), or leave {flag} out")
    if int(value) == 0:
        return None
    return (f"is {value}, and edgesdk {command} runs at the priority it is started with: run it under nice (or chrt "
            f"for realtime) for another, and pass {flag} 0 or leave it out")


def _switch_value(*words: tuple[str, ...]):
    """A check of an on|off(|auto) value (common/arg.cpp ``is_truthy`` / ``is_falsey`` / ``is_autoy``; another word is
    llama.cpp's "unknown value for ..."): ``words`` are the groups taken, LLAMA_TRUTHY, LLAMA_FALSEY, ("auto", "-1")."""
    taken = tuple(word for group in words for word in group)

    def check(flag: str, value: str, command: str) -> str | None:
        if value.strip().lower() in taken:
            return None
        named = "on, off or auto" if len(words) > 2 else "on or off"
        return f"{value!r} is not a value llama.cpp's {flag} knows: give {named} ({', '.join(taken)}), or leave it out"
    return check


_ON_OFF = _switch_value(LLAMA_TRUTHY, LLAMA_FALSEY)
_ON_OFF_AUTO = _switch_value(LLAMA_TRUTHY, LLAMA_FALSEY, ("auto", "-1"))


# what edgesdk has nearest to each of llama.cpp's samplers it lacks, in the commands that sample (run's options; serve's
# where they differ: it has no --frequency-penalty or --presence-penalty, a request's fields set those)
_NEAREST_SAMPLER = {
    "mirostat": {"run": "a fixed --temperature with --top-p or --min-p is the nearest here"},
    "locally typical": {"run": "--top-p or --min-p (each also cuts the unlikely tail) is the nearest here"},
    "DRY": {"run": "--repeat-penalty with --repeat-last-n, --frequency-penalty or --presence-penalty penalize "
                   "repeated tokens (not repeated sequences)",
            "serve": "--repeat-penalty with --repeat-last-n (and a request's frequency_penalty or presence_penalty) "
                     "penalize repeated tokens (not repeated sequences)"},
    "XTC": {"run": "a higher --temperature with --min-p is the nearest here"},
    "top-n-sigma": {"run": "--min-p (it also keeps only the tokens near the most likely one) is the nearest here"},
    "dynamic temperature": {"run": "a fixed --temperature is the nearest here"},
    "adaptive-p": {"run": "--temperature with --top-p or --min-p is the nearest here"},
}


# the options whose values the off-rule of another sampler's option reads (edgesdk.serve.api.sampler_off reads them
# as a request's fields): each with that field and how llama.cpp reads its value
_SAMPLER_COMPANIONS = {"--xtc-threshold": ("xtc_threshold", stof_number),
                       "--dry-penalty-last-n": ("dry_penalty_last_n", _stoi_number)}


class _SamplerOff:
    """The check of the option that turns on llama.cpp's ``sampler``, which edgesdk lacks, judged by edgesdk serve's
    rule for a request's ``field`` (:func:`edgesdk.serve.api.sampler_off`; ``adaptive_target``:
    :func:`~edgesdk.serve.api.adaptive_p_off`), which reads other options' values where the sampler's own does
    (:data:`_SAMPLER_COMPANIONS`: XTC is off with --xtc-threshold above 0.5, DRY with --dry-penalty-last-n 0). A value
    that leaves it off is accepted, as llama.cpp then samples without it; another is refused naming the sampler and
    what edgesdk has nearest (:data:`_NEAREST_SAMPLER`), or, in a command that samples nothing, saying so. ``off``:
    llama.cpp's default; ``also``: how the other option leaves it off; ``whole``: a count llama.cpp reads with
    ``std::stoi`` (--mirostat), else ``std::stof``. :class:`LlamaCommand` runs it after the command's other checks,
    with ``given``: the llama.cpp options on the command line (by long name) and their values."""

    def __init__(self, sampler: str, field: str, off: str, also: str = "", whole: bool = False):
        self.sampler, self.field, self.off, self.also, self.whole = sampler, field, off, also, whole

    def is_off(self, number: float, given: dict[str, str]) -> bool:
        from edgesdk.serve.api import adaptive_p_off, sampler_off

        if self.field == "adaptive_target":
            return adaptive_p_off(number)
        body = {}
        for option, (field, read) in _SAMPLER_COMPANIONS.items():
            if given.get(option) is not None and read(given[option]) is not None:
                body[field] = read(given[option])
        return sampler_off(self.field, number, body)

    def __call__(self, flag: str, value: str, command: str, given: dict[str, str] | None = None) -> str | None:
        number = _stoi_number(value) if self.whole else stof_number(value)
        off = f"pass {flag} {self.off} (off) or leave it out" + (f", or {self.also} (off too)" if self.also else "")
        if number is None:
            kind = "a whole number" if self.whole else "a number"
            return f"{value!r} is not {kind}, which llama.cpp's {flag} takes: {off}"
        if self.is_off(number, given or {}):
            return None
        if command not in ("run", "serve"):
            return f"is {value}, and edgesdk {command} samples no tokens: {off}"
        nearest = _NEAREST_SAMPLER[self.sampler]
        return f"is {value}, and edgesdk has no {self.sampler} sampler: {off}; {nearest.get(command, nearest['run'])}"


def _tunes(sampler: str, switch: str) -> str:
    """Why an option that only tunes llama.cpp's ``sampler`` (turned on by ``switch``) changes nothing here."""
    return f"it tunes llama.cpp's {sampler} sampler, which edgesdk does not have ({switch})"


def _last_n(flag: str, value: str, command: str) -> str | None:
    """A count of last tokens llama.cpp reads with ``std::stoi`` and refuses below -1 (--dry-penalty-last-n)."""
    if whole_number(value) and int(value) >= -1:
        return None
    return (f"{value!r} is not a count of tokens llama.cpp's {flag} takes: give a whole number from -1 (the context) "
            f"up, or leave {flag} out")


_HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a Hub id's part, or a quantization's name (Q4_K_M)


def _hf_repo_refusal(value: str | None) -> str:
    """-hf ORG/NAME[:QUANT]'s fix: the download of that one quantization's file (llama.cpp's -hf fetches one; a
    GGUF repository holds every quantization, tens of GB together, which 'hf download ORG/NAME' alone fetches), then
    the build from it. The repository and QUANT are the ones given where they read as such, else placeholders."""
    repo, _, quant = (value or "").partition(":")
    if not (repo.count("/") == 1 and all(_HUB_NAME.fullmatch(part) for part in repo.split("/"))):
        repo = "ORG/NAME"
    named = bool(_HUB_NAME.fullmatch(quant))
    if "_" in quant:  # llama.cpp matches the tag in any case; the files spell Q4_K_M, IQ4_XS, ... in capitals
        quant = quant.upper()
    return (f"edgesdk downloads nothing from the Hub: download that quantization's GGUF file with 'hf download "
            f"{repo} --include \"*{quant if named else 'QUANT'}*.gguf\" --local-dir DIR'"
            + ("" if named else " (QUANT: the quantization, e.g. Q4_K_M, llama.cpp's -hf default, or Q8_0)")
            + ", build a bundle from it with 'edgesdk build --model DIR/FILE.gguf' and pass the bundle's directory")


def _hf_file_refusal(value: str | None) -> str:
    """-hff FILE's fix: the download of that file (named where it reads as a file in the repository), then the build
    from it."""
    file = value if value and all(_HUB_NAME.fullmatch(part) for part in value.split("/")) else "FILE.gguf"
    return (f"edgesdk downloads nothing from the Hub: download the file with 'hf download ORG/NAME {file} --local-dir "
            f"DIR', build a bundle from it with 'edgesdk build --model DIR/{file}' and pass the bundle's directory")


def _context_size(flag: str, value: str, command: str) -> str | None:
    """``-c N``: a whole number >= 0, checked against the bundle's context once it is known, and then the run's
    context (:func:`checked_ctx_size`)."""
    if whole_number(value) and int(value) >= 0:
        return None
    return f"{value!r} is not a context size: give a number of tokens (0: the bundle's)"


def _off_at(off: int, instead: str):
    """A check of a llama-server option that turns on what edgesdk serve does not do: ``off`` (llama-server's
    default, which leaves it off) is accepted, as llama-server then runs without it; another whole number is refused,
    ``instead`` saying what serve does."""
    def check(flag: str, value: str, command: str) -> str | None:
        if not whole_number(value):
            return f"{value!r} is not a whole number, which llama.cpp's {flag} takes: pass {flag} {off} or leave it out"
        if int(value) == off:
            return None
        return f"is {value}, and {instead}: pass {flag} {off} (off) or leave it out"
    return check


# a bundle's LoRA adapters are merged into its weights by edgesdk build (cli_build.py --lora / --lora-scaled)
_MERGED_LORA = ("a bundle carries its LoRA adapters merged into its weights at build: build one with 'edgesdk build "
                "--target T --model BASE {build}' and pass that bundle")
_SERVED_LORAS = "; a bundle for each adapter can be served together (edgesdk serve BUNDLE..., a request's model picks one)"


class _LlamaOnly:
    """One llama.cpp option (its names as common/arg.cpp spells them) that edgesdk has no option for. ``value``: ""
    a switch, "N"/"TYPE"/...: takes one value, "[on|off|auto]": an optional one (older llama.cpp made -fa and --color
    switches). ``why``: why it changes nothing here (accepted, said on stderr); None: refused, with ``refused`` as
    the fix (or a function of the value given with it, which names that value's parts), or ``refused_in[command]``
    where that command has another (serve has no --raw). ``check(flag, value,
    command)``: a refusal of that value, or None where it is accepted. ``server``: llama-server's own option (an HTTP
    setting): ``why`` and ``refused`` speak of edgesdk serve, and the other commands refuse it as one they lack.
    ``env``: llama.cpp's environment variable(s) for it (common/arg.cpp ``set_env``; its ``LLAMA_ARG_NO_...`` name
    for a ``--no-x`` one), read as the option is where the command accepts it (:func:`say_unread_llama_env`).
    ``keep``: the option's value is kept for the command (``ctx.meta["edgesdk.llama.<keep>"]``: the name typed and
    the number, or None for a switch), which acts on it, and no note is said. ``only``: the commands that take it,
    space-separated ("run serve"; the others refuse it with ``refused``)."""

    def __init__(self, names: str, value: str = "", why: str | None = None, refused: str | None = None,
                 check=None, keep: str | None = None, refused_in: dict[str, str] | None = None,
                 server: bool = False, env: str = "", only: str | None = None):
        self.names = tuple(names.split())
        self.env = tuple(env.split())
        self.value, self.why, self.refused, self.check, self.keep = value, why, refused, check, keep
        self.refused_in = dict(refused_in or {})
        self.server, self.only = server, tuple(only.split()) if only else None

    def accepted_in(self, command: str) -> bool:
        """Whether ``command`` takes this option (with a note of ``why``) rather than refusing it."""
        return self.why is not None and (not self.server or command == "serve") and (self.only is None or command in self.only)

    def refusal(self, command: str, value: str | None = None) -> str:
        """The fix said where ``command`` refuses this option; ``value``: the one given with it (None: none), for a
        ``refused`` that is a function of it."""
        if self.server and command != "serve":
            return f"it is an option of llama-server's HTTP server, and edgesdk {command} serves nothing: leave it out"
        if callable(self.refused):
            return self.refused(value)
        return self.refused_in.get(command) or self.refused or (
            f"leave it out; 'edgesdk {command} --help' lists the options this command has (click would read it as "
            "other options)")

    @property
    def long(self) -> str:
        return next((name for name in self.names if name.startswith("--")), self.names[0])


_LLAMA_ONLY = [
    _LlamaOnly("-ngl --gpu-layers --n-gpu-layers", "N", _PLACEMENT, check=_gpu_layers, env="LLAMA_ARG_N_GPU_LAYERS"),
    _LlamaOnly("-ngld --gpu-layers-draft --n-gpu-layers-draft --spec-draft-ngl", "N", _PLACEMENT, check=_gpu_layers,
               env="LLAMA_ARG_N_GPU_LAYERS_DRAFT"),
    _LlamaOnly("-sm --split-mode", "MODE", _PLACEMENT, env="LLAMA_ARG_SPLIT_MODE"),
    _LlamaOnly("-ts --tensor-split", "SPLIT", _PLACEMENT, env="LLAMA_ARG_TENSOR_SPLIT"),
    _LlamaOnly("-mg --main-gpu", "INDEX", _PLACEMENT, check=_count, env="LLAMA_ARG_MAIN_GPU"),
    _LlamaOnly("-dev --device", "DEVICES", _PLACEMENT, env="LLAMA_ARG_DEVICE"),
    _LlamaOnly("-devd --device-draft --spec-draft-device", "DEVICES", _PLACEMENT),
    _LlamaOnly("-kvo --kv-offload", "", _PLACEMENT, env="LLAMA_ARG_KV_OFFLOAD"),
    _LlamaOnly("-nkvo --no-kv-offload", "", _PLACEMENT, env="LLAMA_ARG_NO_KV_OFFLOAD"),
    _LlamaOnly("--op-offload", "", _PLACEMENT),
    _LlamaOnly("--no-op-offload", "", _PLACEMENT),
    _LlamaOnly("-fit --fit", "on|off", _PLACEMENT, check=_ON_OFF, env="LLAMA_ARG_FIT"),
    _LlamaOnly("-fitt --fit-target", "MIB", _PLACEMENT, env="LLAMA_ARG_FIT_TARGET"),
    _LlamaOnly("-fitc --fit-ctx", "N", _PLACEMENT, check=_count, env="LLAMA_ARG_FIT_CTX"),
    _LlamaOnly("-cmoe --cpu-moe", "", _PLACEMENT, env="LLAMA_ARG_CPU_MOE"),
    _LlamaOnly("-ncmoe --n-cpu-moe", "N", _PLACEMENT, check=_count, env="LLAMA_ARG_N_CPU_MOE"),
    _LlamaOnly("-ot --override-tensor", "PATTERN", _PLACEMENT, env="LLAMA_ARG_OVERRIDE_TENSOR"),
    _LlamaOnly("--repack", "", _PLACEMENT, env="LLAMA_ARG_REPACK"),
    _LlamaOnly("-nr --no-repack", "", _PLACEMENT, env="LLAMA_ARG_NO_REPACK"),
    _LlamaOnly("--no-host", "", _PLACEMENT, env="LLAMA_ARG_NO_HOST"),
    _LlamaOnly("-fa --flash-attn", "[on|off|auto]",
               "attention runs as the bundle's graph computes it, with the kernels its backend picks",
               check=_ON_OFF_AUTO, env="LLAMA_ARG_FLASH_ATTN"),
    _LlamaOnly("--jinja", "", "the chat template is always the model's own, rendered as Jinja", env="LLAMA_ARG_JINJA"),
    _LlamaOnly("--no-jinja", "", "the chat template is always the model's own, rendered as Jinja",
               env="LLAMA_ARG_NO_JINJA"),
    _LlamaOnly("--mlock", "", _WEIGHTS, env="LLAMA_ARG_MLOCK"),
    _LlamaOnly("--mmap", "", _WEIGHTS, env="LLAMA_ARG_MMAP"),
    _LlamaOnly("--no-mmap", "", _WEIGHTS, env="LLAMA_ARG_NO_MMAP"),
    _LlamaOnly("-dio --direct-io", "", _WEIGHTS, env="LLAMA_ARG_DIO"),
    _LlamaOnly("-ndio --no-direct-io", "", _WEIGHTS, env="LLAMA_ARG_NO_DIO"),
    _LlamaOnly("--warmup", "", "no warm-up run is made here"),
    _LlamaOnly("--no-warmup", "", "no warm-up run is made here"),
    _LlamaOnly("-co --color", "[on|off|auto]", "the answer is written as plain text", check=_ON_OFF_AUTO),
    _LlamaOnly("--log-colors", "[on|off|auto]", "edgesdk's notes are plain text", check=_ON_OFF_AUTO,
               env="LLAMA_ARG_LOG_COLORS LLAMA_LOG_COLORS"),
    _LlamaOnly("--simple-io", "", "the input is read as plain lines already"),
    _LlamaOnly("--log-disable", "", "edgesdk writes no llama.cpp log; its own notes go to stderr"),
    _LlamaOnly("--no-perf", "", "timings are printed only with --stats", env="LLAMA_ARG_NO_PERF"),
    _LlamaOnly("-tb --threads-batch", "N", "prefill runs with the --threads threads too", check=_count),
    _LlamaOnly("-C --cpu-mask", "M", _CPU_PLACEMENT),
    _LlamaOnly("-Cr --cpu-range", "LO-HI", _CPU_PLACEMENT),
    _LlamaOnly("--cpu-strict", "<0|1>", _CPU_PLACEMENT, check=_count),
    _LlamaOnly("--poll", "<0...100>", _CPU_PLACEMENT, check=_count),
    _LlamaOnly("--prio", "N", "the process runs at the priority it is started with", check=_priority),
    _LlamaOnly("-Cb --cpu-mask-batch", "M", _CPU_PLACEMENT),
    _LlamaOnly("-Crb --cpu-range-batch", "LO-HI", _CPU_PLACEMENT),
    _LlamaOnly("--cpu-strict-batch", "<0|1>", _CPU_PLACEMENT, check=_count),
    _LlamaOnly("--poll-batch", "<0|1>", _CPU_PLACEMENT, check=_count),
    _LlamaOnly("--prio-batch", "N", "the process runs at the priority it is started with", check=_priority),
    _LlamaOnly("-ub --ubatch-size", "N", "prefill runs as the backend runs it", check=_count,
               env="LLAMA_ARG_UBATCH"),
    _LlamaOnly("-b --batch-size", "N", "prefill runs as the backend runs it", check=_count, env="LLAMA_ARG_BATCH"),
    _LlamaOnly("-cb --cont-batching", "", _ONE_AT_A_TIME, env="LLAMA_ARG_CONT_BATCHING"),
    _LlamaOnly("-nocb --no-cont-batching", "", _ONE_AT_A_TIME, env="LLAMA_ARG_NO_CONT_BATCHING"),
    _LlamaOnly("-kvu --kv-unified", "", _ONE_AT_A_TIME, env="LLAMA_ARG_KV_UNIFIED"),
    _LlamaOnly("-no-kvu --no-kv-unified", "", _ONE_AT_A_TIME, env="LLAMA_ARG_NO_KV_UNIFIED"),
    _LlamaOnly("-sps --slot-prompt-similarity", "SIMILARITY", _ONE_AT_A_TIME + ", in one slot", check=_fraction),
    _LlamaOnly("-np --parallel", "N", _ONE_AT_A_TIME, check=_one_sequence, env="LLAMA_ARG_N_PARALLEL"),
    _LlamaOnly("-dt --defrag-thold", "N", "llama.cpp deprecated it as no longer necessary",
               env="LLAMA_ARG_DEFRAG_THOLD"),
    _LlamaOnly("-ctk --cache-type-k", "TYPE", "the KV cache's type is the bundle's", check=_kv_type,
               env="LLAMA_ARG_CACHE_TYPE_K"),
    _LlamaOnly("-ctv --cache-type-v", "TYPE", "the KV cache's type is the bundle's", check=_kv_type,
               env="LLAMA_ARG_CACHE_TYPE_V"),
    _LlamaOnly("-ctkd --cache-type-k-draft --spec-draft-type-k", "TYPE", "the KV cache's type is the bundle's",
               check=_kv_type, env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K LLAMA_ARG_CACHE_TYPE_K_DRAFT"),
    _LlamaOnly("-ctvd --cache-type-v-draft --spec-draft-type-v", "TYPE", "the KV cache's type is the bundle's",
               check=_kv_type, env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V LLAMA_ARG_CACHE_TYPE_V_DRAFT"),
    # the draft's context (0: "loaded from model"): a draft bundle's follows -c up to its own, fixed when it was built
    # (speculative.draft_context); the commands with no --draft refuse it by name, as they refuse -md
    _LlamaOnly("-cd --ctx-size-draft", "N", "a --draft bundle's context follows -c, up to its own, fixed when it was "
               "built",
               check=_context_size, env="LLAMA_ARG_CTX_SIZE_DRAFT", only="run serve",
               refused="it sets a draft model's context, and this command takes no draft model (edgesdk run and "
                       "serve take one with --draft): leave it out"),
    # the bundle's context: checked against it once the bundle is known (checked_ctx_size)
    _LlamaOnly("-c --ctx-size", "N", "", check=_context_size, keep="ctx_size"),
    # refused: each would change what edgesdk does, or names what it does not have
    _LlamaOnly("-hf -hfr --hf-repo", "<user>/<model>[:quant]", refused=_hf_repo_refusal),
    _LlamaOnly("-hff --hf-file", "FILE", refused=_hf_file_refusal),
    _LlamaOnly("-mu --model-url", refused="build a bundle with 'edgesdk build --model ...' and pass its directory"),
    _LlamaOnly("-dr --docker-repo", refused="build a bundle with 'edgesdk build --model ...' and pass its directory"),
    _LlamaOnly("-sp --special", refused="special tokens are never printed here: leave it out"),
    _LlamaOnly("-cml --chatml", refused="the chat template is the model's own: leave it out"),
    # two options of llama.cpp's (a template's name or text, and a file's path), each refused as itself
    *(_LlamaOnly(names, "JINJA_TEMPLATE", refused=_OWN_TEMPLATE + ", or pass --raw to feed the prompt as it is",
                 refused_in={"serve": _OWN_TEMPLATE + ", or send the prompt as it is to POST /v1/completions (or "
                                                      "/completion), which applies no template"})
      for names in ("--chat-template", "--chat-template-file")),
    # run prints the prompt's tokens on stderr before the answer, as llama-cli does (RunSettings.verbose_prompt)
    _LlamaOnly("--verbose-prompt", "", "", keep="verbose_prompt", only="run",
               refused="it prints the prompt's tokens before an answer, which 'edgesdk run --verbose-prompt' does; "
                       "leave it out here"),
    _LlamaOnly("--perf", refused="pass --stats: it prints the prompt and decode timings"),
    # llama-server's read/write timeout: edgesdk serve's own -to / --timeout, which the other commands lack
    _LlamaOnly("-to --timeout", "N", server=True),
    _LlamaOnly("-rea --reasoning", refused="pass --chat-template-kwargs '{\"enable_thinking\": false}' to turn "
                                           "thinking off",
               refused_in={"serve": "pass --reasoning-budget 0 to turn thinking off (-1, the default, leaves it on)"}),
    # llama.cpp's samplers that edgesdk has no counterpart for (common/arg.cpp's sampling options): the option that
    # turns each on is accepted at a value that leaves it off, as llama.cpp then samples without it, and refused by
    # name at another; the options that only tune one change nothing while it is off, and are accepted
    _LlamaOnly("--mirostat", "N", "edgesdk has no mirostat sampler, and llama.cpp's is off at 0",
               check=_SamplerOff("mirostat", "mirostat", "0", whole=True)),
    _LlamaOnly("--mirostat-lr", "N", _tunes("mirostat", "--mirostat 0, off"), check=_fraction),
    _LlamaOnly("--mirostat-ent", "N", _tunes("mirostat", "--mirostat 0, off"), check=_fraction),
    _LlamaOnly("--typical --typical-p", "N", "edgesdk has no locally typical sampler, and llama.cpp's is off at 1",
               check=_SamplerOff("locally typical", "typical_p", "1")),
    _LlamaOnly("--dry-multiplier", "N", "edgesdk has no DRY sampler, and llama.cpp's is off at 0 (or with "
                                        "--dry-penalty-last-n 0)",
               check=_SamplerOff("DRY", "dry_multiplier", "0", also="pass --dry-penalty-last-n 0")),
    _LlamaOnly("--dry-base", "N", _tunes("DRY", "--dry-multiplier 0, off"), check=_fraction),
    _LlamaOnly("--dry-allowed-length", "N", _tunes("DRY", "--dry-multiplier 0, off"), check=_count),
    _LlamaOnly("--dry-penalty-last-n", "N", _tunes("DRY", "--dry-multiplier 0, off"), check=_last_n),
    _LlamaOnly("--dry-sequence-breaker", "STRING", _tunes("DRY", "--dry-multiplier 0, off")),
    _LlamaOnly("--xtc-probability", "N", "edgesdk has no XTC sampler, and llama.cpp's is off at 0 (or with "
                                         "--xtc-threshold above 0.5)",
               check=_SamplerOff("XTC", "xtc_probability", "0", also="pass --xtc-threshold above 0.5, e.g. 0.6")),
    _LlamaOnly("--xtc-threshold", "N", _tunes("XTC", "--xtc-probability 0, off"), check=_fraction),
    _LlamaOnly("--top-nsigma --top-n-sigma", "N", "edgesdk has no top-n-sigma sampler, and llama.cpp's is off at -1",
               check=_SamplerOff("top-n-sigma", "top_n_sigma", "-1")),
    _LlamaOnly("--dynatemp-range", "N", "edgesdk has no dynamic temperature, and llama.cpp's is off at 0",
               check=_SamplerOff("dynamic temperature", "dynatemp_range", "0")),
    _LlamaOnly("--dynatemp-exp", "N", _tunes("dynamic temperature", "--dynatemp-range 0, off"), check=_fraction),
    _LlamaOnly("--adaptive-target", "N", "edgesdk has no adaptive-p sampler, and llama.cpp's is off below 0",
               check=_SamplerOff("adaptive-p", "adaptive_target", "-1")),
    _LlamaOnly("--adaptive-decay", "N", _tunes("adaptive-p", "--adaptive-target below 0, off"), check=_fraction),
    # llama.cpp's log at its most verbose, and the threshold of it (-lv N, read with std::stoi): edgesdk writes none
    _LlamaOnly("-v --verbose --log-verbose", "", "edgesdk writes no llama.cpp log; its own notes go to stderr"),
    _LlamaOnly("-lv --verbosity --log-verbosity", "N", "edgesdk writes no llama.cpp log; its own notes go to stderr",
               check=_count),
    # llama-server's HTTP options that edgesdk serve has no counterpart for
    _LlamaOnly("--threads-http", "N", "each request is read on a thread of its own, and " + _ONE_AT_A_TIME,
               server=True, check=_count, env="LLAMA_ARG_THREADS_HTTP"),
    _LlamaOnly("--slots", "", "GET /slots is always served", server=True),
    _LlamaOnly("--no-slots", refused="GET /slots is always served here: leave it out (a reverse proxy in front can "
                                     "hide the route)", server=True),
    _LlamaOnly("--props", refused="no POST /props changes the server's settings here (GET /props is served): "
                                  "leave it out, and give the settings as options at start", server=True),
    _LlamaOnly("--no-webui", "", "edgesdk serve has no web UI", server=True),
    _LlamaOnly("--webui", refused="edgesdk serve has no web UI: leave it out, and point a chat client for "
                                  "OpenAI-compatible servers (e.g. Open WebUI) at its /v1", server=True),
    _LlamaOnly("--path", "PATH", refused="edgesdk serve serves no static files: leave it out, and let a web server "
                                         "serve the folder", server=True),
    _LlamaOnly("--api-prefix", "PREFIX", refused="the routes are served at the root (/v1/...): leave it out, or put "
                                                 "a reverse proxy in front that strips the prefix", server=True),
    _LlamaOnly("--api-key-file", "FNAME", refused="pass the keys in EDGESDK_API_KEY (or LLAMA_API_KEY), comma-"
                                                  "separated, as edgesdk serve's --api-key reads them: "
                                                  "EDGESDK_API_KEY=\"$(paste -sd, FNAME)\" for a file of one key a "
                                                  "line", server=True),
    *(_LlamaOnly(name, "FNAME", refused="edgesdk serve speaks plain HTTP: leave it out, and put a reverse proxy "
                                        "that holds the certificate (nginx, Caddy) in front", server=True)
      for name in ("--ssl-key-file", "--ssl-cert-file")),
    _LlamaOnly("-cram --cache-ram", refused="edgesdk serve's --cache-ram MIB keeps other conversations' KV caches"),
    # llama-server's --embedding restricts it to the embedding routes; edgesdk serve answers them beside the others
    _LlamaOnly("--embedding --embeddings", "", "embeddings are always served (POST /v1/embeddings, /embedding, "
                                               "Ollama's /api/embed), beside the chat and completion routes",
               server=True, env="LLAMA_ARG_EMBEDDINGS"),
    _LlamaOnly("--reranking --rerank", refused="edgesdk serve has no reranker (llama-server's POST /v1/rerank): leave "
                                               "it out, and rank documents by the cosine similarity of their POST "
                                               "/v1/embeddings vectors to the query's", server=True),
    # llama-server's reuse of KV chunks past the common prefix by shifting them (n_cache_reuse; 0, its default: off)
    _LlamaOnly("--cache-reuse", "N", "llama-server reuses no KV chunks past a prompt's common prefix at 0, and edgesdk "
                                     "serve reuses that prefix alone",
               check=_off_at(0, "edgesdk serve reuses only the prefix a prompt shares with the KV cache (--cache-ram "
                                "keeps other conversations' caches), never chunks after it by shifting them"),
               server=True, env="LLAMA_ARG_CACHE_REUSE"),
    # llama-server's sleep of an idle server (its model unloaded, loaded again by the next request; -1, its default:
    # never): with several bundles served, how long the loaded model stays idle before it is unloaded, as Ollama's
    # OLLAMA_KEEP_ALIVE (cli_serve._idle_unload_s; one bundle's model stays loaded, which serve says)
    _LlamaOnly("--sleep-idle-seconds", "SECONDS", "", keep="sleep_idle_seconds",
               check=lambda flag, value, command: None if whole_number(value) and (int(value) == -1 or int(value) > 0)
               else f"{value!r} is not a number of seconds llama.cpp's {flag} takes: pass a whole number above 0 (the "
                    "seconds an idle model stays loaded), or -1 (never unloaded)",
               server=True),
    # llama-server's router options (--models-dir is edgesdk serve's own): one model loaded at a time, a request
    # naming another swapping it in (serve/model_pool.py)
    _LlamaOnly("--models-max", "N", "edgesdk serve holds one model loaded at a time already", check=_models_max,
               server=True, env="LLAMA_ARG_MODELS_MAX"),
    _LlamaOnly("--models-autoload", "", "a request naming a model loads it already", server=True),
    _LlamaOnly("--no-models-autoload", refused="a request naming a model that is not loaded loads it here (a board "
                                               "holds one, so it swaps the idle one out), with no switch to turn that "
                                               "off: leave it out, and load a model ahead of its requests with POST "
                                               "/models/load", server=True),
    _LlamaOnly("--models-preset", "PATH", refused="no preset file is read here: each bundle carries its own "
                                                  "sampling defaults (its manifest's), the server's options apply to "
                                                  "every model, and --alias NAME=BUNDLE renames one; leave it out",
               server=True),
    _LlamaOnly("--slot-save-path", "PATH", refused="no slot's KV cache is written to or read from a file here (no "
                                                   "POST /slots/{id}?action=save): the caches of recent "
                                                   "conversations stay in memory (--cache-ram MIB); leave it out",
               server=True),
    # llama-cli's prompt cache file: edgesdk run's own --prompt-cache, which serve has no counterpart for
    *(_LlamaOnly(names, value, refused="it is llama-cli's prompt cache file, which 'edgesdk run --prompt-cache FILE' "
                                       "writes and reads: leave it out here",
                 refused_in={"serve": "it is llama-cli's prompt cache file ('edgesdk run --prompt-cache FILE' writes "
                                      "and reads one); edgesdk serve keeps the KV caches of recent conversations in "
                                      "memory instead (--cache-ram MIB sets how much; --no-cache-prompt turns reuse "
                                      "off): leave it out"})
      for names, value in (("--prompt-cache", "FNAME"), ("--prompt-cache-all", ""), ("--prompt-cache-ro", ""))),
    # a full-size KV cache for sliding-window layers: what every bundle's graph keeps (no ring buffer)
    _LlamaOnly("--swa-full", "", "the KV cache keeps every position of a sliding-window layer already (no ring "
                                 "buffer)", env="LLAMA_ARG_SWA_FULL"),
    _LlamaOnly("--lora", "FNAME", refused=_MERGED_LORA.format(build="--lora ADAPTER"),
               refused_in={"serve": _MERGED_LORA.format(build="--lora ADAPTER") + _SERVED_LORAS}),
    _LlamaOnly("--lora-scaled", "FNAME:SCALE", refused=_MERGED_LORA.format(build="--lora-scaled ADAPTER SCALE"),
               refused_in={"serve": _MERGED_LORA.format(build="--lora-scaled ADAPTER SCALE") + _SERVED_LORAS}),
    _LlamaOnly("--lora-init-without-apply", refused="no LoRA adapter is loaded or applied while edgesdk serve runs (no "
                                                    "/lora-adapters): " + _MERGED_LORA.format(build="--lora ADAPTER")
                                                    + _SERVED_LORAS, server=True),
    # llama-perplexity's strided perplexity (perplexity_v2 in tools/perplexity/perplexity.cpp): windows of n_ctx
    # tokens started N apart, only the last N tokens of each scored, the first window's too
    _LlamaOnly("--ppl-stride", "N", refused="it is llama-perplexity's strided perplexity: 'edgesdk eval "
                                            "--method llama-perplexity --ppl-stride N' computes it"),
    _LlamaOnly("--ppl-output-type", "0|1", refused="edgesdk eval prints its figures as text, or as JSON with "
                                                   "--json: pass --json, or leave it out"),
] + [_LlamaOnly(names, value) for names, value in (
    # llama.cpp's other options spelled with one dash and several letters (common/arg.cpp), refused by name; each
    # with its value as common/arg.cpp names it ("": a switch), so that --binary-file=FILE is refused as itself
    ("-cl --cache-list", ""), ("-lcs --lookup-cache-static", "FNAME"), ("-lcd --lookup-cache-dynamic", "FNAME"),
    ("-ctxcp --ctx-checkpoints --swa-checkpoints", "N"), ("-cms --checkpoint-min-step", "N"),
    ("-ptc --print-token-count", "N"), ("-bf --binary-file", "FNAME"), ("-gan --grp-attn-n", "N"),
    ("-gaw --grp-attn-w", "N"), ("-bs --backend-sampling", ""), ("-ns --sequences", "N"), ("-mm --mmproj", "FILE"),
    ("-mmu --mmproj-url", "URL"), ("-fitp --fit-print", "on|off"), ("-hfv -hfrv --hf-repo-v", "<user>/<model>"),
    ("-hffv --hf-file-v", "FILE"), ("-hft --hf-token", "TOKEN"), ("-ofreq --output-frequency", "N"), ("-pps", ""),
    ("-tgs", ""), ("-npp", "n0,n1,..."), ("-ntg", "n0,n1,..."), ("-npl", "n0,n1,..."),
    ("-hfd -hfrd --hf-repo-draft --spec-draft-hf", "<user>/<model>"),
    ("-td --threads-draft", "N"), ("-tbd --threads-batch-draft", "N"), ("-Cd --cpu-mask-draft", "M"),
    ("-Crd --cpu-range-draft", "lo-hi"), ("-Cbd --cpu-mask-batch-draft", "M"), ("-Crbd --cpu-range-batch-draft", "lo-hi"),
    ("-otd --override-tensor-draft", "PATTERN"), ("-cmoed --cpu-moe-draft", ""),
    ("-ncmoed --n-cpu-moe-draft", "N"), ("-md --model-draft", "FNAME"), ("-mv --model-vocoder", "FNAME"),
    ("-ag --agent", ""), ("-no-ag --no-agent", ""),
    ("-dkvc --dump-kv-cache", ""), ("-cnv --conversation", ""), ("-no-cnv --no-conversation", ""),
    ("-st --single-turn", ""), ("-if --interactive-first", ""), ("-mli --multiline-input", ""),
    ("-sys --system-prompt", "PROMPT"), ("-sysf --system-prompt-file", "FNAME"), ("-jf --json-schema-file", "FILE"),
    ("-lr --learning-rate", "ALPHA"), ("-lr-min --learning-rate-min", "ALPHA"),
    ("-decay-epochs --learning-rate-decay-epochs", "ALPHA"), ("-wd --weight-decay", "WD"),
    ("-val-split --val-split", "FRACTION"), ("-epochs --epochs", "N"), ("-opt --optimizer", "sgd|adamw"))]


def _bench_kv_type(flag: str, value: str, command: str) -> str | None:
    """llama-bench's ``-ctk/-ctv TYPE[,TYPE...]``: f16 alone, as :func:`_kv_type`."""
    return None if all(part.strip().lower() == "f16" for part in value.split(",")) else _kv_type(flag, value, command)


def _bench_off(flag: str, value: str, command: str) -> str | None:
    """A llama-bench test parameter edgesdk bench has no test for: 0 (its default, off) only."""
    if all(part.strip() == "0" for part in value.split(",")):
        return None
    return f"is {value}, and edgesdk bench has no such test (it runs ppN and tgN): pass {flag} 0 or leave it out"


def _bench_depth(flag: str, value: str, command: str) -> str | None:
    """llama-bench's ``-d N[,N...]``: the tokens in the cache before each test; 0 (its default) only, as each test
    here starts from an empty cache."""
    if all(part.strip() == "0" for part in value.split(",")):
        return None
    return (f"is {value}, and edgesdk bench runs each test from an empty cache (depth 0): pass {flag} 0 or leave it "
            "out")


def _bench_default(default: str, fix: str):
    """A llama-bench option accepted at its default value alone (``default``; ``fix`` says what to do instead)."""
    def check(flag: str, value: str, command: str) -> str | None:
        if all(part.strip().lower() == default for part in value.split(",")):
            return None
        return f"is {value}, and edgesdk bench has nothing to set for it: {fix}, and pass {flag} {default} or leave it out"
    return check


def _bench_flash_attn(flag: str, value: str, command: str) -> str | None:
    """llama-bench's ``-fa``: comma-separated values, each one common/arg.cpp's is_truthy, is_falsey or is_autoy
    reads (on|enabled|true|1, off|disabled|false|0, auto|-1; older llama-bench took 0|1), as llama-bench refuses
    any other ("invalid parameter for argument")."""
    words = LLAMA_TRUTHY + LLAMA_FALSEY + ("auto", "-1")
    wrong = [part for part in value.split(",") if part not in words]
    if not wrong:
        return None
    return (f"{value!r} holds {', '.join(repr(part) for part in wrong)}, which llama-bench's {flag} does not take: "
            f"give on|off|auto (or 1|0|-1), comma-separated for several; it changes nothing here")


# llama-bench's test parameters (tools/llama-bench/README.md: each takes a value, 0|1 for a switch, several values
# comma-separated) that edgesdk bench has no option for; the others of llama.cpp's options are run's (_LLAMA_ONLY)
_BENCH_ONLY = [
    _LlamaOnly("-ngl --n-gpu-layers", "N", _PLACEMENT),
    _LlamaOnly("-sm --split-mode", "MODE", _PLACEMENT),
    _LlamaOnly("-mg --main-gpu", "I", _PLACEMENT),
    _LlamaOnly("-ts --tensor-split", "SPLIT", _PLACEMENT),
    _LlamaOnly("-dev --device", "DEVICES", _PLACEMENT),
    _LlamaOnly("-ot --override-tensors", "PATTERN", _PLACEMENT),
    _LlamaOnly("-nkvo --no-kv-offload", "0|1", _PLACEMENT),
    _LlamaOnly("-nopo --no-op-offload", "0|1", _PLACEMENT),
    _LlamaOnly("-ncmoe --n-cpu-moe", "N", _PLACEMENT),
    _LlamaOnly("-fa --flash-attn", "on|off|auto", "attention runs as the bundle's graph computes it, with the "
                                                 "kernels its backend picks", check=_bench_flash_attn),
    _LlamaOnly("-mmp --mmap", "0|1", _WEIGHTS),
    _LlamaOnly("-b --batch-size", "N", "prefill runs as the backend runs it"),
    _LlamaOnly("-ub --ubatch-size", "N", "prefill runs as the backend runs it"),
    _LlamaOnly("-dt --defrag-thold", "F", "llama.cpp deprecated it as no longer necessary"),
    _LlamaOnly("--cpu-strict", "0|1", _CPU_PLACEMENT),
    _LlamaOnly("--poll", "0...100", _CPU_PLACEMENT),
    _LlamaOnly("-ctk --cache-type-k", "TYPE", "the KV cache's type is the bundle's", check=_bench_kv_type),
    _LlamaOnly("-ctv --cache-type-v", "TYPE", "the KV cache's type is the bundle's", check=_bench_kv_type),
    _LlamaOnly("-embd --embeddings", "0|1", "no embeddings test is run", check=_bench_off),
    _LlamaOnly("-d --n-depth", "N", "each test starts from an empty cache", check=_bench_depth),
    _LlamaOnly("-lm --load-mode", "MODE", _WEIGHTS),
    _LlamaOnly("-dio --direct-io", "0|1", _WEIGHTS),
    _LlamaOnly("--no-host", "0|1", _PLACEMENT),
    _LlamaOnly("-v --verbose", "", "the runtime's notes are said on stderr already"),
    _LlamaOnly("--offline", "", "edgesdk bench downloads nothing"),
    _LlamaOnly("--prio", "N", "the process runs at its own priority",
               check=_bench_default("0", "run it under nice or chrt for another priority")),
    _LlamaOnly("-C --cpu-mask", "MASK", _CPU_PLACEMENT,
               check=_bench_default("0x0", "run it under taskset -c CPUS to pin it (the conditions count those CPUs)")),
    _LlamaOnly("--numa", refused="the runtime places its threads itself: run it under numactl for a NUMA policy"),
    _LlamaOnly("--list-devices", refused="the backend and device come from the bundle's target profile "
                                         "('edgesdk inspect BUNDLE' names them)"),
    _LlamaOnly("-rpc --rpc", refused="edgesdk runs the bundle on this board only: leave it out"),
    _LlamaOnly("-c --ctx-size", refused="the tests' sizes are -p and -n (within the bundle's context)"),
    _LlamaOnly("-nocb"),
]


def _name_and_value(arg: str, own: dict[str, int], known: dict[str, _LlamaOnly]) -> tuple[str, str, str]:
    """``arg`` as (name, "=", value) where it is an option given with its value (``--name=value``, and
    ``-name=value`` for a llama.cpp option the command does not have itself: click would read ``-ngl=99`` as
    ``-n gl=99`` and ``-hf=ORG/NAME`` as -h, the help), (arg, "", "") otherwise."""
    if arg.startswith("--"):
        return arg.partition("=")
    name, equals, inline = arg.partition("=")
    if equals and name in known and name not in own:
        return name, equals, inline
    return arg, "", ""


def _llama_only_by_name(table: list[_LlamaOnly] | None = None) -> dict[str, _LlamaOnly]:
    """llama.cpp's options by each of their names; llama-bench's (``table``) first where both spell one."""
    found = {name: option for option in _LLAMA_ONLY for name in option.names}
    found.update({name: option for option in table or [] for name in option.names})
    return found


class LlamaCommand(click.Command):
    """A command that reads llama.cpp's options edgesdk lacks by name, before click parses (see ``_LLAMA_ONLY``):
    accepted where they change nothing here (said once on stderr, with why), refused naming the option otherwise,
    never misread as other options (click reads ``-ngl 99`` as ``-n gl``). An option the command has itself (run's
    -sys, serve's -b) is the command's; a llama.cpp short spelling of an option the command has under its long name
    (``-cram`` for serve's --cache-ram) is read as that option. ``-c N`` is kept in the context's meta for
    :func:`checked_ctx_size`, unless ``llama_aliases`` maps it to one of the command's own options (eval's
    --context is llama-perplexity's -c): each llama.cpp name there is read as that option."""

    def __init__(self, *args, llama_aliases: dict[str, str] | None = None, llama_bench: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.llama_aliases = dict(llama_aliases or {})
        self.llama_table = _BENCH_ONLY if llama_bench else None  # bench: llama-bench's test parameters

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, self._llama_args(ctx, list(args)))

    def _own_options(self, ctx) -> dict[str, int]:
        """The command's option names (as typed, and as normalized) and how many values each takes."""
        names: dict[str, int] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                takes = 0 if param.is_flag or param.count else param.nargs
                for name in param.opts + param.secondary_opts:
                    names[name] = takes
        return names

    @staticmethod
    def _asks_for_help(ctx, args: list[str], own: dict[str, int]) -> bool:
        """Whether ``args`` hold a help option as click reads them: not the value of an option (``-p -h`` is a
        prompt, ``-r --help`` a reverse prompt) nor an argument after ``--``; click shows no help for those and
        runs the command, so llama.cpp's options must then be read (a ``-c 4096`` checked, a ``-hf`` refused)."""
        index = 0
        while index < len(args):
            arg = args[index]
            index += 1
            if arg == "--":
                return False
            if arg in ctx.help_option_names:
                return True
            name = _llama_option_name(arg.partition("=")[0]) if arg.startswith("--") else arg
            if own.get(name) and not (arg.startswith("--") and "=" in arg):
                index += own[name]  # its value, whatever it looks like
        return False

    def _option_names(self, ctx) -> dict[str, str]:
        """Each of the command's option names (as click matches them) with its parameter's name."""
        return {name: param.name for param in self.get_params(ctx) if isinstance(param, click.Option)
                for name in param.opts + param.secondary_opts}

    def _llama_args(self, ctx, args: list[str]) -> list[str]:
        own, known = self._own_options(ctx), _llama_only_by_name(self.llama_table)
        typed = ctx.meta.setdefault(_TYPED, {})  # parameter -> the name it was given by, the last one (typed_option)
        given = ctx.meta.setdefault(_GIVEN, {})  # llama.cpp's options read here -> the name typed, the last one
        params = self._option_names(ctx)
        # --help shows the help, and shell completion parses resiliently: llama.cpp's options are dropped unread
        helping = ctx.resilient_parsing or self._asks_for_help(ctx, args, own)
        kept, notes, index = [], [], 0
        values: dict[str, str] = {}  # llama.cpp's options read here (by long name) -> their values
        samplers: list[tuple[str, _LlamaOnly, str]] = []  # the sampler options checked with the others' values
        while index < len(args):
            arg = args[index]
            index += 1
            if arg == "--":
                kept.extend(args[index - 1:])
                break
            name, equals, inline = _name_and_value(arg, own, known)
            if name.startswith("--"):
                name = _llama_option_name(name)
            if name in own or not arg.startswith("-") or name not in known:
                if name in own and arg.startswith("-"):
                    typed[params[name]] = name
                kept.append(arg)
                if name in own and own[name] and not equals:  # its value, kept as it is (-p -st is a prompt)
                    kept.extend(args[index:index + own[name]])
                    index += own[name]
                continue
            option = known[name]
            same = self.llama_aliases.get(name) or (option.long if option.long in own else None)
            if same is not None:  # llama.cpp's name of an option this command has (-cram: --cache-ram): that option
                if same in params:
                    typed[params[same]] = name
                kept.append(same + (f"={inline}" if equals else ""))
                continue
            if not option.accepted_in(self.name) and not helping:  # refused by name, whatever its value
                given = (inline if equals else args[index] if index < len(args) else None) if option.value else None
                raise click.UsageError(f"{name} is llama.cpp's {option.long}, which edgesdk {self.name} does not "
                                       f"have: {option.refusal(self.name, given)}", ctx=ctx)
            value = None
            if option.value.startswith("["):  # an optional value (older llama.cpp: a switch)
                if equals:
                    value = inline
                elif index < len(args) and args[index].lower() in _SWITCH_WORDS:
                    value = args[index]
                    index += 1
            elif option.value:
                if equals:
                    value = inline
                elif index < len(args):
                    value = args[index]
                    index += 1
                elif not helping:
                    raise click.UsageError(f"{arg} (llama.cpp's {option.long}) needs a value ({option.value})",
                                           ctx=ctx)
            elif equals and not helping:
                raise click.UsageError(f"{arg} (llama.cpp's {option.long}) is a switch and takes no value", ctx=ctx)
            if helping:
                continue
            given[option.long] = name
            if value is not None:
                values[option.long] = value  # the last one given, as llama.cpp reads an option given twice
            if isinstance(option.check, _SamplerOff) and value is not None:  # it reads other options' values
                samplers.append((name, option, value))  # checked once all are read
            else:
                refusal = option.check(name, value, self.name) if option.check and value is not None else None
                if refusal is not None:
                    raise click.BadParameter(refusal, ctx=ctx, param_hint=f"'{name}' (llama.cpp's {option.long})")
            if option.keep:
                ctx.meta[f"edgesdk.llama.{option.keep}"] = (name, None if value is None else int(value))
            elif self.name == "bench" and value is not None and len(value.split(",")) > 1:
                # llama-bench runs a test for each listed value (each combination with another list): here one row
                notes.append((f"{name} {value}", f"{option.why}; its {len(value.split(','))} values run once here, "
                                                 "as one row, where llama-bench runs a test for each"))
            elif (name, option.why) not in notes:
                notes.append((name, option.why))
        for name, option, value in samplers:
            refusal = option.check(name, value, self.name, values)
            if refusal is not None:
                raise click.BadParameter(refusal, ctx=ctx, param_hint=f"'{name}' (llama.cpp's {option.long})")
        for name, why in notes:
            click.echo(f"edgesdk: {name} is accepted for llama.cpp's scripts and changes nothing here: {why}", err=True)
        return kept


# edgesdk build's --max-context when not given (ExportConfig.max_context): not imported, as importing this module
# imports click alone
BUILD_MAX_CONTEXT = 4096


def _rebuild_hint(size: int | None, max_context: int, bundle=None) -> str:
    """How to get a bundle of a context ``size`` past ``max_context``, the bundle's (None: a size not given as a
    number; a smaller one needs no build, it runs as the context: :func:`checked_ctx_size`): 'edgesdk build
    --max-context', which the model's max_position_embeddings caps (the build makes the bundle's context the smaller
    of the two). Where ``bundle``'s manifest records the model's limit (its
    ``model.before.max_position_embeddings``), an ask past it names the largest --max-context the model allows, or
    says this bundle is at it; where it does not (bundles built before it was recorded), an ask past the bundle's
    context says which bundles are at it: one built without --max-context whose context is under the build's
    default, BUILD_MAX_CONTEXT."""
    from edgesdk.bundle import at_model_positions, largest_context_rebuild, rebuild_with

    hint = f"for another size {rebuild_with(size or 'N')}"
    positions = None
    if bundle is not None:
        from edgesdk.bundle import model_positions, read_manifest
        from edgesdk.errors import EdgeSDKError

        try:  # read_manifest refuses a recorded limit that is no whole number
            positions = model_positions(read_manifest(Path(bundle)))
        except EdgeSDKError:  # no bundle there: the limit is left unsaid, as for a bundle without it
            positions = None
    if positions is not None:
        if size is not None and size <= positions:
            return hint
        if max_context >= positions:
            return at_model_positions(positions)
        if size is None:
            return f"{hint}, N up to {positions} (the model's max_position_embeddings)"
        return f"for a longer context {largest_context_rebuild(positions)}"
    if max_context >= BUILD_MAX_CONTEXT:
        return f"{hint}, which the model's max_position_embeddings caps (the build says where it does)"
    return (f"{hint}, which the model's max_position_embeddings caps: where this bundle was built without "
            f"--max-context ({BUILD_MAX_CONTEXT} by default), {max_context} is that cap, and no build of the model "
            f"goes past it")


def llama_switch_given(keep: str) -> bool:
    """Whether the llama.cpp switch kept as ``keep`` (:class:`_LlamaOnly`'s, e.g. ``verbose_prompt``) was given to
    the command running now."""
    context = click.get_current_context(silent=True)
    return context is not None and context.meta.get(f"edgesdk.llama.{keep}") is not None


def checked_ctx_size(max_context: int, bundle) -> int:
    """The context a run of ``bundle`` holds, from llama.cpp's ``-c N`` / ``--ctx-size N`` (kept by
    :class:`LlamaCommand`), else from LLAMA_ARG_CTX_SIZE, the environment's ``-c`` (common/arg.cpp), where it is a
    size the bundle holds: N from 1 to the bundle's context ``max_context`` is the run's context, as llama.cpp makes
    it (a Pi user's ``-c 512`` caps the KV cache; a prompt past it is refused, a chat leaves out its oldest exchanges
    at it); 0 (llama.cpp's "loaded from model") or neither given is the bundle's. More than the bundle's is refused
    by name with the rebuild that holds it: the graph's KV cache and rotary tables are sized when it is built. The
    caller holds its runtime to it (:meth:`edgesdk.runtime.session.Runtime.cap_context`)."""
    context = click.get_current_context(silent=True)
    given = None if context is None else context.meta.get("edgesdk.llama.ctx_size")
    if given is None:
        return _ctx_size_from_env(max_context) or max_context
    flag, size = given
    if size <= max_context:
        return size or max_context
    raise click.BadParameter(
        f"is {size}, and the context of {bundle} is {max_context} tokens, fixed when it was built: pass {flag} "
        f"{max_context} or less (0: the bundle's), or leave it out; {_rebuild_hint(size, max_context, bundle)}",
        param_hint=f"'{flag}' (llama.cpp's --ctx-size)")


CTX_SIZE_ENV = "LLAMA_ARG_CTX_SIZE"  # llama.cpp's -c / --ctx-size (common/arg.cpp ``set_env("LLAMA_ARG_CTX_SIZE")``)


def _ctx_size_from_env(max_context: int) -> int | None:
    """LLAMA_ARG_CTX_SIZE's size where it is one the bundle of context ``max_context`` holds (1 to it), None where
    not (unset, 0: the bundle's, or a value :func:`_ctx_size_env_unlike` says why it is not read)."""
    raw = os.environ.get(CTX_SIZE_ENV)
    if raw and whole_number(raw) and 0 < int(raw) <= max_context:
        return int(raw)
    return None


def _ctx_size_env_unlike(max_context: int, bundle) -> str | None:
    """Why LLAMA_ARG_CTX_SIZE's value is not the context that runs, None where it is (unset, 0: llama.cpp's "loaded
    from model", or a size from 1 to the bundle's context ``max_context``): another value, or more than the bundle
    holds."""
    raw = os.environ.get(CTX_SIZE_ENV)
    if not raw or (whole_number(raw) and 0 <= int(raw) <= max_context):
        return None
    size = int(raw) if whole_number(raw) and int(raw) > 0 else None
    return (f"the context of {bundle} is {max_context} tokens, fixed when it was built; set {CTX_SIZE_ENV} to at "
            f"most {max_context} (0: the bundle's), or unset it; {_rebuild_hint(size, max_context, bundle)}")


def ctx_size_source() -> str:
    """What gives the running command's context (:func:`checked_ctx_size`), as a refusal past it names it and the
    setting its fix raises (:meth:`edgesdk.runtime.session.Runtime.cap_context`'s ``source``): ``-c`` where the
    command line has ``-c`` / ``--ctx-size``, else LLAMA_ARG_CTX_SIZE: a run held by the variable was told it was
    held by ``-c``, and to raise ``-c``, which its user never passed."""
    context = click.get_current_context(silent=True)
    given = None if context is None else context.meta.get("edgesdk.llama.ctx_size")
    return "-c" if given is not None or not os.environ.get(CTX_SIZE_ENV) else CTX_SIZE_ENV


def checked_ctx_size_env(max_context: int, bundle) -> None:
    """LLAMA_ARG_CTX_SIZE, the environment's ``-c`` (common/arg.cpp), checked against the bundle's context as
    :func:`checked_ctx_size` checks ``-c``: 0 and sizes up to the bundle's context are taken (:func:`checked_ctx_size`
    makes them the context), another value or a larger size is refused naming the variable (where a command refuses
    a ``-c`` it cannot hold, e.g. serve). ``-c`` on the command line goes over it: then the variable is not checked
    (:func:`ctx_size_env_note` says so)."""
    context = click.get_current_context(silent=True)
    if context is not None and context.meta.get("edgesdk.llama.ctx_size") is not None:
        return
    why = _ctx_size_env_unlike(max_context, bundle)
    if why is not None:
        raise click.BadParameter(f"is {os.environ[CTX_SIZE_ENV]!r}, and {why}",
                                 param_hint=f"{CTX_SIZE_ENV} (llama.cpp's -c / --ctx-size)")


def ctx_size_env_note(max_context: int, bundle) -> str | None:
    """What to say of llama.cpp's LLAMA_ARG_CTX_SIZE (the environment's ``-c``, which llama-cli and llama-server act
    on) once the run's context ``max_context`` is known, None where nothing: unset, or 0 / a size up to it (what
    runs, :func:`checked_ctx_size`). Another value, or a size past the bundle's context, fixed when it was built, is
    not what runs: said, not ignored silently; ``-c`` on the command line goes over it, as common/arg.cpp warns
    ("environment variable is set, but will be overwritten by command line argument")."""
    raw = os.environ.get(CTX_SIZE_ENV)
    if not raw:
        return None
    context = click.get_current_context(silent=True)
    given = None if context is None else context.meta.get("edgesdk.llama.ctx_size")
    if given is not None:
        return f"{CTX_SIZE_ENV} is set, but {given[0]} on the command line goes over it"
    why = _ctx_size_env_unlike(max_context, bundle)
    return None if why is None else f"{CTX_SIZE_ENV}={raw!r} is not read: {why}"
