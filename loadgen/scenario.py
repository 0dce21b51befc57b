"""Load scenarios: what the edges publish and which resizes are applied when, as data.

Why files and built-ins: a benchmark that compares in-place resize with a restart is only worth
something if the same scenario can be re-run, reviewed and versioned. A scenario is a YAML, TOML or
JSON mapping (see ``loadgen/scenarios/*.yaml``); the built-ins (``demo``, ``ci-short``, ``long``)
ship in the package. Parsing is strict: unknown keys, wrong types and impossible values are all
reported at once in one :class:`ScenarioError`, naming the file and the key, so a typo never turns
into a silently different benchmark.

Units: durations are seconds or strings with a unit (``"10s"``, ``"500ms"``, ``"2m"``); cpu is in
cores (``0.5``) or a Kubernetes quantity (``"500m"``); memory is bytes or a quantity (``"2Gi"``).
"""

from __future__ import annotations

import glob
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from bridge.resources.quantity import QuantityError, format_bytes, to_bytes, to_millicores

BUILTINS = ("demo", "ci-short", "long", "steady")
TRANSPORTS = ("ws", "grpc", "mixed")
BASELINES = ("restart", "none")


class ScenarioError(ValueError):
    """Every problem found in one scenario (``problems``), reported together."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid scenario {source}:\n{lines}")


@dataclass(frozen=True, slots=True)
class ResizeStep:
    """One in-place resize: at ``at_s`` seconds after publishing starts, set the limits.

    ``cpu`` in cores, ``memory`` in bytes; ``None`` leaves that resource as it is.
    """

    at_s: float
    cpu: float | None = None
    memory: int | None = None
    #: ``memory: usage``: a limit just below what the bridge uses at that moment, the case the
    #: kubelet holds (docs/kubernetes.md) and the bridge's cooperative downscale has to resolve
    memory_below_usage: bool = False

    def describe(self) -> str:
        parts = []
        if self.cpu is not None:
            parts.append(f"cpu {self.cpu:g}")
        if self.memory is not None:
            parts.append(f"memory {format_bytes(self.memory)}")
        if self.memory_below_usage:
            parts.append("memory below usage")
        return f"@{self.at_s:g}s " + ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str = ""
    # Edges
    edges: int = 4
    transport: str = "mixed"  # ws | grpc | mixed (alternating)
    streams_per_edge: int = 1
    rate_hz: float = 10.0
    points: int = 5_000
    clouds: tuple[str, ...] = ()  # PCD/PLY paths or globs replayed in a loop (needs Open3D)
    color: bool = False
    telemetry: bool = True
    voxel_size: float = 0.0  # 0 = the bridge's default
    seed: int = 0
    # Time
    duration_s: float = 30.0
    warmup_s: float = 1.0  # published but outside every phase: connection set-up noise
    drain_s: float = 15.0  # after publishing, wait this long for everything to be delivered
    # Resources
    initial_cpu: float | None = 2.0
    initial_memory: int | None = 2 << 30
    resizes: tuple[ResizeStep, ...] = ()
    hold_timeout_s: float = 15.0  # a memory decrease below usage waits at most this long
    adapt_timeout_s: float = 10.0  # a resize not seen in the bridge's plan by then is a failure
    # Baseline
    baseline: str = "restart"  # restart | none
    # Extra bridge settings (Settings field names → values), passed as BRIDGE_* env
    bridge: dict[str, Any] = field(default_factory=dict)

    @property
    def frames_per_edge(self) -> int:
        per_tick = self.streams_per_edge + (1 if self.telemetry else 0)
        return int(self.duration_s * self.rate_hz) * per_tick

    def transport_of(self, edge_index: int) -> str:
        if self.transport == "mixed":
            return "ws" if edge_index % 2 == 0 else "grpc"
        return self.transport

    def cloud_files(self) -> list[str]:
        """The files ``clouds`` names, globs expanded and sorted (relative to the cwd)."""
        out: list[str] = []
        for pattern in self.clouds:
            matches = sorted(glob.glob(pattern))
            out.extend(matches if matches else [pattern])
        return out

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["resizes"] = [asdict(r) for r in self.resizes]
        d["clouds"] = list(self.clouds)
        return d

    def summary(self) -> str:
        src = f"{len(self.clouds)} cloud file pattern(s)" if self.clouds else f"{self.points} pts"
        return (
            f"{self.name}: {self.edges} edges ({self.transport}) x {self.streams_per_edge} "
            f"stream(s){' + telemetry' if self.telemetry else ''} @ {self.rate_hz:g} Hz, {src}, "
            f"{self.duration_s:g} s, {len(self.resizes)} resizes, baseline {self.baseline}"
        )


# ---------------------------------------------------------------------------------------------
# Value parsers (each raises ValueError with a message that reads well after "key: ")

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: Any) -> float:
    """Seconds from ``12``, ``12.5``, ``"12s"``, ``"500ms"``, ``"2m"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise ValueError(f"expected a duration like 10, '10s' or '500ms', got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"must be >= 0, got {value!r}")
    return seconds


def parse_cpu(value: Any) -> float:
    """Cores from ``0.5``, ``2`` or a quantity ``"500m"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected cores or a quantity, got {value!r}")
    try:
        cores = float(value) if isinstance(value, int | float) else to_millicores(value) / 1000
    except (QuantityError, ValueError, TypeError):
        raise ValueError(f"expected cores (0.5) or a quantity ('500m'), got {value!r}") from None
    if not math.isfinite(cores) or cores < 0.01:
        raise ValueError(f"must be at least 0.01 cores (10m), got {value!r}")
    return cores


def parse_memory(value: Any) -> int:
    """Bytes from an integer or a quantity (``"2Gi"``, ``"512Mi"``)."""
    if isinstance(value, bool):
        raise ValueError(f"expected bytes or a quantity, got {value!r}")
    try:
        n = to_bytes(value)
    except (QuantityError, ValueError, TypeError):
        raise ValueError(
            f"expected bytes, a quantity like '2Gi' (or 'usage' in a resize step), got {value!r}"
        ) from None
    if n < 16 << 20:
        raise ValueError(f"must be at least 16Mi, got {value!r}")
    return n


# ---------------------------------------------------------------------------------------------
# Mapping → Scenario

_SIMPLE: dict[str, tuple[str, Any]] = {
    # file key: (field, parser)
    "description": ("description", str),
    "edges": ("edges", int),
    "transport": ("transport", str),
    "streams_per_edge": ("streams_per_edge", int),
    "rate_hz": ("rate_hz", float),
    "points": ("points", int),
    "color": ("color", bool),
    "telemetry": ("telemetry", bool),
    "voxel_size": ("voxel_size", float),
    "seed": ("seed", int),
    "duration": ("duration_s", parse_duration),
    "warmup": ("warmup_s", parse_duration),
    "drain": ("drain_s", parse_duration),
    "hold_timeout": ("hold_timeout_s", parse_duration),
    "adapt_timeout": ("adapt_timeout_s", parse_duration),
    "baseline": ("baseline", str),
}
_KEYS = (*_SIMPLE, "name", "clouds", "initial", "resizes", "bridge")


def _strict(kind: type, value: Any) -> Any:
    """int/float/bool/str without the surprises (True is not 1, "3" is not 3)."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true/false, got {value!r}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def _resources(
    where: str, raw: Any, problems: list[str], *, allow_usage: bool = False
) -> tuple[float | None, int | None]:
    if not isinstance(raw, dict):
        problems.append(f"{where}: expected a mapping with cpu and/or memory, got {raw!r}")
        return None, None
    cpu: float | None = None
    mem: int | None = None
    for key in raw:
        if key not in ("cpu", "memory", "at"):
            problems.append(f"{where}: unknown key {key!r} (expected at, cpu, memory)")
    if "cpu" in raw:
        try:
            cpu = parse_cpu(raw["cpu"])
        except ValueError as exc:
            problems.append(f"{where}.cpu: {exc}")
    if "memory" in raw and not (allow_usage and raw["memory"] == "usage"):
        try:
            mem = parse_memory(raw["memory"])
        except ValueError as exc:
            problems.append(f"{where}.memory: {exc}")
    return cpu, mem


def from_mapping(data: Any, source: str = "<scenario>", name: str | None = None) -> Scenario:
    """Validate a parsed scenario mapping; every problem is collected into one ScenarioError."""
    if not isinstance(data, dict):
        raise ScenarioError(source, ["expected a mapping at the top level"])
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key in data:
        if key not in _KEYS:
            problems.append(f"unknown key {key!r} (known: {', '.join(sorted(_KEYS))})")
    for key, (fname, parse) in _SIMPLE.items():
        if key in data:
            try:
                values[fname] = (
                    _strict(parse, data[key]) if isinstance(parse, type) else parse(data[key])
                )
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
    scenario_name = data.get("name", name or Path(source).stem)
    if not isinstance(scenario_name, str) or not scenario_name:
        problems.append(f"name: expected a non-empty string, got {scenario_name!r}")
        scenario_name = "scenario"
    if "clouds" in data:
        clouds = data["clouds"]
        if isinstance(clouds, str):
            clouds = [clouds]
        if not isinstance(clouds, list) or not all(isinstance(c, str) for c in clouds):
            problems.append(f"clouds: expected a path/glob or a list of them, got {clouds!r}")
        else:
            values["clouds"] = tuple(clouds)
    if "initial" in data:
        cpu, mem = _resources("initial", data["initial"], problems)
        values["initial_cpu"], values["initial_memory"] = cpu, mem
    steps: list[ResizeStep] = []
    raw_steps = data.get("resizes", [])
    if not isinstance(raw_steps, list):
        problems.append(f"resizes: expected a list of {{at, cpu, memory}}, got {raw_steps!r}")
        raw_steps = []
    for i, raw in enumerate(raw_steps):
        where = f"resizes[{i}]"
        cpu, mem = _resources(where, raw, problems, allow_usage=True)
        if not isinstance(raw, dict):
            continue
        if "at" not in raw:
            problems.append(f"{where}: missing 'at' (when, e.g. '10s')")
            continue
        try:
            at = parse_duration(raw["at"])
        except ValueError as exc:
            problems.append(f"{where}.at: {exc}")
            continue
        if cpu is None and mem is None and ("cpu" not in raw and "memory" not in raw):
            problems.append(f"{where}: changes nothing (give cpu and/or memory)")
        steps.append(ResizeStep(at, cpu, mem, memory_below_usage=raw.get("memory") == "usage"))
    values["resizes"] = tuple(steps)
    if "bridge" in data:
        if not isinstance(data["bridge"], dict):
            problems.append("bridge: expected a mapping of bridge settings")
        else:
            values["bridge"] = dict(data["bridge"])
            problems += _check_bridge_settings(values["bridge"])
    if not problems:
        problems += _check(Scenario(name=scenario_name, **values))
    if problems:
        raise ScenarioError(source, problems)
    return Scenario(name=scenario_name, **values)


def override(s: Scenario, *, duration_s: float | None = None) -> Scenario:
    """``s`` with values from the command line, validated like a file's (``ScenarioError``)."""
    if duration_s is None:
        return s
    out = replace(s, duration_s=duration_s)
    problems = _check(out)
    if problems:
        raise ScenarioError(f"{s.name} with --duration {duration_s:g}", problems)
    return out


def _check_bridge_settings(extra: dict[str, Any]) -> list[str]:
    from bridge.config.settings import Settings

    known = set(Settings.__dataclass_fields__)
    managed = {"host", "ws_port", "grpc_port", "http_port", "sink_address", "adapt"}
    out = []
    for key in extra:
        if key not in known:
            out.append(f"bridge.{key}: not a bridge setting")
        elif key in managed:
            out.append(f"bridge.{key}: set by the runner, cannot be overridden")
    return out


def _check(s: Scenario) -> list[str]:
    p: list[str] = []
    if s.edges < 1:
        p.append(f"edges: must be >= 1, got {s.edges}")
    if s.transport not in TRANSPORTS:
        p.append(f"transport: {s.transport!r} is not one of {', '.join(TRANSPORTS)}")
    if s.streams_per_edge < 0:
        p.append("streams_per_edge: must be >= 0")
    if s.streams_per_edge == 0 and not s.telemetry:
        p.append("streams_per_edge: 0 with telemetry off publishes nothing")
    if not 0 < s.rate_hz <= 1000:
        p.append(f"rate_hz: must be in (0, 1000], got {s.rate_hz}")
    if not 1 <= s.points <= 4_000_000:
        p.append(f"points: must be in 1..4000000, got {s.points}")
    if s.voxel_size < 0:
        p.append("voxel_size: must be >= 0")
    if s.duration_s <= 0:
        p.append("duration: must be > 0")
    if s.warmup_s >= s.duration_s:
        p.append("warmup: must be shorter than duration")
    if s.baseline not in BASELINES:
        p.append(f"baseline: {s.baseline!r} is not one of {', '.join(BASELINES)}")
    last = -1.0
    for i, r in enumerate(s.resizes):
        if r.at_s <= s.warmup_s or r.at_s >= s.duration_s:
            p.append(
                f"resizes[{i}].at: {r.at_s:g}s is outside the measured window "
                f"({s.warmup_s:g}s..{s.duration_s:g}s)"
            )
        if r.at_s <= last:
            p.append(f"resizes[{i}].at: steps must be in increasing time order")
        last = r.at_s
    return p


# ---------------------------------------------------------------------------------------------
# Loading


def parse_text(text: str, fmt: str, source: str = "<scenario>") -> Scenario:
    """Parse scenario text in ``fmt`` (``yaml``, ``toml`` or ``json``)."""
    try:
        if fmt == "toml":
            data: Any = tomllib.loads(text)
        elif fmt == "json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(source, [f"not valid {fmt.upper()}: {exc}"]) from None
    return from_mapping(data, source)


def load(path: str | Path) -> Scenario:
    """A scenario file (.yaml/.yml, .toml or .json)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(str(path), [f"cannot read: {exc.strerror or exc}"]) from None
    fmt = {".toml": "toml", ".json": "json"}.get(path.suffix.lower(), "yaml")
    return parse_text(text, fmt, str(path))


def builtin(name: str) -> Scenario:
    """A built-in scenario shipped in ``loadgen/scenarios/NAME.yaml``."""
    if name not in BUILTINS:
        raise ScenarioError(name, [f"no built-in scenario {name!r} (have {', '.join(BUILTINS)})"])
    text = resources.files("loadgen").joinpath("scenarios", f"{name}.yaml").read_text()
    return parse_text(text, "yaml", f"builtin:{name}")
