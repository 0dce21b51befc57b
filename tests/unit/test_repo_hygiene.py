"""The repository stands on its own: a clean clone has every file its text refers to.

Checks every tracked text file (``git ls-files``) for references to places outside the checkout
(a sibling ``../shared`` folder, absolute paths of a development machine, team notes that are not
part of the product), that relative paths written as ``../...`` resolve to tracked files inside
the repository, and that every relative link in tracked Markdown resolves, anchors included.
"""

from __future__ import annotations

import functools
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
THIS = Path(__file__).resolve().relative_to(REPO).as_posix()

# Outside references that have appeared in this repository before. Built from parts so that this
# file does not match itself.
FORBIDDEN = [
    re.compile(r"\.\./" + "shared"),
    re.compile(r"(?<![\w.])" + "shared" + r"/(?:k8s|data|seeds|hooks)/"),
    re.compile(r"/" + "work" + r"/(?:shared|main|wt)\b"),
    re.compile(r"\b" + "DESIGN" + r"(?:\.md\b| §| section)"),
    re.compile(r"\b" + "FACTS" + r"\b"),
    re.compile(r"\b" + "STYLE" + r"\.md\b"),
    re.compile(r"k8s-" + "semantics" + r"\.md"),
]

# A relative path token: ../ not preceded by a path or variable character (``${HERE}/../..`` and
# ``/../`` inside absolute paths are runtime paths, not references).
RELATIVE = re.compile(r"(?<![\w/.$}])(?:\.\./)+[\w.*-][\w./*-]*")
MD_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@functools.cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    ).stdout
    return tuple(p for p in out.decode().split("\0") if p)


@functools.cache
def tracked_set() -> frozenset[str]:
    files = set(tracked())
    dirs = {str(Path(f).parents[i].as_posix()) for f in files for i in range(len(Path(f).parts))}
    return frozenset(files | dirs)


def text_files() -> list[tuple[str, str]]:
    out = []
    for rel in tracked():
        path = REPO / rel
        if not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (PCD frames, PNG)
        out.append((rel, data.decode("utf-8", errors="replace")))
    return out


def _inside(rel_from: str, target: str) -> str | None:
    """``target`` relative to the file ``rel_from``, as a repository path; None if outside."""
    resolved = (REPO / rel_from).parent.joinpath(target).resolve()
    if not resolved.is_relative_to(REPO):
        return None
    return resolved.relative_to(REPO).as_posix() or "."


def test_git_lists_the_repository() -> None:
    assert "README.md" in tracked() and "pyproject.toml" in tracked()


def test_no_tracked_file_refers_to_places_outside_the_repository() -> None:
    found = []
    for rel, text in text_files():
        if rel == THIS:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for pattern in FORBIDDEN:
                if pattern.search(line):
                    found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


def test_relative_paths_resolve_to_tracked_files_inside_the_repository() -> None:
    bad = []
    for rel, text in text_files():
        if rel == THIS:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in RELATIVE.finditer(line):
                token = m.group(0).rstrip(".")
                target = _inside(rel, token.split("#")[0])
                if target is None:
                    bad.append(f"{rel}:{n}: {token} leaves the repository")
                    continue
                if "*" in target:
                    matches = [f for f in tracked() if Path(f).match(target)]
                    if not matches:
                        bad.append(f"{rel}:{n}: {token} matches no tracked file")
                elif target not in tracked_set():
                    bad.append(f"{rel}:{n}: {token} -> {target} is not in the repository")
    assert not bad, "\n".join(bad)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"`|\*\*|__", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@functools.cache
def anchors(rel: str) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in (REPO / rel).read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m and not in_code:
            slug = github_slug(m.group(2))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(out)


def test_github_slug_reference_cases() -> None:
    slug = github_slug("Operations: metrics, health, shutdown")
    assert slug == "operations-metrics-health-shutdown"
    assert github_slug("3. Decimation contract") == "3-decimation-contract"
    assert github_slug("Claims vs resize (DRA GPUs)") == "claims-vs-resize-dra-gpus"
    assert github_slug("The `/resize` subresource") == "the-resize-subresource"


def markdown_links() -> list[tuple[str, int, str]]:
    out = []
    for rel, text in text_files():
        if not rel.endswith(".md"):
            continue
        in_code = False
        for n, line in enumerate(text.splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            for m in MD_LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                out.append((rel, n, m.group(1)))
    return out


def test_markdown_links_are_found() -> None:
    links = {(rel, target) for rel, _, target in markdown_links()}
    assert ("README.md", "charts/simbridge/README.md") in links
    assert ("README.md", "#decimation") in links


def test_every_relative_markdown_link_resolves_inside_the_repository() -> None:
    bad = []
    for rel, n, target in markdown_links():
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = rel if not path else _inside(rel, path)
        if dest is None:
            bad.append(f"{rel}:{n}: {target} leaves the repository")
            continue
        if dest not in tracked_set():
            bad.append(f"{rel}:{n}: {target} -> {dest} is not a tracked file")
            continue
        if anchor and dest.endswith(".md") and anchor not in anchors(dest):
            bad.append(f"{rel}:{n}: {target}: no heading with anchor #{anchor} in {dest}")
    assert not bad, "broken links:\n" + "\n".join(bad)


def test_license_and_notices_are_present() -> None:
    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text
    assert "tests/data/pcl/LICENSE" in (REPO / "NOTICE").read_text()
    pcl = (REPO / "tests" / "data" / "pcl" / "LICENSE").read_text()
    assert "Redistribution and use in source and binary forms" in pcl
    pcds = [f for f in tracked() if f.startswith("tests/data/pcl/") and f.endswith(".pcd")]
    assert pcds and "tests/data/pcl/LICENSE" in tracked()
