"""The pod's /metrics merge (bridge.pod.metrics_merge): expositions written by real
prometheus_client registries in, text that prometheus_client's parser reads back out."""

from __future__ import annotations

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    Summary,
    generate_latest,
)
from prometheus_client.parser import text_string_to_metric_families

from bridge.pod.metrics_merge import (
    Exposition,
    PodMerge,
    Refused,
    parse,
)


class Proc:
    """One ingest process's metrics, as the bridge registers them."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.frames = Counter("bridge_frames_received", "Frames", ["transport"], registry=r)
        self.delivered = Counter("bridge_frames_delivered", "Delivered", registry=r)
        self.sessions = Gauge("bridge_sessions", "Sessions", registry=r)
        self.latency = Histogram(
            "bridge_e2e_latency_seconds", "Latency", buckets=(0.01, 0.1, 1.0), registry=r
        )

    def exposition(self) -> Exposition:
        return parse(generate_latest(self.registry))


def read(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``text`` by (name, sorted labels), through prometheus_client's parser
    (``*_created``: per process gauges when a registry writes them, left out here)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def kinds(text: str) -> dict[str, str]:
    return {
        f.name: f.type
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")
    }


def test_counters_and_histograms_are_summed_and_gauges_kept_per_process() -> None:
    a, b = Proc(), Proc()
    a.frames.labels("ws").inc(5)
    a.frames.labels("grpc").inc(1)
    b.frames.labels("ws").inc(7)
    a.sessions.set(3)
    b.sessions.set(4)
    for value in (0.005, 0.5):
        a.latency.observe(value)
    b.latency.observe(0.05)
    merge = PodMerge()
    merge.update(0, 100, a.exposition())
    merge.update(1, 101, b.exposition())
    text = merge.render()
    got = read(text)
    assert got[("bridge_frames_received_total", (("transport", "ws"),))] == 12
    assert got[("bridge_frames_received_total", (("transport", "grpc"),))] == 1
    assert got[("bridge_sessions", (("process", "0"),))] == 3
    assert got[("bridge_sessions", (("process", "1"),))] == 4
    assert ("bridge_sessions", ()) not in got
    buckets = {
        dict(labels)["le"]: v
        for (name, labels), v in got.items()
        if name == "bridge_e2e_latency_seconds_bucket"
    }
    assert buckets == {"0.01": 1, "0.1": 2, "1.0": 3, "+Inf": 3}
    assert got[("bridge_e2e_latency_seconds_count", ())] == 3
    assert got[("bridge_e2e_latency_seconds_sum", ())] == pytest.approx(0.555)
    assert kinds(text) == {
        "bridge_frames_received": "counter",
        "bridge_frames_delivered": "counter",
        "bridge_sessions": "gauge",
        "bridge_e2e_latency_seconds": "histogram",
    }
    # One HELP and TYPE per family, however many processes wrote it.
    assert text.count("# TYPE bridge_frames_received_total counter") == 1


def test_a_restarted_process_does_not_make_totals_go_backwards() -> None:
    a, b = Proc(), Proc()
    a.delivered.inc(10)
    b.delivered.inc(1)
    a.latency.observe(0.5)
    merge = PodMerge()
    totals = []

    def total() -> float:
        return read(merge.render())[("bridge_frames_delivered_total", ())]

    merge.update(0, 100, a.exposition())
    merge.update(1, 101, b.exposition())
    totals.append(total())  # 11
    restarted = Proc()  # slot 0 again, another pid: its counters start at 0
    restarted.delivered.inc(2)
    merge.update(0, 200, restarted.exposition())
    totals.append(total())  # 10 carried + 2 + 1
    restarted.delivered.inc(3)
    merge.update(0, 200, restarted.exposition())
    totals.append(total())  # 10 + 5 + 1
    assert totals == [11, 13, 16]
    got = read(merge.render())
    assert got[("bridge_e2e_latency_seconds_count", ())] == 1  # a's observation stays
    assert merge.resets == 1


def test_a_reset_without_a_new_pid_is_caught_per_series() -> None:
    a = Proc()
    a.delivered.inc(10)
    merge = PodMerge()
    merge.update(0, 100, a.exposition())
    fresh = Proc()
    fresh.delivered.inc(4)
    merge.update(0, 100, fresh.exposition())  # same pid (reused), the counter went down
    assert read(merge.render())[("bridge_frames_delivered_total", ())] == 14
    assert merge.resets == 1


def test_a_process_that_leaves_keeps_its_counts_but_not_its_gauges() -> None:
    a, b = Proc(), Proc()
    a.delivered.inc(5)
    b.delivered.inc(6)
    a.sessions.set(2)
    b.sessions.set(9)
    merge = PodMerge()
    merge.update(0, 100, a.exposition())
    merge.update(1, 101, b.exposition())
    merge.retire(1)
    got = read(merge.render())
    assert got[("bridge_frames_delivered_total", ())] == 11
    assert got[("bridge_sessions", (("process", "0"),))] == 2
    assert ("bridge_sessions", (("process", "1"),)) not in got
    assert merge.indexes() == [0]


def test_hidden_gauges_leave_the_output_and_the_counts_stay() -> None:
    a = Proc()
    a.delivered.inc(5)
    a.sessions.set(2)
    merge = PodMerge()
    merge.update(0, 100, a.exposition())
    merge.hide_gauges(0)
    text = merge.render()
    assert "bridge_sessions" not in text
    assert read(text)[("bridge_frames_delivered_total", ())] == 5
    merge.update(0, 100, a.exposition())
    assert read(merge.render())[("bridge_sessions", (("process", "0"),))] == 2


def test_info_state_sets_and_a_process_label_of_its_own() -> None:
    r = CollectorRegistry()
    Info("bridge_build", "Build", registry=r).info({"version": "1.2"})
    Enum("bridge_mode", "Mode", states=["a", "b"], registry=r).state("b")
    Gauge("bridge_owned", "Owned", ["process"], registry=r).labels("edge").set(1)
    merge = PodMerge()
    merge.update(3, 100, parse(generate_latest(r)))
    text = merge.render()
    got = read(text)
    assert got[("bridge_build_info", (("process", "3"), ("version", "1.2")))] == 1
    assert got[("bridge_mode", (("bridge_mode", "b"), ("process", "3")))] == 1
    assert got[("bridge_mode", (("bridge_mode", "a"), ("process", "3")))] == 0
    assert got[("bridge_owned", (("exported_process", "edge"), ("process", "3")))] == 1
    assert set(kinds(text).values()) == {"gauge"}


def test_summaries_sum_count_and_sum_and_leave_out_quantiles() -> None:
    text = (
        b"# HELP rpc_seconds RPC\n# TYPE rpc_seconds summary\n"
        b'rpc_seconds{quantile="0.5"} 0.2\nrpc_seconds_sum 4.0\nrpc_seconds_count 10\n'
    )
    r = CollectorRegistry()
    Summary("rpc_seconds", "RPC", registry=r).observe(1.0)
    merge = PodMerge()
    merge.update(0, 1, parse(text))
    merge.update(1, 2, parse(generate_latest(r)))
    out = merge.render()
    got = read(out)
    assert got == {("rpc_seconds_sum", ()): 5.0, ("rpc_seconds_count", ()): 11.0}
    assert kinds(out) == {"rpc_seconds": "summary"}


def test_label_values_and_help_are_escaped_on_the_way_out() -> None:
    r = CollectorRegistry()
    hostile = 'a"b\\c\nd'
    Counter("bridge_odd", "help with \\ and\nnewline", ["v"], registry=r).labels(hostile).inc(2)
    Gauge("bridge_odd_gauge", "g", ["v"], registry=r).labels(hostile).set(1)
    merge = PodMerge()
    merge.update(0, 1, parse(generate_latest(r)))
    merge.update(1, 2, parse(generate_latest(r)))
    families = {f.name: f for f in text_string_to_metric_families(merge.render())}
    assert families["bridge_odd"].documentation == "help with \\ and\nnewline"
    assert families["bridge_odd"].samples[0].labels == {"v": hostile}
    assert families["bridge_odd"].samples[0].value == 4
    assert {s.labels["process"]: s.labels["v"] for s in families["bridge_odd_gauge"].samples} == {
        "0": hostile,
        "1": hostile,
    }


def test_a_family_seen_with_another_kind_is_left_out_and_counted() -> None:
    counter = b"# HELP x_total X\n# TYPE x_total counter\nx_total 3\n"
    gauge = b'# HELP x_total X\n# TYPE x_total gauge\nx_total{a="1"} 5\nx_total{a="2"} 6\n'
    merge = PodMerge()
    merge.update(0, 1, parse(counter))
    merge.update(1, 2, parse(gauge))
    text = merge.render()
    assert read(text) == {("x_total", ()): 3}
    assert merge.conflicts == 2


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"x 1\n" * 11, "too_many_series"),
        (b'# TYPE x counter\nx{a="1" 1\n', "malformed"),
        (b"x{a=1} 1\n", "malformed"),
        (b"x not-a-number\n", "malformed"),
        (b"\xff\xfe 1\n", "malformed"),
        (b"# HELP x " + b"h" * 600 + b"\nx 1\n", "too_large"),
    ],
)
def test_oversized_and_malformed_expositions_are_refused(text: bytes, reason: str) -> None:
    with pytest.raises(Refused) as refused:
        parse(text, max_bytes=512, max_series=10)
    assert refused.value.reason == reason


def test_the_series_kept_are_capped_and_what_is_left_out_counted() -> None:
    r = CollectorRegistry()
    c = Counter("bridge_many", "Many", ["i"], registry=r)
    for i in range(10):
        c.labels(str(i)).inc()
    merge = PodMerge(max_kept_series=15)
    merge.update(0, 1, parse(generate_latest(r)))
    merge.update(1, 2, parse(generate_latest(r)))  # 20 series wanted, 15 kept
    assert merge.dropped == 5
    assert merge.kept_series() == 15
    merge.update(1, 3, parse(generate_latest(r)))  # a restart: carrying would pass the cap too
    assert merge.kept_series() <= 15
    got = read(merge.render())
    assert len(got) == 10
    assert all(v >= 1 for v in got.values())


def test_the_loop_busy_counter_stays_per_process_for_the_hpa() -> None:
    """Its rate is one loop's busy fraction (0-1), the HPA's signal: summed over two processes
    each 60 % busy it would read 1.2 and scale out a pod that only grew in place."""
    merge = PodMerge()
    for index, busy in ((0, 6.0), (1, 4.0)):
        registry = CollectorRegistry()
        Counter("bridge_event_loop_busy_seconds", "Busy", registry=registry).inc(busy)
        merge.update(index, 100 + index, parse(generate_latest(registry)))
    out = merge.render()
    got = read(out)
    assert got[("bridge_event_loop_busy_seconds_total", (("process", "0"),))] == 6.0
    assert got[("bridge_event_loop_busy_seconds_total", (("process", "1"),))] == 4.0
    assert ("bridge_event_loop_busy_seconds_total", ()) not in got
    assert kinds(out)["bridge_event_loop_busy_seconds"] == "counter"
