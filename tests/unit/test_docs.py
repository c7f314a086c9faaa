"""The documentation's contracts: README.md is a front page (at most 300 lines), every relative link
in README.md and docs/*.md finds its file (and its heading, where it names one), and every pointer
to a section in the code and the docs, `README: <section>` or `docs/<file>.md: <section>`, names a
section that exists."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

README_MAX_LINES = 300
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A section's name starts with a capital and runs to the first ) , ; . ] " or line end.
NAME = r"([A-Z][^),;.\]\"\n]*)"
POINTERS = [
    re.compile(r"\bREADME:\s+" + NAME),                       # README: <section>
    re.compile(r"\bREADME\s+\"([^\"\n]+)\""),                 # README, then the section in quotes
    re.compile(r"\b(docs/[\w-]+\.md):\s+" + NAME),            # docs/<file>.md: <section>
    re.compile(r"\]\(((?:\.\./|docs/)?[\w-]+\.md)\):\s+" + NAME),  # a link to a file, a colon, <section>
]
SCANNED = (".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".ipynb", ".cfg")
SCANNED_NAMES = {"inv", "run", "Vagrantfile"}


def _plain(text: str) -> str:
    return " ".join(text.replace("`", "").replace("*", "").split()).lower()


def sections(path: Path) -> list[str]:
    """A Markdown file's headings and its bold paragraph leads (`**Transport** (...)`), plain."""
    text = path.read_text()
    text = re.sub(r"```.*?```", "", text, flags=re.S)          # no comment in a code block is a heading
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.M)
    leads = re.findall(r"^\s*(?:- )?\*\*([^*\n]+)\*\*", text, re.M)
    return [_plain(h) for h in heads + leads]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def has_section(path: Path, name: str) -> bool:
    want = _plain(name)
    return any(h.startswith(want) or want.startswith(h + " ") for h in sections(path))


def repo_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split("\n")
        files = [REPO / n for n in names if n]
    except (OSError, subprocess.CalledProcessError):  # no git (the fresh OS), or a copy without .git
        skip = {".git", ".venv", "results", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"}
        files = [p for p in REPO.rglob("*") if p.is_file() and not skip & set(p.relative_to(REPO).parts)]
    return [p for p in files if p.is_file() and (p.suffix in SCANNED or p.name in SCANNED_NAMES)
            and p.stat().st_size < 2_000_000 and not p.relative_to(REPO).parts[0] == "results"]


def test_readme_is_a_front_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_finds_its_file_and_heading(doc):
    bad = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            bad.append(f"{target}: a link out of the repository")
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists():
            bad.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in {slug(h) for h in
                                                                re.findall(r"^#{1,6}\s+(.+)$", path.read_text(), re.M)}:
            bad.append(f"{target}: no such heading")
    assert not bad, f"{doc.relative_to(REPO)}:\n" + "\n".join(bad)


def test_every_section_pointer_names_a_section_that_exists():
    bad = []
    for path in repo_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for i, pattern in enumerate(POINTERS):
            for m in pattern.finditer(text):
                if i < 2:
                    target, name = REPO / "README.md", m.group(1)
                else:
                    file, name = m.group(1), m.group(2)
                    base = REPO if file.startswith("docs/") else path.parent
                    target = (base / file).resolve()
                line = text.count("\n", 0, m.start()) + 1
                where = f"{path.relative_to(REPO)}:{line}: {m.group(0).strip()!r}"
                if not target.exists():
                    bad.append(f"{where}: no file {target.relative_to(REPO)}")
                elif not has_section(target, name.strip()):
                    bad.append(f"{where}: {target.relative_to(REPO)} has no section {name.strip()!r}")
    assert not bad, "pointers to sections that do not exist:\n" + "\n".join(bad)
