"""``simbridge-loadgen demo | run | report``: the scenario runner from the command line.

Why ``demo`` exists apart from ``run``: ``make run`` must work on a fresh machine with nothing to
choose, so it is ``run --builtin demo`` with the defaults fixed (local backend, restart baseline,
reports under ``reports/``), printing the comparison and where the files are. The handlers here
are registered in :mod:`loadgen.cli`'s command registry; like every handler there, they return
an exit code and never call ``sys.exit``.

Exit codes: 0 done (also when the numbers are bad: the report says so), 1 the run itself failed
(the bridge did not start, a backend is unavailable), 2 a bad scenario or argument.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loadgen import report as report_mod
from loadgen.resize import BACKENDS
from loadgen.scenario import BUILTINS, Scenario, ScenarioError, builtin, load, override

if TYPE_CHECKING:
    from loadgen.external import Target


class _Progress:
    """A one-line live status (rich) while a run is going; nothing when quiet or not a tty."""

    def __init__(self, enabled: bool) -> None:
        self.live: Any = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.live import Live
        except ImportError:
            return
        console = Console(stderr=True)
        if not console.is_terminal:
            return
        self.live = Live("", console=console, refresh_per_second=4, transient=True)

    def __enter__(self) -> _Progress:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, snap: dict[str, Any]) -> None:
        if self.live is None:
            return
        from rich.text import Text

        line = (
            f"[{snap['mode']}] {snap['elapsed_s']:5.1f}/{snap['duration_s']:g} s  "
            f"published {snap['published']}  delivered {snap['delivered']}  "
            f"dup {snap['duplicates']}  disconnects {snap['disconnects']}  "
            f"resizes {snap['resizes_done']}/{snap['resizes']}  {snap['phase']}"
        )
        self.live.update(Text(line))


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr, flush=True)


def _scenario(args: argparse.Namespace) -> Scenario:
    if args.scenario and args.builtin:
        raise ScenarioError("arguments", ["give a scenario file or --builtin, not both"])
    s = load(args.scenario) if args.scenario else builtin(args.builtin or "demo")
    return override(s, duration_s=getattr(args, "duration", None))


def _execute(args: argparse.Namespace, s: Scenario, frame_hook: Any = None) -> int:
    from loadgen.runner import run_scenario

    out = Path(args.out)
    _say(args, f"scenario {s.summary()}")
    _say(args, f"backend {args.backend}; reports in {out}/")
    started = time.monotonic()
    with _Progress(not args.quiet) as progress:
        try:
            rep = asyncio.run(
                run_scenario(
                    s,
                    out,
                    backend=args.backend,
                    baseline=args.baseline,
                    real_cpu=not args.no_real_cpu,
                    progress=progress.update,
                    frame_hook=frame_hook,
                )
            )
        except (RuntimeError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    rep["wall_s"] = round(time.monotonic() - started, 1)
    stem = rep["stem"]  # the sink records and bridge logs of this run share it
    json_path = report_mod.write(rep, out, stem)
    png = _plot(rep, out / f"{stem}.png")
    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        report_mod.print_report(rep)
        print(f"\nreport: {json_path}\nplot:   {png}\nwall time {rep['wall_s']} s")
    return 0


def _plot(rep: dict[str, Any], path: Path) -> str:
    """The PNG, or why there is none (matplotlib is optional: the numbers never depend on it)."""
    from loadgen.plot import render

    try:
        return str(render(rep, path))
    except ImportError as exc:  # matplotlib is imported lazily by render()
        return f"(skipped: {exc}; pip install matplotlib)"


def configure_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scenario", nargs="?", help="scenario file (.yaml/.toml/.json); see loadgen/scenarios/"
    )
    p.add_argument(
        "--builtin", choices=BUILTINS, help="a built-in scenario instead of a file (default demo)"
    )
    p.add_argument(
        "--duration", type=float, metavar="S", help="publish for S seconds (overrides the scenario)"
    )
    ext = p.add_argument_group(
        "external bridge",
        "drive a bridge that already runs (e.g. in a cluster): no child bridge, no local sink; "
        "delivery is what the bridge acknowledges to the edges; resize steps go to --pod through "
        "kubectl with the current context (--backend and --baseline do not apply)",
    )
    ext.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="ws://HOST:PORT[/v1/ingest] or grpc://HOST:PORT; repeat to spread the edges "
        "(edge i uses target i mod N)",
    )
    ext.add_argument("--pod", metavar="NAME", help="the bridge's Pod, for the scenario's resizes")
    ext.add_argument("--namespace", metavar="NS", help="its namespace (default: the context's)")
    ext.add_argument(
        "--container", default="bridge", help="the container to resize (default %(default)s)"
    )
    ext.add_argument(
        "--report", metavar="FILE", help="write the JSON report here (default: under --out)"
    )
    ext.add_argument(
        "--connect-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="give up (exit 1) if an edge gets no Welcome within S seconds (default %(default)s)",
    )
    _common(p)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="local",
        help="how in-place resizes reach the bridge: local = write the cgroup files it reads "
        "(+ a real CPU cgroup as root); kubesim = PATCH /resize on the local Kubernetes stand-in; "
        "kubectl = kubectl patch --subresource resize against the stand-in (default %(default)s)",
    )
    p.add_argument(
        "--baseline",
        choices=("restart", "none"),
        default=None,
        help="also run the same plan as restarts (default: the scenario's 'baseline')",
    )
    p.add_argument(
        "--out", default="reports", metavar="DIR", help="report directory (default %(default)s)"
    )
    p.add_argument(
        "--no-real-cpu",
        action="store_true",
        help="do not throttle the bridge through a real cgroup CPU controller",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display (for CI)")
    p.add_argument("--json", action="store_true", help="print the report JSON instead of tables")


def run_command(args: argparse.Namespace) -> int:
    from loadgen.external import parse_target

    try:
        s = _scenario(args)
        targets = [parse_target(t) for t in args.target]
    except ValueError as exc:  # ScenarioError too
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not targets and (args.pod or args.report or args.namespace):
        print("error: --pod, --namespace and --report go with --target", file=sys.stderr)
        return 2
    if targets:
        return _execute_external(args, s, targets)
    return _execute(args, s)


def _execute_external(args: argparse.Namespace, s: Scenario, targets: list[Target]) -> int:
    from loadgen.external import ExternalRun, KubectlResizer, check_scenario, format_report

    problems = check_scenario(s) + (
        ["the scenario resizes: give --pod (kubectl, current context)"]
        if s.resizes and not args.pod
        else []
    )
    if problems:
        print(f"error: scenario {s.name}: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        resizer = (
            KubectlResizer(args.pod, namespace=args.namespace, container=args.container)
            if args.pod
            else None
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _say(args, f"scenario {s.summary()}")
    _say(args, "targets " + ", ".join(str(t) for t in targets))
    with _Progress(not args.quiet) as progress:
        run = ExternalRun(
            s,
            targets,
            resizer=resizer,
            progress=progress.update,
            connect_timeout_s=args.connect_timeout,
        )
        try:
            rep = asyncio.run(run.execute())
        except (ConnectionError, TimeoutError, OSError, RuntimeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = Path(args.report) if args.report else Path(args.out) / f"{s.name}-{stamp}-external.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rep, indent=2) + "\n")
    print(json.dumps(rep, indent=2) if args.json else format_report(rep) + f"\nreport: {path}")
    return 0 if rep["ok"] else 1


def configure_demo(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--no-view", action="store_true", help="do not start `simbridge view`")


def demo_command(args: argparse.Namespace) -> int:
    s = builtin("demo")
    if args.no_view:
        return _execute(args, s)
    from bridge.view.sidecar import ViewSidecar  # the delivered frames, live and in MCAP

    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    view = ViewSidecar(Path(args.out) / f"demo-{stamp}-view", Path(args.out) / "view.log")
    try:
        view.start()
    except (RuntimeError, OSError) as exc:
        _say(args, f"{exc}; running without it")
        return _execute(args, s)
    try:
        print("\n".join(["simbridge view (the delivered frames):", *view.where()]), flush=True)
        return _execute(args, s, frame_hook=view.hook)
    finally:
        view.stop()
        print("\n".join(["recorded by simbridge view:", *view.where()[2:]]), flush=True)


def configure_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="a report JSON written by `run` or `demo`")
    p.add_argument("--png", metavar="FILE", help="write the plot here (default: next to FILE)")
    p.add_argument("--no-png", action="store_true", help="only print the table")


def report_command(args: argparse.Namespace) -> int:
    try:
        rep = report_mod.load(args.file)
        report_mod.validate(rep)
    except (OSError, ValueError) as exc:
        print(f"error: {args.file}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # jsonschema.ValidationError and friends
        print(f"error: {args.file} does not match the report schema: {exc}", file=sys.stderr)
        return 2
    report_mod.print_report(rep)
    if not args.no_png:
        png = Path(args.png) if args.png else Path(args.file).with_suffix(".png")
        print(f"\nplot: {_plot(rep, png)}")
    return 0
