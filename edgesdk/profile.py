"""Target board profiles: one strict YAML file per board in ``targets/`` (installed as
``edgesdk.targets``), loaded into frozen pydantic models.

Unknown keys and unknown values are rejected with the allowed set in the message. The hardware
numbers and their sources live as comments in the YAML files (see ``targets/README.md``).
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Literal, Union, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edgesdk.errors import BundleError, ProfileError, did_you_mean, read_utf8
from edgesdk.power.distribution import FLOOR, WINDOW, check_entropy_target

Family = Literal["jetson", "rpi", "host"]
BUNDLE_COPY = "bundle_copy"  # validation context: a bundle's copy of its profile, names as written
Precision = Literal["fp32", "fp16", "bf16", "int8", "int4"]
SparsityKind = Literal["block", "2:4"]
Backend = Literal["ort-cpu", "ort-cuda", "ort-trt", "tensorrt", "triton"]

BACKENDS: tuple[str, ...] = get_args(Backend)
MIN_SPARSE_TENSOR_CORE_SM = 80  # 2:4 structured sparsity: Ampere (sm_80) and newer
MIN_CUDA_SM = 30  # Kepler: no CUDA release from 9.0 on builds for an older GPU
MAX_CUDA_SM = 130  # above the newest compute capability (12.x, Blackwell) with room for the next


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice.

    YAML requires the keys of a mapping to be unique (YAML 1.2.2 §3.2.1.1, "The content of a mapping node is an
    unordered set of key/value node pairs, with the restriction that each of the keys is unique"; YAML 1.1 says
    the same), but PyYAML keeps the last value without a word: a profile with two ``soft_limit_c`` lines, or a
    recipe with two ``export`` sections, would load with one of them silently dropped. Keys brought in by a merge
    (``<<: *anchor``) may still be overridden, as YAML's merge-key type allows.
    """


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.setdefault(key, key_node.start_mark)
        except TypeError:  # an unhashable key: construct_mapping below reports it
            continue
        if first is not key_node.start_mark:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found the key {key!r} twice (first on line {first.line + 1}); YAML keys must be unique and only "
                "one value can hold, so remove or rename one of them", key_node.start_mark)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)

# Numbers as YAML 1.2's core schema reads them (yaml.org/spec/1.2.2 §10.3.2), and as --set reads a value
# (edgesdk.build.recipes._override_value), where PyYAML reads YAML 1.1's: 010 is ten (not octal 8), 0o10 is octal 8,
# 1e3 and 2e-4 are floats (text to PyYAML, whose floats need a dot and a signed exponent), 1:00 is text (not the
# sexagesimal 60). PyYAML's other number forms (0x1F, 0b11, 1_000, .inf) read as they did.
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_CORE_INT = re.compile(r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-9]+
    |0o[0-7]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+)$""", re.X)
_CORE_FLOAT = re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9]+[eE][-+]?[0-9]+
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_LEADING_ZERO_DECIMAL = re.compile(r"[-+]?0[0-9]+")


def _construct_core_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    """An integer as YAML 1.2 reads it: 010 is decimal ten and 0o10 octal eight; the other forms as PyYAML
    reads them."""
    text = loader.construct_scalar(node)
    if _LEADING_ZERO_DECIMAL.fullmatch(text):
        return int(text, 10)
    if text.startswith("0o"):
        return int(text[2:], 8)
    return loader.construct_yaml_int(node)


_UniqueKeyLoader.yaml_implicit_resolvers = {  # PyYAML's resolvers less its YAML 1.1 int and float patterns
    first: [(tag, pattern) for tag, pattern in resolvers if tag not in (_INT_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_UniqueKeyLoader.add_implicit_resolver(_INT_TAG, _CORE_INT, list("-+0123456789"))
_UniqueKeyLoader.add_implicit_resolver(_FLOAT_TAG, _CORE_FLOAT, list("-+0123456789."))
_UniqueKeyLoader.add_constructor(_INT_TAG, _construct_core_int)


def load_yaml_unique(text: str):
    """``yaml.safe_load(text)``, but a mapping with a duplicate key raises :class:`yaml.YAMLError` (see
    :class:`_UniqueKeyLoader`) instead of silently keeping the last value, and numbers are read as YAML 1.2 and
    ``--set`` read them (``steps: 1e3`` is 1000.0, ``010`` is 10, ``0o10`` is 8, ``1:00`` is text). Used for
    profiles and recipes."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_true_false_for_numbers(cls, value, info: ValidationInfo):
        """YAML reads yes / no / on / off / true / false as booleans, which pydantic takes as the numbers 1 and 0
        (``threads: yes`` one thread, ``sparsity_block: on`` blocks of 1); no profile key is a boolean. The message
        says what the key holds instead: ``sparsity: no`` or ``gpu: no`` meant "none", which is a list or a
        section, not the number or name the other keys hold."""
        if isinstance(value, bool):
            raise ValueError(f"a true/false value (YAML reads yes, no, on and off as one) where "
                             f"{_expected_form(cls, info.field_name)} is expected")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _quoted_text(cls, value, info: ValidationInfo):
        """YAML reads an unquoted version as a number, dropping its trailing zeros (``python: 3.10`` is the float
        3.1, ``cuda: 12.10`` 12.1): a text key given a number is refused naming the key and how to quote it, rather
        than with pydantic's bare "should be a valid string" about a value the file never held."""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and _is_text(cls, info.field_name):
            dropped = ", dropping any trailing zero (3.10 reads as 3.1)" if isinstance(value, float) else ""
            raise ValueError(f"{info.field_name} is text, but YAML read the unquoted value as the number "
                             f"{value!r}{dropped}; quote the value as written, e.g. \"3.10\" rather than 3.10")
        return value


def _expected_form(model: type[BaseModel], field_name: str | None) -> str:
    """What ``model``'s field ``field_name`` holds, in a profile's words: a list, a section, or a number or a name."""
    field = model.model_fields.get(field_name or "")
    annotation = field.annotation if field is not None else None
    kinds = [annotation, *get_args(annotation)]
    if any(kind is tuple or get_origin(kind) is tuple for kind in kinds):
        may_be_empty = not any(getattr(rule, "min_length", 0) for rule in field.metadata)
        return "a list in brackets" + (f" (for none, write {field_name}: [])" if may_be_empty else "")
    if any(isinstance(kind, type) and issubclass(kind, BaseModel) for kind in kinds):
        none = f", or {field_name}: null for none" if type(None) in kinds else ""
        return f"a section of keys ({field_name}: followed by its indented keys{none})"
    return "a number or a name"


def _is_text(model: type[BaseModel], field_name: str | None) -> bool:
    """Whether ``model``'s field ``field_name`` holds text (``str`` or ``str | None``)."""
    field = model.model_fields.get(field_name or "")
    if field is None:
        return False
    annotation = field.annotation
    return annotation is str or get_origin(annotation) in (Union, UnionType) and str in get_args(annotation)


class CpuSpec(_Strict):
    model: str = Field(description="CPU cores as the vendor names them, e.g. '4x Cortex-A76'")
    cores: int = Field(gt=0, description="number of CPU cores the runtime may use")
    max_ghz: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="peak clock; None where unknown")
    isa_features: tuple[str, ...] = Field(
        default=(), description="/proc/cpuinfo features that matter for kernels (asimddp, i8mm, avx512f …)"
    )


class GpuSpec(_Strict):
    arch: str = Field(description="GPU architecture, e.g. 'Ampere GA10B'")
    sm: int = Field(gt=0, description="CUDA compute capability as an integer: 87 for Orin, 72 for Xavier")
    cuda_cores: int | None = Field(default=None, gt=0, description="CUDA cores; None where unknown")
    tensor_cores: int | None = Field(default=None, ge=0, description="tensor cores; None where unknown")

    @field_validator("sm", mode="before")
    @classmethod
    def _compute_capability_as_integer(cls, value):
        """``sm`` is the compute capability written as nvcc's ``sm_XY`` writes it (major * 10 + minor). Written as
        the version, ``sm: 8.7`` was refused with no word of the form, and ``sm: 8.0``, ``sm: 8`` or Thor's
        ``sm: 11.0`` loaded as sm_8 or sm_11, GPUs that do not exist (which the 2:4 check then called too old for
        sparse tensor cores). ``sm: 87.0`` is sm_87; the integer is suggested only where it is one (``sm: 2`` or
        ``sm: 0.5`` were told to write 20 or 5, which are refused as below sm_30). Written as nvcc's flag
        (``sm: sm_87``, ``compute_87``) or quoted (``sm: "8.7"``) it is refused with the integer too, rather than
        with pydantic's bare "unable to parse string"; and a number past any GPU's (``sm: 870``), which loaded and
        failed only when a kernel was compiled for it, is refused as it loads."""
        if isinstance(value, str):
            return _compute_capability_text(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value
        return _compute_capability_number(value)


_SM_FORM = "gpu.sm is the CUDA compute capability as an integer, major * 10 + minor as in sm_87"
_SM_TEXT = re.compile(r"(?P<flag>sm_|compute_)?(?P<number>[0-9]+(?:\.[0-9]+)?)(?P<suffix>[af]?)", re.I)


def _compute_capability_number(value: int | float) -> int:
    """``gpu.sm`` given as a number: the integer it is, or a ValueError naming the integer to write."""
    if isinstance(value, float) and value.is_integer() and value >= MIN_CUDA_SM:  # 87.0
        value = int(value)
    if isinstance(value, float) or value < MIN_CUDA_SM:
        scaled = round(value * 10) if math.isfinite(value) else None
        if scaled is not None and MIN_CUDA_SM <= scaled < MAX_CUDA_SM:  # 8.7 or 8 meant 8.7 / 8.0
            fix = f"write {scaled}"
        else:
            fix = f"write a whole number of at least {MIN_CUDA_SM}"
        raise ValueError(f"{_SM_FORM}, but got {value!r}; {fix} (87 for Orin's 8.7, 72 for Xavier's 7.2)")
    if value >= MAX_CUDA_SM:
        tenth = value // 10 if value % 10 == 0 and MIN_CUDA_SM <= value // 10 < MAX_CUDA_SM else None
        fix = f"write {tenth}" if tenth is not None else "write major * 10 + minor of the GPU's compute capability"
        raise ValueError(f"{_SM_FORM}, but got {value!r}, higher than any CUDA GPU's (the newest, Blackwell, are "
                         f"sm_100 to sm_121; {MAX_CUDA_SM} and above are refused); {fix} (87 for Orin's 8.7, 72 for "
                         "Xavier's 7.2)")
    return value


def _compute_capability_text(text: str):
    """A quoted ``sm``: its digits as the number they are (``"87"``, ``"8.7"``), checked as a number; nvcc's
    flag form (``"sm_87"``, ``"compute_90a"``) is refused naming the integer to write. Other text is left to
    pydantic, which names it."""
    written = _SM_TEXT.fullmatch(text.strip())
    if written is None:
        return text
    number = written["number"]
    value = _compute_capability_number(float(number) if "." in number else int(number))
    if written["flag"] or written["suffix"]:
        raise ValueError(f"{_SM_FORM}, but got {text!r}, nvcc's flag; write {value}")
    return value


class MemorySpec(_Strict):
    total_gb: float = Field(gt=0, allow_inf_nan=False, description="RAM shared by CPU and GPU")
    bandwidth_gbps: float = Field(gt=0, allow_inf_nan=False,
                                  description="peak DRAM bandwidth in GB/s; decode is bound by it")


class SoftwareSpec(_Strict):
    python: str = Field(description="Python line of the board's OS image, e.g. '3.10' on JetPack 6")
    jetpack: str | None = Field(default=None, description="JetPack line the profile is made for")
    cuda: str | None = Field(default=None, description="CUDA version shipped with that JetPack")
    tensorrt: str | None = Field(default=None, description="TensorRT version shipped with that JetPack")


class RuntimeSpec(_Strict):
    backend: Backend = Field(description="backend tried first on the board")
    fallbacks: tuple[Backend, ...] = Field(default=(), description="backends tried in order when it fails")
    threads: int = Field(gt=0, description="intra-op threads for CPU backends (cores minus headroom)")

    @model_validator(mode="after")
    def _each_backend_once(self, info: ValidationInfo) -> RuntimeSpec:
        """The session tries ``backend`` then each fallback in turn (edgesdk/runtime/session.py): a backend listed
        twice is tried twice, so one that fails (a TensorRT engine that does not build, a CUDA library missing)
        fails again, taking its time (an engine build's minutes) once more before the next one runs. A bundle's
        copy of its profile is read as it was written."""
        if (info.context or {}).get(BUNDLE_COPY):
            return self
        chain = [self.backend, *self.fallbacks]
        repeated = sorted({backend for backend in chain if chain.count(backend) > 1})
        if repeated:
            once = list(dict.fromkeys(chain))
            raise ValueError(f"{', '.join(map(repr, repeated))} listed more than once (backend {self.backend!r}, "
                             f"fallbacks {list(self.fallbacks)}): the session tries them in that order, so a backend "
                             f"that failed would be tried again; list each once, e.g. backend: {once[0]} and "
                             f"fallbacks: [{', '.join(once[1:])}]")
        return self


class PowerSpec(_Strict):
    entropy_target: float = Field(
        gt=0, lt=math.log(WINDOW), description="target power entropy in nats (1.5 on boards, 1.2 on the host; "
                                               "DESIGN.md), below ln 8 = 2.079, the most an 8-token window holds"
    )

    @field_validator("entropy_target")
    @classmethod
    def _reachable(cls, value: float) -> float:
        """Above :func:`edgesdk.power.distribution.least_entropy` too (0.366 nats at the window of 8 and the floor
        0.01), as :func:`edgesdk.power.distribution.check_entropy_target` asks: the power controller and the build's
        power stage refuse a lower target, so the profile is refused when it loads, naming its file, rather than
        by a build after the model has loaded (and never by the commands that run no power stage)."""
        check_entropy_target(value, WINDOW, FLOOR)
        return value


ABSOLUTE_ZERO_C = -273.15
MAX_CHIP_C = 150.0  # the top of automotive grade 0 (AEC-Q100), the hottest grade a processor is rated for
MILLI = 1000  # sysfs thermal_zone*/temp and trip_point_*_temp read millidegrees (Documentation/ABI sysfs-class-thermal)


def _degrees_celsius(value: float, low: float = ABSOLUTE_ZERO_C, high: float = MAX_CHIP_C,
                     bounds: str | None = None) -> float:
    """``value`` as a temperature in °C within ``low`` (exclusive at absolute zero) and ``high``: by default one a
    board can reach, above absolute zero and at most :data:`MAX_CHIP_C`; ``bounds`` says what the range is.

    The kernel writes temperatures in millidegrees (``thermal_zone0/temp`` reads ``75000``, ``trip_point_0_temp``
    ``80000``), and a profile given those numbers loaded: its limits rose strictly, so a guard that paces from
    75000 °C never acted and the firmware throttled (or shut down) the board the guard is there to protect. A value
    in kelvin or °F (above the range) or below it is refused the same way, naming the value in °C to write. The
    message leaves out the key and the value: pydantic's error names the field, and the profile's refusal the value.
    """

    def within(celsius: float) -> bool:
        return (low < celsius if low <= ABSOLUTE_ZERO_C else low <= celsius) and celsius <= high

    if within(value):
        return value
    if abs(value) >= MILLI and within(value / MILLI):
        fix = f"sysfs thermal_zone*/temp and trip_point_*_temp read millidegrees: write {value / MILLI:g}"
    elif value < high:
        fix = "write the temperature in °C, e.g. 25 for a room"
    else:
        as_kelvin, as_fahrenheit = value - 273.15, (value - 32) * 5 / 9
        readings = [f"{value:g} K is {as_kelvin:.1f} °C" if within(as_kelvin) else "",
                    f"{value:g} °F is {as_fahrenheit:.1f} °C" if within(as_fahrenheit) else ""]
        readings = [r for r in readings if r]
        fix = "write the temperature in °C" + (f" ({' or '.join(readings)})" if readings else "")
    bounds = bounds or (f"above {ABSOLUTE_ZERO_C:g} °C, absolute zero, and at most {MAX_CHIP_C:g} °C, the top of "
                        "automotive grade 0 (AEC-Q100), the hottest grade a processor is rated for")
    raise ValueError(f"not a temperature in °C a board reaches ({bounds}); {fix}")


class ThermalLimits(_Strict):
    zones: tuple[str, ...] = Field(min_length=1, description="sysfs thermal zone types to watch")
    resume_c: float = Field(allow_inf_nan=False, description=(
        "guard lowers the compute budget from here (warm level); a critical pause ends below it (after one "
        "time constant RC paused, already below hard_limit_c - hysteresis_c)"))
    soft_limit_c: float = Field(allow_inf_nan=False, description=(
        "guard paces tokens to hold soft_limit_c - setpoint_margin_c (2 °C by default), from hot_lead_c (1.5 °C) "
        "below that (hot level), and holds back a prefill that would end above it"))
    hard_limit_c: float = Field(allow_inf_nan=False, description=(
        "guard pauses generation here, the request kept (critical level)"))
    firmware_throttle_c: float = Field(allow_inf_nan=False, description="firmware or kernel throttles clocks here")
    shutdown_c: float = Field(allow_inf_nan=False, description="firmware or kernel shuts down here")

    @field_validator("resume_c", "soft_limit_c", "hard_limit_c", "firmware_throttle_c", "shutdown_c")
    @classmethod
    def _celsius(cls, value: float) -> float:
        """Each limit in °C, not the millidegrees sysfs reads (:func:`_degrees_celsius`)."""
        return _degrees_celsius(value)

    @model_validator(mode="after")
    def _ordered(self) -> ThermalLimits:
        order = [self.resume_c, self.soft_limit_c, self.hard_limit_c, self.firmware_throttle_c, self.shutdown_c]
        if order != sorted(order) or len(set(order)) != len(order):
            raise ValueError(
                "thermal limits must rise strictly: resume_c < soft_limit_c < hard_limit_c < "
                f"firmware_throttle_c < shutdown_c; got {order}"
            )
        return self

    @model_validator(mode="after")
    def _setpoint_above_resume(self) -> ThermalLimits:
        """The guard holds ``soft_limit_c - setpoint_margin_c`` (edgesdk/thermal/guard.py ``GuardConfig``): a
        setpoint at or below ``resume_c`` lies where the guard has already left its hot level (its hot threshold is
        clamped above ``resume_c``), so pacing cools the board below the point where pacing starts and the guard
        oscillates between normal and hot instead of holding a temperature."""
        from edgesdk.thermal.guard import GuardConfig  # the guard imports this module

        margin = GuardConfig().setpoint_margin_c
        setpoint = self.soft_limit_c - margin
        if setpoint <= self.resume_c:
            raise ValueError(
                f"thermal.soft_limit_c ({self.soft_limit_c:g} °C) is only {self.soft_limit_c - self.resume_c:g} °C "
                f"above thermal.resume_c ({self.resume_c:g} °C): the thermal guard holds soft_limit_c - "
                f"{margin:g} °C = {setpoint:g} °C, which must lie above resume_c or the guard oscillates; set "
                f"resume_c below {setpoint:g} (e.g. {self.soft_limit_c - margin - 3:g}, the shipped profiles keep it "
                f"5 °C under soft_limit_c) or raise soft_limit_c above {self.resume_c + margin:g}"
            )
        return self


class ThermalModel(_Strict):
    """First-order (lumped RC) thermal model: C dT/dt = P - (T - T_ambient) / R."""

    ambient_c: float = Field(allow_inf_nan=False, description="default ambient temperature for simulation")
    resistance_c_per_w: float = Field(gt=0, allow_inf_nan=False, description="junction-to-ambient thermal resistance R")
    capacity_j_per_c: float = Field(gt=0, allow_inf_nan=False, description="lumped heat capacity C")
    idle_w: float = Field(ge=0, allow_inf_nan=False, description="board power when idle")
    active_w: float = Field(gt=0, allow_inf_nan=False, description="board power while decoding")

    @field_validator("ambient_c")
    @classmethod
    def _celsius(cls, value: float) -> float:
        """The ambient in °C, not millidegrees or °F (:func:`_degrees_celsius`): 25000 made every simulated board
        far hotter than its shutdown limit from the first step, and 77 (°F) a 77 °C room. The range is that of
        ``--ambient`` (:data:`edgesdk.thermal.AMBIENT_RANGE_C`)."""
        from edgesdk.thermal import AMBIENT_RANGE_C

        low, high = AMBIENT_RANGE_C
        return _degrees_celsius(value, low, high, f"an ambient from {low:g} °C to {high:g} °C, the industrial "
                                                  "temperature range a board's parts are rated for")

    @model_validator(mode="after")
    def _working_heats(self) -> ThermalModel:
        if self.active_w < self.idle_w:  # the simulated board would cool down while it computes
            raise ValueError(f"active_w ({self.active_w} W) must be at least idle_w ({self.idle_w} W)")
        return self


class TargetProfile(_Strict):
    """One board. See targets/*.yaml for the values and their sources."""

    name: str
    aliases: tuple[str, ...] = ()
    family: Family
    description: str
    cpu: CpuSpec
    gpu: GpuSpec | None = None
    memory: MemorySpec
    software: SoftwareSpec
    precisions: tuple[Precision, ...] = Field(min_length=1)
    sparsity: tuple[SparsityKind, ...] = ()
    sparsity_block: int = Field(default=32, gt=0, description="block edge for block-sparse weights")
    runtime: RuntimeSpec
    memory_budget_mb: int = Field(gt=0, description="largest bundle the runtime may load on this board")
    power: PowerSpec
    thermal: ThermalLimits
    thermal_model: ThermalModel
    default_recipe: str = "default"

    @field_validator("name", "aliases")
    @classmethod
    def _plain_names(cls, value, info: ValidationInfo):
        """A board's name (and each alias) is a plain name: letters, digits, '-', '_' and '.', not starting with a
        dot, as the shipped profiles' names are and as a bundle id must be (edgesdk/bundle.py ``_plain_name``). The
        name is a path component, of the default bundle directory (``bundles/<model>-<name>``: a name 'a/b' made a
        nested directory, '../x' one outside ``bundles/``) and of the manifest's target, and what ``--target``
        takes, which reads a value with a '/' or a .yaml suffix as a file. A bundle's copy of its profile
        (:func:`bundle_profile`) is read as it was written: a bundle built before this rule still runs."""
        if (info.context or {}).get(BUNDLE_COPY):
            return value
        for name in (value,) if isinstance(value, str) else value:
            if (name == "" or name.startswith(".") or name.lower().endswith((".yaml", ".yml"))
                    or not all(char.isalnum() or char in "-_." for char in name)):
                raise ValueError(f"{name!r} is not a plain board name: use letters, digits, '-', '_' and '.' (not "
                                 "first, and no .yaml / .yml suffix), e.g. 'my-board'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TargetProfile:
        gpu_backends = {"ort-cuda", "ort-trt", "tensorrt", "triton"}
        used = {self.runtime.backend, *self.runtime.fallbacks}
        if self.gpu is None and used & gpu_backends:
            raise ValueError(
                f"profile has no gpu but lists GPU backends {sorted(used & gpu_backends)}; "
                "use 'ort-cpu' or add a gpu section"
            )
        if "ort-cpu" not in used:
            raise ValueError("runtime must list 'ort-cpu' as backend or fallback: it is the backend of last resort")
        if self.runtime.threads > self.cpu.cores:
            raise ValueError(f"runtime.threads ({self.runtime.threads}) exceeds cpu.cores ({self.cpu.cores}): more "
                             "intra-op threads than cores oversubscribe the CPU and slow every step; set "
                             f"runtime.threads to at most {self.cpu.cores}")
        ram_mb = self.memory.total_gb * 1024
        if self.memory_budget_mb >= ram_mb:
            raise ValueError(f"memory_budget_mb ({self.memory_budget_mb}) is not below the board's RAM "
                             f"(memory.total_gb {self.memory.total_gb:g} = {ram_mb:.0f} MB), which the OS, the runtime "
                             f"and the KV cache share; set it to about half of that ({ram_mb * 0.5:.0f})")
        if self.sparsity_block & (self.sparsity_block - 1):
            raise ValueError(f"sparsity_block must be a power of two (the block-sparse kernels tile by it), "
                             f"got {self.sparsity_block}")
        return self

    @model_validator(mode="after")
    def _two_four_on_sparse_tensor_cores(self, info: ValidationInfo) -> TargetProfile:
        """2:4 structured sparsity runs on the sparse tensor cores of an Ampere or newer GPU (sm_80+): a profile
        that lists it without such a GPU (a Raspberry Pi's CPU, a Volta Xavier at sm_72) would have TensorRT
        asked for sparse kernels (SPARSE_WEIGHTS) the board does not have. A bundle's copy of its profile is read as
        it was written."""
        if "2:4" not in self.sparsity or (info.context or {}).get(BUNDLE_COPY):
            return self
        if self.gpu is None or self.gpu.sm < MIN_SPARSE_TENSOR_CORE_SM:
            has = "no gpu" if self.gpu is None else f"gpu.sm {self.gpu.sm} ({self.gpu.arch})"
            raise ValueError(f"profile '{self.name}' lists sparsity '2:4', but 2:4 structured sparsity needs the "
                             f"sparse tensor cores of an sm_{MIN_SPARSE_TENSOR_CORE_SM}+ GPU (Ampere or newer) and it "
                             f"has {has}; remove '2:4' from sparsity (block sparsity runs anywhere: sparsity: [block])")
        return self

    def summary(self) -> dict:
        """A JSON-friendly copy for bundle manifests."""
        return self.model_dump(mode="json")


def _format_validation_error(source: str, error: ValidationError) -> str:
    """One line per problem: the key, what was wrong and the value given. A check across a section's keys (the
    thermal limits' order, runtime.threads against cpu.cores) names the values it compared in its message, and a
    missing key has no value: the section pydantic gives as their input (for a check of the whole profile, every
    key of the file) is not repeated after them."""
    lines = [f"target profile {source} does not match the schema:"]
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            parent = _model_at(item["loc"][:-1])
            allowed = ", ".join(sorted(parent.model_fields)) if parent else "see the schema"
            lines.append(f"  - unknown key '{where}'; allowed keys here: {allowed}")
        elif isinstance(item.get("input"), dict) and item["type"] in ("value_error", "missing"):
            lines.append(f"  - {where}: {item['msg']}")
        else:
            lines.append(f"  - {where}: {item['msg']} (got {item.get('input')!r})")
    return "\n".join(lines)


def _model_at(loc: tuple) -> type[BaseModel] | None:
    model: type[BaseModel] | None = TargetProfile
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        candidates = [annotation, *get_args(annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _compare_fix(terms: str) -> str:
    """The fix for a profile file that is not valid: compare it with a shipped one, as ``edgesdk targets show``
    prints it (its summary() as YAML), or for a Python caller (``terms`` "python") as that prints it in Python."""
    if terms == "python":
        return ("compare the file with a shipped profile "
                "(print(yaml.safe_dump(edgesdk.profile.get_profile('rpi5').summary(), sort_keys=False)))")
    return "compare the file with a shipped profile (edgesdk targets show rpi5)"


def parse_profile(text: str, source: str = "<string>", terms: str = "cli") -> TargetProfile:
    """Parse and validate one profile's YAML text (``terms``: as :func:`get_profile`'s)."""
    try:
        data = load_yaml_unique(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"target profile {source} is not valid YAML: {exc}",
                           "fix the YAML syntax (each key once per section)") from exc
    if not isinstance(data, dict):
        got = "nothing (the file is empty, or holds only comments)" if data is None else type(data).__name__
        raise ProfileError(
            f"target profile {source} must be a YAML mapping, got {got}",
            "start the file with 'name: <board>' and the other keys of targets/README.md",
        )
    try:
        return TargetProfile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(
            _format_validation_error(source, exc), _compare_fix(terms)
        ) from exc


def bundle_profile(section: object, bundle: str | Path) -> TargetProfile:
    """The target profile a bundle's manifest holds (its 'target' section, a copy of the profile it was built
    for), which the thermal guard reads its limits and thermal model from; one that is not a profile this edgesdk
    reads (a manifest edited by hand and hashed again, or a bundle whose profile lacks a key this edgesdk needs) is
    a :class:`~edgesdk.errors.BundleError` naming the bundle and each key, as a profile file's are named, rather
    than pydantic's bare ValidationError."""
    try:
        return TargetProfile.model_validate(section, context={BUNDLE_COPY: True})
    except ValidationError as exc:
        listed = _format_validation_error(f"in the manifest of bundle {bundle} ('target')", exc)
        raise BundleError(listed, "rebuild the bundle with 'edgesdk build' (the manifest's 'target' is a copy of "
                          "the profile it was built for), or leave the thermal guard off") from exc


def load_profile_file(path: str | Path, terms: str = "cli") -> TargetProfile:
    """Load a profile from a YAML file outside the package (a user's own board; ``terms``: as
    :func:`get_profile`'s)."""
    path = Path(path)
    if not path.is_file():
        state = "is a directory, not a file" if path.is_dir() else "does not exist"
        shipped = path.stem if not path.is_dir() and path.stem in alias_table() else None
        if shipped is None:
            raise ProfileError(f"target profile file {path} {state}", "pass a shipped target name or a YAML path")
        # 'rpi5.yaml' or 'targets/rpi5.yaml' (the repository's copy) typed for the shipped profile 'rpi5'
        given = f"target='{shipped}'" if terms == "python" else f"the target as {shipped}"
        raise ProfileError(f"target profile file {path} {state}; '{shipped}' is the name of a shipped target, "
                           "which is given without the .yaml suffix or a folder",
                           f"pass {given} for the shipped profile, or the path of an existing profile YAML")
    return parse_profile(read_utf8(path, "target profile", ProfileError), str(path), terms)


@lru_cache(maxsize=1)
def shipped_profiles() -> dict[str, TargetProfile]:
    """All profiles shipped in edgesdk.targets, by canonical name."""
    profiles: dict[str, TargetProfile] = {}
    for entry in sorted(resources.files("edgesdk.targets").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            profile = parse_profile(entry.read_text(encoding="utf-8"), f"targets/{entry.name}")
            if entry.name != f"{profile.name}.yaml":
                raise ProfileError(
                    f"targets/{entry.name} declares name '{profile.name}'", f"rename it to {profile.name}.yaml"
                )
            profiles[profile.name] = profile
    return profiles


def alias_table() -> dict[str, str]:
    """Alias -> canonical name, including each canonical name itself."""
    table: dict[str, str] = {}
    for name, profile in shipped_profiles().items():
        for key in (name, *profile.aliases):
            table[key] = name
    return table


def get_profile(name_or_path: str, terms: str = "cli") -> TargetProfile:
    """Resolve a target by canonical name or alias (in any case: RPI5 is rpi5), or path to a YAML file. ``terms``:
    whose names a refusal's fix gives the target, ``"cli"`` the command line's (``--target``, ``edgesdk targets
    list``), ``"python"`` the ``target`` argument of build_bundle() and load() (edgesdk.build.checkpoint.TERMS,
    BuildConfig.terms)."""
    if name_or_path.lower().endswith((".yaml", ".yml")) or "/" in name_or_path:  # board.YAML is a file too
        return load_profile_file(name_or_path, terms)
    table = alias_table()
    folded = {key.casefold(): key for key in table}  # 'RPI5', 'Orin-NX': the board as its vendor writes it
    if name_or_path not in table and name_or_path.casefold() in folded:
        return shipped_profiles()[table[folded[name_or_path.casefold()]]]
    if name_or_path not in table:
        if Path(name_or_path).is_file():  # as load_recipe says of a recipe file without the suffix
            raise ProfileError(f"target profile file {name_or_path} does not end in .yaml or .yml, so it was taken for "
                               f"a target name; known targets: {', '.join(sorted(table))}",
                               f"rename it to {name_or_path}.yaml and pass that path")
        raise ProfileError(
            f"unknown target '{name_or_path}'; known targets: {', '.join(sorted(table))}"
            f"{did_you_mean(name_or_path.casefold(), sorted(table))}",
            "run 'edgesdk targets list', or pass the path of your own profile YAML" if terms != "python" else
            "pass one of the known targets as target (e.g. target='rpi5'), or the path of your own profile YAML",
        )
    return shipped_profiles()[table[name_or_path]]
