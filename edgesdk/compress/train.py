"""The training loop the QAT and distillation stages share: AdamW, gradient accumulation,
clipping, a cosine learning-rate decay, an optional gradient-scaling schedule and a progress
bar with ETA. Inside a build (:func:`keeping_progress`) the training in flight is kept in the work directory at
update boundaries, and a resumed build goes on from the last batch kept."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import inspect
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from edgesdk.errors import BuildError

MIN_RAMP_UPDATES = 2  # the shortest warmup that ramps: its first update at half the rate
LossFn = Callable[[torch.Tensor, float], tuple[torch.Tensor, dict[str, float]]]


@dataclass(frozen=True)
class LoopSettings:
    lr: float
    grad_accumulation: int = 1
    grad_scaling: bool = False  # seed 004 §2.3: gradients x 1 / (1 + 0.001 * step)
    clip_norm: float = 1.0
    warmup_fraction: float = 0.05
    checkpoint_interval_s: float = 300.0  # keep the training in flight at most this often (0: after every update)


# Stage settings that say how often the training in flight is kept, never what it computes: not part of the build key
# (a resumed build with another value goes on from the training kept) nor of a kept training's identity.
PROGRESS_ONLY_FIELDS = ("checkpoint_interval_s",)


def check_checkpoint_interval(value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
        raise ValueError(f"checkpoint_interval_s must be a finite number of seconds >= 0 (0: after every update), "
                         f"got {value}")


def trains_with_the_backbone(name: str, train_embedding: bool) -> bool:
    """Whether QAT or distillation trains the parameter ``name``: every backbone weight but the
    embedding unless ``train_embedding``; never a power adapter (``.power_adapter.``), which the power
    stage trained on its own losses and calibrated the runtime's threshold for."""
    return (train_embedding or "embed_tokens" not in name) and ".power_adapter." not in name


def check_optimiser_settings(lr: float, temperature: float, grad_accumulation: int = 1) -> None:
    """A learning rate and a distillation temperature that train at all (positive and finite), and at
    least one batch per optimizer step."""
    for name, value in (("lr", lr), ("temperature", temperature)):
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value}")
    if grad_accumulation < 1:
        raise ValueError(f"grad_accumulation must be >= 1, got {grad_accumulation}")


def gradient_scale(step: int) -> float:
    """The seed's schedule (§2.3). Under Adam a common gradient factor cancels in m / sqrt(v)
    (up to epsilon and clipping), so it acts only through those: its effect is measured, not assumed."""
    return 1.0 / (1.0 + 0.001 * step)


def warmup_updates(updates: int, fraction: float) -> int:
    """The updates over which the learning rate ramps up to its full value: ``fraction`` of them (5 of the default
    recipe's 112 at 0.05), but at least ``MIN_RAMP_UPDATES`` in a run of four times as many or more. Rounded down
    alone, the fraction gave one update to every run under 40 updates (QAT's default 16, distillation's 32), and a
    ramp of one update is none: its one update runs at the full rate, on an optimizer with no moment estimates
    yet. That floor never takes more than a quarter of the run."""
    return max(1, int(fraction * updates), min(MIN_RAMP_UPDATES, updates // 4))


def check_finite(what: str, value: torch.Tensor, desc: str, index: int, count: int, updates_done: int,
                 lr: float) -> None:
    """Refuse a non-finite loss or gradient norm before the optimizer step: AdamW would write NaN into every
    trained weight, the stage would finish and be checkpointed (so ``--resume`` kept the NaN model), and only the
    export, stages later, said that "a stage" diverged. ``desc`` is the stage's name; a loss that is not finite
    before any update is the doing of the model the stage was given (or of its teacher), not of the training; so is
    a gradient that is not finite before any update (a finite loss the given weights differentiate to inf or NaN):
    no step has run at the learning rate yet, so a lower one changes nothing."""
    if torch.isfinite(value).all():
        return
    where = f"stage '{desc}': the training {what} is {value.item()} at batch {index + 1} of {count}"
    if not updates_done:
        culprit = ("the model the stage was given, or its teacher, already computes non-finite values" if what == "loss"
                   else "the model the stage was given already computes a non-finite gradient of a finite loss")
        raise BuildError(f"{where}, before any update: {culprit}", "check the stages before it and the source model (run "
                         "the build without them to find the one that diverged)")
    raise BuildError(f"{where}, after {updates_done} update(s) at lr {lr:g}: the training diverged, and no "
                     "checkpoint of the stage was written",
                     f"lower {desc}.lr, e.g. to {lr / 10:g}, and rebuild")


# What a fake-quantized linear (edgesdk/compress/fake_quant.py QuantLinear) carries besides its weight that the
# training changes: its 4-bit block scales, searched again every SCALE_REFRESH updates only, and their age (a resumed
# training takes up the scales the stopped one used, at the same age), and its observed per-tensor input range.
MODULE_STATE = ("_scales", "_scale_age", "input_absmax")
MODULE_CACHE = ("_cached", "_inside", "_cached_version")  # the codes of the weight as it was: made again after a load
KEPT_LAYOUT = 1  # the layout of a kept training's file
KEPT_DIGEST = ".sha256"  # beside a kept training's file: its sha256, checked before it is loaded


def keeps_training(stage: str) -> bool:
    """Whether stage ``stage`` keeps its training in flight: its config says how often (a PROGRESS_ONLY_FIELDS
    setting), as QAT's, distillation's and the power stage's do. The others (the stages that train nothing) start over
    when a stopped build is resumed."""
    from dataclasses import fields

    from edgesdk.build.registry import stage_spec

    try:
        config = stage_spec(stage).config_class
    except BuildError:  # not a registered stage
        return False
    return any(field.name in PROGRESS_ONLY_FIELDS for field in fields(config))


@dataclass
class TrainingProgress:
    """Where a build keeps the training in flight of the stage it runs (``path``, in its work directory) and how it
    tells of it (``log``, in the caller's ``terms``). ``identity``: a digest of the build's inputs the stage depends on
    (its settings and those of the stages before it, the model, data and target): a kept training made under others is
    removed, never loaded. :func:`run_training` sets ``total`` (the stage's batches), ``kept`` (the batches trained in
    the file on disk; None while there is none) and ``resumed_from`` (the batch a resumed training went on from)."""

    path: Path
    stage: str
    identity: str
    log: Callable[[str], None]
    terms: str = "cli"
    unit: str = "batch"  # what ``total`` and ``kept`` count: run_training's batches, the power stage's rounds
    total: int | None = None
    kept: int | None = None
    resumed_from: int = 0
    warned: bool = False
    first: int | None = None  # the first batch a training can be kept at: the end of its first update
    digest: str | None = None  # the sha256 of the file on disk, once written or loaded
    doing: str | None = None  # what the stage does before its training (:func:`setting_up`), while it does it
    losing: str | None = None  # what a stop there loses, which --resume makes again

    def discard(self) -> None:
        """Remove the kept training (the stage finished, or it belongs to other settings)."""
        for path in (self.path, self._tmp(), self._digest_path(), self._tmp(self._digest_path())):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        self.kept = self.digest = None

    def tell_kept(self, reached: int) -> None:
        """One line for a keep at ``reached`` (its batch or round) while no bar shows the training (--no-progress): a
        log (CI) sees the stage go on between its first line and its end, and where a stop would resume it."""
        if self.kept == reached:
            self.log(f"{self.stage}: {self.unit} {reached} of {self.total} (kept)")
        else:  # the disk refused the write (said once, in write's warning)
            last = f"{self.unit} {self.kept} is the last kept" if self.kept else "none was kept yet"
            self.log(f"{self.stage}: {self.unit} {reached} of {self.total} (not kept: {last})")

    def _tmp(self, path: Path | None = None) -> Path:
        path = self.path if path is None else path
        return path.with_name(path.name + ".tmp")

    def _digest_path(self) -> Path:
        return self.path.with_name(self.path.name + KEPT_DIGEST)

    def _damage(self) -> str | None:
        """What is wrong with the kept file's bytes: its sha256 is not one recorded beside it when it was written
        (a flipped byte loads silently), or none was recorded; None when it is one of them."""
        from edgesdk.hashing import sha256_file

        try:
            recorded = self._digest_path().read_text().split()
        except (OSError, UnicodeDecodeError):
            return f"no sha256 of it was recorded in {self._digest_path().name}"
        actual = sha256_file(self.path)
        if actual in recorded:
            self.digest = actual
            return None
        return (f"it changed since it was written: its sha256 is {actual[:16]}..., "
                f"{recorded[0][:16] if recorded else 'none'}... was recorded in {self._digest_path().name}")

    def _units(self) -> str:
        return self.unit + ("es" if self.unit.endswith(("s", "sh", "ch", "x")) else "s")

    def stopped_words(self) -> str:
        """What a stopped build says of this stage: where its training stopped, and where a resumed build goes on."""
        from edgesdk.build.checkpoint import said

        resume = said("--resume", self.terms)
        if self.kept:
            return (f"{self.stage} stopped after {self.kept} of {self.total} {self._units()} (its training so far is "
                    f"kept in {self.path}); {resume} goes on from {self.unit} {self.kept}")
        if self.path.is_file():  # stopped before a resumed training was taken: read (its total set), not restored
            return f"{self.stage} stopped before its training; {resume} goes on from the training kept in {self.path}"
        trains = keeps_training(self.stage)
        if self.total is None and self.doing:  # stopped in the stage's set-up: say what is made again
            lost = f" ({self.losing})" if self.losing else ""
            before = "its training" if trains else "its own work"
            return f"{self.stage} stopped while {self.doing}, before {before}{lost}; {resume} starts the stage over"
        if self.total is None and not trains:  # a stage that trains nothing
            return f"{self.stage} keeps no training in flight; {resume} starts the stage over"
        if self.total is None:  # the stage stopped before it trained
            return f"{self.stage} stopped before its training; {resume} starts the stage over"
        first = f" (the first is kept at {self.unit} {self.first})" if self.first else ""
        return (f"{self.stage} stopped before any of its {self.total} {self._units()} of training was kept{first}; "
                f"{resume} starts the stage over")

    def load(self, identity: str, model, named: dict, optimizer) -> dict | None:
        """The kept training of ``identity``, restored into the trained parameters ``named`` (name -> parameter), the
        fake-quantized modules of ``model`` and ``optimizer``; its loop state (batch, update, history, RNG states), or
        None where there is none. One that cannot be read or was kept under other settings, another batch list or
        other trained parameters is removed, never loaded."""
        kept = self.read(identity)
        return None if kept is None else self.take(kept, lambda: _restore(kept, model, named, optimizer))

    def read(self, identity: str) -> dict | None:
        """The kept training of ``identity`` as it was written (checked against its sha256 before it is unpickled),
        not yet restored (:meth:`take`); None where there is none. One that cannot be read or was kept under other
        settings is removed, never loaded."""
        for tmp in (self._tmp(), self._tmp(self._digest_path())):  # a write a kill cut short
            tmp.unlink(missing_ok=True)
        if not self.path.is_file():
            return None
        try:
            # the digest first: a file changed since it was written is refused before it is unpickled
            problem, kept = self._damage(), None
            if problem is None:
                kept = torch.load(self.path, map_location="cpu", weights_only=True)
                problem = None if isinstance(kept, dict) and kept.get("identity") == identity else "other"
        except Exception as exc:  # a damaged file: torch's unpickler and zip reader raise many kinds
            kept, problem = None, f"it cannot be read ({type(exc).__name__}: {str(exc)[:120]})"
        if problem is not None:
            self._refuse("it was kept under other settings, another batch list or other trained parameters"
                         if problem == "other" else problem)
            return None
        return kept

    def take(self, kept: dict, restore: Callable[[], None]) -> dict | None:
        """``kept`` (from :meth:`read`) put into place by ``restore``: ``kept``, or None (the kept training removed)
        where it does not fit the stage's parameters."""
        try:
            restore()
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            self._refuse(f"it does not fit the stage's parameters ({str(exc)[:120]})")
            return None
        self.kept = self.resumed_from = kept["batch"]
        self.log(f"{self.stage}: going on from {self.unit} {kept['batch']} of {self.total}, the training a stopped "
                 f"build kept in {self.path}")
        return kept

    def _refuse(self, why: str) -> None:
        self.discard()
        self.log(f"{self.stage}: the training a stopped build kept in {self.path} is not taken ({why}); it is "
                 f"removed, and the stage trains from its first {self.unit}")

    def write(self, state: dict) -> None:
        """Keep ``state`` whole and durably (a temporary file flushed to the disk, then renamed over the last one),
        with its sha256 beside it: recorded before the rename, with the last one's, so that whichever of the two a
        kill leaves is loaded, and a file changed since is not. A write the disk refuses (full, a quota) leaves the
        last one kept and the training going: said once."""
        from edgesdk.bundle import sync_directory, sync_file

        # where it stopped, of how many, readable without its tensors: a build that starts over names what it discards
        state = {**state, "total": self.total, "unit": self.unit}
        tmp, writer = self._tmp(), None
        digest_tmp = self._tmp(self._digest_path())
        try:
            tmp.parent.mkdir(parents=True, exist_ok=True)  # the first stage's: before any checkpoint made the folder
            with open(tmp, "wb") as handle:
                writer = _Writer(handle)
                torch.save(state, writer)
                sync_file(handle)
            digests = [writer.digest.hexdigest()] + ([self.digest] if self.digest else [])
            with open(digest_tmp, "w") as handle:
                handle.write("".join(f"{digest}  {self.path.name}\n" for digest in digests))
                sync_file(handle)
            os.replace(digest_tmp, self._digest_path())
            sync_directory(self.path.parent)
            os.replace(tmp, self.path)
        except (OSError, RuntimeError) as exc:  # torch's zip writer reports a failed write as a RuntimeError
            for path in (tmp, digest_tmp):
                with contextlib.suppress(OSError):
                    path.unlink()
            if isinstance(exc, RuntimeError) and writer is not None and writer.refused is not None:
                exc = writer.refused
            if not self.warned:
                self.warned = True
                from edgesdk.build.checkpoint import free_space

                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)[:160]
                last = (f"batch {self.kept} is the last kept" if self.kept else "none was kept yet")
                self.log(f"warning: {self.stage}: cannot keep the training in flight in {self.path}: {reason} "
                         f"({free_space(self.path.parent)} free on its disk); the training goes on, but a stopped "
                         f"build goes on from what was kept before ({last}): free space on that disk")
            return
        sync_directory(self.path.parent)
        self.kept, self.digest = state["batch"], digests[0]


class _Writer:
    """A file for torch.save that keeps the error of a write the disk refused: torch's zip writer reports it as
    ``unexpected pos 63936 vs 63888``, without the operating system's reason; and the sha256 of what it wrote (torch
    writes a file object in order, never seeking back)."""

    def __init__(self, handle):
        self.handle, self.refused, self.digest = handle, None, hashlib.sha256()

    def write(self, data) -> int:
        try:
            written = self.handle.write(data)
        except OSError as exc:
            self.refused = exc
            raise
        self.digest.update(memoryview(data)[:written])
        return written

    def flush(self) -> None:
        self.handle.flush()


_PROGRESS: contextvars.ContextVar[TrainingProgress | None] = contextvars.ContextVar("training_progress", default=None)


def setting_up(doing: str, losing: str | None = None) -> None:
    """Inside a build, say that the running stage is ``doing`` (e.g. "observing activation ranges on 8 batches"),
    a set-up before its training that shows no bar under --no-progress, and what a stop there loses (``losing``),
    which its stop message names."""
    keeper = _PROGRESS.get()
    if keeper is not None:
        keeper.doing, keeper.losing = doing, losing
        keeper.log(f"{keeper.stage}: {doing}")


def loading_text(config, teacher: bool, terms: str = "cli") -> tuple[str, str | None]:
    """What loading a build's training text (a DataConfig) does, for :func:`setting_up`: its --data files
    tokenized, and (``teacher``) the teacher's text sampled, which takes minutes on a CPU and is kept in the user
    cache once sampled whole (edgesdk/compress/data.py cached_teacher_text); and what a stop there loses."""
    from edgesdk.build.checkpoint import said

    parts = []
    if config.files:
        parts.append(f"the {said('--data', terms)} files tokenized")
    sampled = bool(config.generated_sequences and teacher)
    if sampled:
        parts.append(f"{config.generated_sequences} sequences of {config.generated_tokens} tokens the teacher "
                     "samples once for this model, or takes from the cache where an earlier build kept them")
    doing = "loading the training text" + (f" ({', and '.join(parts)})" if parts else "")
    return doing, ("teacher text not sampled whole is not kept in the cache: the next build samples it again"
                   if sampled else None)


def current_progress() -> TrainingProgress | None:
    """Where the stage running in :func:`keeping_progress` keeps its training in flight; None outside a build."""
    return _PROGRESS.get()


@contextlib.contextmanager
def keeping_progress(progress: TrainingProgress) -> Iterator[TrainingProgress]:
    """While the block runs (a build's stage), :func:`run_training` keeps its training in flight in ``progress``."""
    token = _PROGRESS.set(progress)
    try:
        yield progress
    finally:
        _PROGRESS.reset(token)


def training_identity(progress: TrainingProgress, settings: LoopSettings, batches: list[torch.Tensor],
                      named: dict) -> str:
    """What a kept training must have been made under: the build's inputs to the stage, the loop's settings, the
    batches (their tokens) and the trained parameters' names, shapes and types."""
    digest = hashlib.sha256()
    loop = {k: v for k, v in asdict(settings).items() if k not in PROGRESS_ONLY_FIELDS}
    digest.update(json.dumps([KEPT_LAYOUT, progress.stage, progress.identity, loop,
                              [[name, list(p.shape), str(p.dtype)] for name, p in named.items()]]).encode())
    for batch in batches:
        digest.update(json.dumps([list(batch.shape), str(batch.dtype)]).encode())
        digest.update(batch.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _module_state(model) -> dict:
    """MODULE_STATE of every module that carries any, by the module's name."""
    return {name: {key: module.__dict__[key] for key in MODULE_STATE if key in module.__dict__}
            for name, module in model.named_modules() if any(key in module.__dict__ for key in MODULE_STATE)}


def _restore(kept: dict, model, named: dict, optimizer) -> None:
    """Put a kept training's parameters, fake-quantization state and optimizer state into place."""
    if set(kept["params"]) != set(named):
        raise KeyError(f"it holds {len(kept['params'])} parameters, the stage trains {len(named)}")
    modules = dict(model.named_modules())
    if not set(kept["modules"]) <= set(modules):
        raise KeyError(f"modules {sorted(set(kept['modules']) - set(modules))[:3]} are not in the model")
    optimizer.load_state_dict(kept["optimizer"])
    with torch.no_grad():
        for name, value in kept["params"].items():
            named[name].copy_(value)
    for name, state in kept["modules"].items():
        module = modules[name]
        for key in MODULE_CACHE:
            module.__dict__.pop(key, None)
        for key, value in state.items():
            module.__dict__[key] = value.to(named_device(module)) if isinstance(value, torch.Tensor) else value


def named_device(module) -> torch.device:
    weight = getattr(module, "weight", None)
    return weight.device if isinstance(weight, torch.Tensor) else torch.device("cpu")


def _rng_states() -> dict:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        # a resumed build on a machine with fewer visible GPUs (CUDA_VISIBLE_DEVICES) restores the states of those
        # it has: one state per device it names, set_rng_state_all fails on the others
        torch.cuda.set_rng_state_all(states["cuda"][:torch.cuda.device_count()])


STOP_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)


@contextlib.contextmanager
def _stops_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP that Python handles (a build unwinds on them) wait until the block ends, then stop
    as they would have: an optimizer step is never cut half-way, so a stopped training keeps the weights of an update
    boundary. Signals the process leaves at their default action or ignores are left alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {}
    try:
        for signum in STOP_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler  # before the swap: a swap that fails puts back the same handler
                signal.signal(signum, lambda number, frame: held.append(number))
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pass_on(held, previous, inspect.currentframe())


def _pass_on(held: list[int], handlers: dict, frame) -> None:
    """Call the handler of every signal in ``held``, in the order they came, as Python would have: when one raises
    (KeyboardInterrupt), the next still runs, and what a later one raises (a build's SIGTERM) is what goes on."""
    if held:
        try:
            handlers[held[0]](held[0], frame)
        finally:
            _pass_on(held[1:], handlers, frame)


def run_training(model, loss_fn: LossFn, batches: list[torch.Tensor], settings: LoopSettings, *, desc: str,
                 progress: bool) -> dict:
    """Train the parameters of ``model`` that require grad; ``loss_fn(batch, fraction_done)``. A non-finite loss
    or gradient norm stops the training with a BuildError naming the stage (``desc``) and the batch.

    Inside :func:`keeping_progress` (a build's stage) the training in flight (the trained parameters, the
    fake-quantization state, the optimizer's, the batch and update reached, the loss history and the RNG states) is
    kept at update boundaries, at most every ``settings.checkpoint_interval_s`` seconds and when the build is stopped
    (Ctrl-C, SIGTERM), and once it has finished; a resumed build's training goes on from the last batch kept, to the
    same weights."""
    from tqdm import tqdm

    named = {name: p for name, p in model.named_parameters() if p.requires_grad}
    params = list(named.values())
    optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)
    accumulate = settings.grad_accumulation
    # a last, partial group of batches (len % grad_accumulation) is an update of its own, on the schedule
    updates = max(1, -(-len(batches) // accumulate))
    warmup = warmup_updates(updates, settings.warmup_fraction)

    def lr_at(update: int) -> float:
        if update < warmup:
            return settings.lr * (update + 1) / warmup
        return settings.lr * 0.5 * (1 + math.cos(math.pi * (update - warmup) / max(1, updates - warmup)))

    history: list[dict[str, float]] = []
    update = done = 0
    keeper = _PROGRESS.get()
    if keeper is not None:
        keeper.total, keeper.first = len(batches), min(accumulate, len(batches))
        keeper.doing = keeper.losing = None
        identity = training_identity(keeper, settings, batches, named)
        kept = keeper.load(identity, model, named, optimizer)
        if kept is not None:
            update, done, history = kept["update"], kept["batch"], list(kept["history"])
            _set_rng_states(kept["rng"])
        else:  # without a bar (--no-progress) each keep says the batch it reached (TrainingProgress.tell_kept)
            interval = settings.checkpoint_interval_s
            often = "after every update" if not interval else f"every {interval:g} s"
            keeper.log(f"{keeper.stage}: training {len(batches)} batches in {updates} updates; the "
                       f"training in flight is kept {often} and when the build is stopped, from the first update "
                       f"(batch {keeper.first}) on")
    # the RNG states and the fake-quantization state at the last update boundary: a stop between two keeps the
    # boundary's, not those the forward passes since moved on (the 4-bit scales' age, searched again one update early)
    rng = _rng_states() if keeper is not None else None
    modules = _module_state(model) if keeper is not None else None
    last_kept = time.monotonic()

    def keep() -> None:
        keeper.write({"identity": identity, "batch": done, "update": update, "history": history[:done], "rng": rng,
                      "params": {name: p.detach() for name, p in named.items()}, "modules": modules,
                     "optimizer": optimizer.state_dict()})

    bar = tqdm(batches[done:], desc=desc, disable=not progress, unit="batch", total=len(batches), initial=done)
    try:
        for index, batch in enumerate(bar, start=done):
            loss, parts = loss_fn(batch, index / max(1, len(batches)))
            check_finite("loss", loss.detach(), desc, index, len(batches), update, settings.lr)
            group_start = index - index % accumulate
            (loss / min(accumulate, len(batches) - group_start)).backward()  # the mean over this update's batches
            history.append({"loss": loss.item(), **parts})
            if (index + 1) % accumulate == 0 or index + 1 == len(batches):
                if settings.grad_scaling:
                    factor = gradient_scale(update)
                    for p in params:
                        if p.grad is not None:
                            p.grad.mul_(factor)
                norm = torch.nn.utils.clip_grad_norm_(params, settings.clip_norm)
                check_finite("gradient norm", norm.detach(), desc, index, len(batches), update, settings.lr)
                for group in optimizer.param_groups:
                    group["lr"] = lr_at(update)
                with _stops_held():  # the step, and the boundary it reaches, whole
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    update, done = update + 1, index + 1
                    if keeper is not None:
                        rng, modules = _rng_states(), _module_state(model)
                if keeper is not None and time.monotonic() - last_kept >= settings.checkpoint_interval_s:
                    keep()
                    last_kept = time.monotonic()
                    if not progress:  # the bar shows the batches; without it, this line
                        keeper.tell_kept(done)
            bar.set_postfix(loss=f"{history[-1]['loss']:.4f}")
    except (KeyboardInterrupt, SystemExit):  # stopped (Ctrl-C, SIGTERM): keep the last update boundary reached
        if keeper is not None and done and done != keeper.kept:
            keep()
        raise
    finally:
        bar.close()
    if keeper is not None and done != keeper.kept:
        # the finished training, kept until the stage's checkpoint is recorded: a build stopped in what the stage
        # does after it (its measurements, the checkpoint's write) goes on from the last batch, not the last keep
        with _stops_held():
            keep()
    head, tail = history[: max(1, len(history) // 10)], history[-max(1, len(history) // 10):]
    tokens = sum(int(b.numel()) for b in batches)
    return {
        "batches": len(batches), "updates": update, "tokens": tokens,
        "loss_first": round(sum(h["loss"] for h in head) / len(head), 5),
        "loss_last": round(sum(h["loss"] for h in tail) / len(tail), 5),
    }
