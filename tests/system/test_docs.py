"""The README is a user's manual and BENCHMARKS.md a page of current tables: both stay short,
the README's set-up is two commands, its layout table matches the tree, and the links of the
manual's pages lead somewhere."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BENCHMARKS = ROOT / "BENCHMARKS.md"
# Generated from the settings models by another part of the tooling; its link is checked once
# the file exists.
GENERATED = {ROOT / "docs" / "configuration.md"}
# The lab notebook quotes pages as they stood, links included: it is not checked.
UNCHECKED = {ROOT / "docs" / "benchmarks-log.md"}

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def section(text: str, heading: str) -> str:
    """The body of the ``## `` section whose heading starts with ``heading``."""
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"README.md has no section '## {heading}'"
    return match.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_readme_is_at_most_200_lines():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= 200, f"README.md has {lines} lines: move detail to a page under docs/"


def test_benchmarks_is_at_most_400_lines():
    lines = len(BENCHMARKS.read_text(encoding="utf-8").splitlines())
    assert lines <= 400, f"BENCHMARKS.md has {lines} lines: move history to docs/benchmarks-log.md"


def test_readme_set_up_is_exactly_the_two_commands():
    body = section(README.read_text(encoding="utf-8"), "Set-up")
    blocks = re.findall(r"^```\w*\n(.*?)^```", body, re.M | re.S)
    assert len(blocks) == 1, "the set-up section holds one code block"
    commands = [line.split("#")[0].strip() for line in blocks[0].splitlines()]
    assert [c for c in commands if c] == ["make serve", "make test"]


def layout_paths() -> list[str]:
    body = section(README.read_text(encoding="utf-8"), "Layout")
    return re.findall(r"^\| `([^`]+)` \|", body, re.M)


def tracked_top_level_folders() -> set[str]:
    try:
        listed = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked folders are unknown")
    return {line.split("/")[0] + "/" for line in listed.splitlines() if "/" in line}


def test_readme_layout_lists_paths_that_exist():
    paths = layout_paths()
    assert paths, "README.md's layout table is empty"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"README.md's layout names paths that do not exist: {missing}"


def test_readme_layout_lists_every_top_level_folder_and_service_subpackage():
    listed = set(layout_paths())
    subpackages = {f"service/{p.parent.name}/" for p in (ROOT / "service").glob("*/__init__.py")}
    unlisted = sorted((tracked_top_level_folders() | subpackages) - listed)
    assert not unlisted, f"README.md's layout table lacks {unlisted}"


def manual_pages() -> list[Path]:
    pages = [README, BENCHMARKS, *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in pages if p not in UNCHECKED]


@pytest.mark.parametrize("page", manual_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings_that_exist(page: Path):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if path in GENERATED and not path.exists():
            continue
        heading_missing = anchor and path.suffix == ".md" and anchor not in anchors(path)
        if not path.exists() or heading_missing:
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to nothing: {broken}"


def test_readme_links_to_the_generated_configuration_page():
    assert "](docs/configuration.md)" in README.read_text(encoding="utf-8")
    if not (ROOT / "docs" / "configuration.md").exists():
        pytest.skip("docs/configuration.md is generated from the settings models")
