"""One ``/metrics`` for a pod: the Prometheus text expositions of its ingest processes merged
into one (docs/operations.md, "A pod"). Sans-I/O: text in, text out; the fetching is
``bridge.pod.ops_http``.

Why merge and not expose each process: Prometheus scrapes the pod's one ops port, and every
dashboard, alert and capacity figure reads pod totals (frames received, delivered, refused).

- Counters, histograms (``_bucket``, ``_sum``, ``_count``) and summaries (``_sum``, ``_count``)
  are summed across processes. A summary's quantiles do not add up: they are left out.
- Totals never go backwards: a process's last values are kept after it left and are carried
  over when its slot runs a new incarnation (another pid), whose counters start at 0 again.
  Within one incarnation a series that went down (or vanished) is a reset too: its last value is
  carried over, as Prometheus' ``rate()`` would read a reset.
- Counters whose sum means nothing are kept per process like gauges (:data:`PER_PROCESS`):
  ``bridge_event_loop_busy_seconds_total``, whose rate is one event loop's busy fraction (0-1),
  the HPA's signal: summed over N loops it would read up to N and scale out a pod that only
  grew in place. Each series restarts with its process; ``rate()`` reads that as a reset.
- Gauges (and untyped series, info and state-set series, which the text format writes as
  gauges) are kept per process, with a ``process="<index>"`` label; a label of that name the
  process set itself becomes ``exported_process`` (Prometheus' own rule for a clash).
- Bounded: an exposition over :data:`MAX_EXPOSITION_BYTES` or with more than
  :data:`MAX_SERIES` samples is refused (:class:`Refused`, the caller counts it), never merged;
  the series kept across processes and incarnations are capped at :data:`MAX_KEPT_SERIES`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as ParsedSample

MAX_EXPOSITION_BYTES = 8 * 1024 * 1024  # one process's /metrics; a bridge's is ~15-60 KiB
MAX_SERIES = 20_000  # samples in one exposition; a bridge has a few hundred
MAX_KEPT_SERIES = 100_000  # summed series kept (carried over and last values), all processes

CUMULATIVE = frozenset({"counter", "histogram", "summary"})
PER_PROCESS = frozenset({"bridge_event_loop_busy_seconds_total"})  # see the module docstring
REFUSE_REASONS = ("too_large", "too_many_series", "malformed")
PROCESS_LABEL = "process"
EXPORTED_LABEL = "exported_process"

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_SUFFIX_RANK = {"_bucket": 0, "_count": 1, "_sum": 2}

Labels = tuple[tuple[str, str], ...]  # sorted by name
SeriesKey = tuple[str, Labels]  # sample name, labels
Point = tuple[str, Labels, float]  # one sample: name, labels, value


class Refused(ValueError):
    """An exposition that is not merged; ``reason`` is one of :data:`REFUSE_REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # as on its TYPE line (a counter's ends with _total)
    kind: str  # counter, histogram, summary, gauge or untyped
    help: str
    samples: tuple[Point, ...]


@dataclass(frozen=True, slots=True)
class Exposition:
    """One process's parsed ``/metrics``."""

    families: tuple[Family, ...]
    series: int


def parse(
    text: bytes, *, max_bytes: int = MAX_EXPOSITION_BYTES, max_series: int = MAX_SERIES
) -> Exposition:
    """Parse (and check) one process's exposition; :class:`Refused` when it is not merged."""
    if len(text) > max_bytes:
        raise Refused("too_large", f"{len(text)} bytes > {max_bytes}")
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused("malformed", f"not UTF-8: {exc}") from None
    # Counted before parsing (the parser builds a whole family before it yields it).
    samples = sum(1 for line in decoded.splitlines() if line.strip()[:1] not in ("", "#"))
    if samples > max_series:
        raise Refused("too_many_series", f"{samples} samples > {max_series}")
    families: list[Family] = []
    try:
        for metric in text_string_to_metric_families(decoded):
            family = _family(metric.name, metric.type, metric.documentation, metric.samples)
            if family is not None:
                families.append(family)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise Refused("malformed", str(exc)[:200]) from None
    return Exposition(tuple(families), samples)


def _family(name: str, kind: str, help_: str, samples: list[ParsedSample]) -> Family | None:
    if kind == "counter":
        name += "_total"  # the parser names a counter family without it
    elif kind not in CUMULATIVE:
        kind = "untyped" if kind in ("untyped", "unknown") else "gauge"
    if not _NAME.match(name):
        raise ValueError(f"metric name {name!r} is not a plain Prometheus name")
    kept: list[Point] = []
    for sample in samples:
        sname, labels, value = sample.name, sample.labels, sample.value
        if not _NAME.match(sname) or not all(_LABEL.match(k) for k in labels):
            raise ValueError(f"sample name or label of {sname!r} is not plain")
        if kind == "summary" and sname == name:
            continue  # a quantile: not summable
        kept.append((sname, tuple(sorted(labels.items())), float(value)))
    return Family(name, kind, help_, tuple(kept)) if kept else None


@dataclass(slots=True)
class _Process:
    incarnation: int
    summed: dict[str, dict[SeriesKey, float]]  # family -> series -> last value
    gauges: dict[str, dict[SeriesKey, float]] | None  # None: not shown (stale or gone)


class PodMerge:
    """The merge's state across scrapes: which family is of which kind, each process's last
    values and what was carried over from processes that restarted or left."""

    def __init__(self, *, max_kept_series: int = MAX_KEPT_SERIES) -> None:
        self.max_kept_series = max_kept_series
        self._meta: dict[str, tuple[str, str]] = {}  # family -> (kind, help): first seen wins
        self._carried: dict[str, dict[SeriesKey, float]] = {}
        self._processes: dict[int, _Process] = {}
        self.resets = 0  # incarnations and series whose counts were carried over
        self.conflicts = 0  # samples left out: their family was seen with another kind
        self.dropped = 0  # summed series left out: over max_kept_series

    def update(self, index: int, incarnation: int, exposition: Exposition) -> None:
        """A fresh exposition from the process in slot ``index`` (``incarnation``: its pid)."""
        summed: dict[str, dict[SeriesKey, float]] = {}
        gauges: dict[str, dict[SeriesKey, float]] = {}
        for family in exposition.families:
            kind, _ = self._meta.setdefault(family.name, (family.kind, family.help))
            if kind != family.kind:
                self.conflicts += len(family.samples)
                continue
            into = summed if kind in CUMULATIVE and family.name not in PER_PROCESS else gauges
            series = into.setdefault(family.name, {})
            for name, labels, value in family.samples:
                series[(name, labels)] = value
        old = self._processes.get(index)
        if old is not None:
            restarted = old.incarnation != incarnation
            self.resets += restarted
            self._carry(old.summed, None if restarted else summed)
        self._processes[index] = _Process(incarnation, self._capped(summed, index), gauges)

    def hide_gauges(self, index: int) -> None:
        """The process's gauges leave the output (its last exposition is too old to show);
        its summed values stay until its next incarnation or :meth:`retire`."""
        process = self._processes.get(index)
        if process is not None:
            process.gauges = None

    def retire(self, index: int) -> None:
        """The slot is gone (the pod shrank): its last values are carried over."""
        process = self._processes.pop(index, None)
        if process is not None:
            self._carry(process.summed, None)

    def indexes(self) -> list[int]:
        return sorted(self._processes)

    def kept_series(self) -> int:
        return sum(len(s) for s in self._carried.values()) + sum(
            len(s) for p in self._processes.values() for s in p.summed.values()
        )

    def _carry(
        self, old: dict[str, dict[SeriesKey, float]], new: dict[str, dict[SeriesKey, float]] | None
    ) -> None:
        """Fold ``old`` values into the carry-over where ``new`` has none or a lower one."""
        room = self.max_kept_series - self.kept_series()
        for family, series in old.items():
            fresh = new.get(family, {}) if new is not None else {}
            carried = self._carried.setdefault(family, {})
            for key, value in series.items():
                now = fresh.get(key)
                if now is not None and not now < value:
                    continue
                if new is not None:
                    self.resets += 1
                if key in carried:
                    carried[key] += value
                elif room > 0:
                    carried[key] = value
                    room -= 1
                else:
                    self.dropped += 1
            if not carried:
                del self._carried[family]

    def _capped(
        self, summed: dict[str, dict[SeriesKey, float]], index: int
    ) -> dict[str, dict[SeriesKey, float]]:
        """New summed series past the pod-wide cap are left out (and counted)."""
        room = self.max_kept_series - self.kept_series()
        old = self._processes.get(index)
        if old is not None:
            room += sum(len(s) for s in old.summed.values())  # replaced by this update
        total = sum(len(s) for s in summed.values())
        if total <= room:
            return summed
        kept: dict[str, dict[SeriesKey, float]] = {}
        for family, series in summed.items():
            for key, value in series.items():
                if room > 0:
                    kept.setdefault(family, {})[key] = value
                    room -= 1
                else:
                    self.dropped += 1
        return kept

    def render(self) -> str:
        """The merged exposition (Prometheus text format 0.0.4)."""
        return "".join(self.render_parts())

    def render_parts(self) -> Iterator[str]:
        """:meth:`render` one family at a time, for a caller that yields to its event loop
        between them (no update may come before the last one)."""
        indexes = sorted(self._processes)
        for family, (kind, help_) in list(self._meta.items()):
            if kind in CUMULATIVE and family not in PER_PROCESS:
                lines = self._summed_lines(family, indexes)
            else:
                lines = self._gauge_lines(family, indexes)
            if lines:
                head = f"# HELP {family} {_escape_help(help_)}\n# TYPE {family} {kind}\n"
                yield head + "".join(lines)
        self._meta = {f: m for f, m in self._meta.items() if self._referenced(f)}

    def _referenced(self, family: str) -> bool:
        return family in self._carried or any(
            family in p.summed or (p.gauges is not None and family in p.gauges)
            for p in self._processes.values()
        )

    def _summed_lines(self, family: str, indexes: list[int]) -> list[str]:
        totals: dict[SeriesKey, float] = {}
        for index in indexes:
            for key, value in self._processes[index].summed.get(family, {}).items():
                totals[key] = totals.get(key, 0.0) + value
        for key, value in self._carried.get(family, {}).items():
            totals[key] = totals.get(key, 0.0) + value
        ordered = sorted(totals.items(), key=lambda kv: _series_order(family, kv[0]))
        return [_line(name, labels, value) for (name, labels), value in ordered]

    def _gauge_lines(self, family: str, indexes: list[int]) -> list[str]:
        lines: list[str] = []
        for index in indexes:
            gauges = self._processes[index].gauges
            if gauges is None:
                continue
            for (name, labels), value in gauges.get(family, {}).items():
                lines.append(_line(name, _with_process(labels, index), value))
        return lines


def _with_process(labels: Labels, index: int) -> Labels:
    """``process`` names the pod's process; the process's own label of that name is kept as
    ``exported_process`` (dropped when it has that label too)."""
    names = {k for k, _ in labels}
    renamed = [(EXPORTED_LABEL if k == PROCESS_LABEL else k, v) for k, v in labels]
    if PROCESS_LABEL in names and EXPORTED_LABEL in names:
        renamed = [(k, v) for k, v in labels if k != PROCESS_LABEL]
    return tuple(sorted([*renamed, (PROCESS_LABEL, str(index))]))


def _series_order(family: str, key: SeriesKey) -> tuple[Labels, int, float]:
    """Histogram children together, buckets by ``le``, as prometheus_client writes them."""
    name, labels = key
    rest = tuple((k, v) for k, v in labels if k != "le")
    le = next((v for k, v in labels if k == "le"), "")
    try:
        bound = float(le) if le else 0.0
    except ValueError:
        bound = math.inf
    return rest, _SUFFIX_RANK.get(name[len(family) :], 3), bound


def _line(name: str, labels: Labels, value: float) -> str:
    if not labels:
        return f"{name} {_value(value)}\n"
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
    return f"{name}{{{inner}}} {_value(value)}\n"


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
