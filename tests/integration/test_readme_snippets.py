"""What the README tells a new user works as written: its "Connect a device" snippet, pasted into
a file, runs against a real bridge; every command it names exists (make targets in the Makefile,
``simbridge``/``simbridge-loadgen`` subcommands, benchmark modules); every relative link of the
README and of docs/ leads to a file and heading that exist; the README stays at most 400 lines;
and the operations guide's claim about a repeated seq is what the bridge does."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import websockets

from bridge.cli import COMMANDS as SIMBRIDGE_COMMANDS
from bridge.v1 import bridge_pb2 as pb
from loadgen.cli import COMMANDS as LOADGEN_COMMANDS
from tests.integration.harness import ROOT, cloud_frame, hello, running_bridge, ws_url

README = ROOT / "README.md"
OPERATIONS = ROOT / "docs" / "operations.md"
MAX_README_LINES = 400
TOKEN = "readme-token"


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def connect_snippet() -> str:
    """The first ```python block of "Connect a device", as a user would paste it."""
    found = re.search(r"```python\n(.*?)```", readme_section("Connect a device"), re.S)
    assert found, "README 'Connect a device' has no python block"
    return found.group(1)


def pointed_at(snippet: str, url: str, token: str) -> str:
    """The snippet with its URL and TOKEN settings (one line each) changed, nothing else."""
    for name, value in (("URL", url), ("TOKEN", token)):
        snippet, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", snippet, flags=re.M)
        assert n == 1, f"the snippet has no single '{name} = ...' line to set"
    return snippet


async def test_connect_a_device_snippet_runs_as_pasted(tmp_path: Path) -> None:
    async with running_bridge(auth_token=TOKEN) as service:
        script = tmp_path / "edge.py"
        script.write_text(pointed_at(connect_snippet(), ws_url(service), TOKEN))
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        # Both frames (one cloud, one telemetry) were reported delivered to the snippet.
        assert done.stdout.split() == ["delivered", "2"], done.stdout


async def test_readme_says_what_a_repeated_seq_on_one_connection_gets() -> None:
    """The README's sentence names the code the bridge really sends for the same seq twice."""
    async with running_bridge() as service, websockets.connect(ws_url(service)) as ws:
        await ws.send(hello("dev-1", "lidar").SerializeToString())
        assert pb.BridgeMessage.FromString(await ws.recv()).HasField("welcome")
        frame = cloud_frame("lidar", 1)
        for _ in range(2):
            await ws.send(pb.EdgeMessage(frame=frame).SerializeToString())
        async with asyncio.timeout(5):
            while not (msg := pb.BridgeMessage.FromString(await ws.recv())).HasField("error"):
                pass
    code = pb.ErrorCode.Name(msg.error.code)
    assert (code, msg.error.fatal) == ("SEQ_REGRESSION", False)
    sessions = OPERATIONS.read_text().split("**Sessions.**", 1)[1].split("\n\n", 1)[0]
    assert f"non-fatal `{code}`" in sessions and "acked,\nnot stored again" not in sessions


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md: {lines} lines; move detail to docs/"


def _code(text: str) -> str:
    """Every code span and fenced block of a markdown text, joined (where commands are)."""
    fenced = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    rest = re.sub(r"```.*?```", "", text, flags=re.S)
    return "\n".join([*fenced, *re.findall(r"`([^`\n]+)`", rest)])


def commands_named(text: str) -> dict[str, set[str]]:
    code = _code(text)
    return {
        "make": set(re.findall(r"\bmake ([a-z][\w-]*)", code)),
        "simbridge": set(re.findall(r"\bsimbridge ([a-z][\w-]*)", code)),
        "simbridge-loadgen": set(re.findall(r"\bsimbridge-loadgen ([a-z][\w-]*)", code)),
        "module": set(re.findall(r"python -m (benchmarks\.\w+|bridge\.\w+)", code)),
        "script": set(re.findall(r"\bbash ([\w/.-]+\.sh)", code)),
    }


def missing_commands(text: str) -> list[str]:
    named = commands_named(text)
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    missing = [f"make {t}" for t in named["make"] - targets]
    missing += [f"simbridge {c}" for c in named["simbridge"] - set(SIMBRIDGE_COMMANDS)]
    missing += [
        f"simbridge-loadgen {c}" for c in named["simbridge-loadgen"] - set(LOADGEN_COMMANDS)
    ]
    missing += [m for m in named["module"] if not (ROOT / (m.replace(".", "/") + ".py")).exists()]
    missing += [f"bash {s}" for s in named["script"] if not (ROOT / s).exists()]
    return sorted(missing)


def test_every_command_the_readme_names_exists() -> None:
    named = commands_named(README.read_text())
    assert {"run", "test", "bench-relay", "bench-decimate"} <= named["make"]
    assert {"serve", "view", "decimate", "resources"} <= named["simbridge"]
    assert missing_commands(README.read_text()) == []


def test_a_command_that_is_gone_is_caught() -> None:
    text = "`make bench-nothing`, `simbridge bench decimate`, `python -m benchmarks.nothing`"
    assert missing_commands(text) == [
        "benchmarks.nothing",
        "make bench-nothing",
        "simbridge bench",
    ]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation and symbols out, spaces to '-'."""
    text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = _slug(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return broken


def test_every_relative_link_of_the_readme_and_docs_is_real() -> None:
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    assert [b for page in pages for b in broken_links(page)] == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# A — title `x`\n\n[ok](#a--title-x) [bad](#nope) [gone](missing.md)\n")
    found = [b.split(": ", 1)[1] for b in broken_links(page, tmp_path)]
    assert found == ["#nope (no such heading)", "missing.md (no such file)"]
