"""The docs and code stand on their own: no path outside the repository, no citation of a document
that is not in it, and every ``docs/sglang-contract.md §N`` citation names a section that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = "docs/sglang-contract.md"
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

# Pieces of our private notes' locations and names, and the ways code used to cite them. Joined
# at run time so this file does not match itself.
_SPEC = "spec"
FORBIDDEN = [
    ("a path on the development machine", re.compile(re.escape("/" + "work/"))),
    ("a path outside the repository", re.compile(re.escape("../" + "shared"))),
    ("a path outside the repository", re.compile(re.escape("shared/" + _SPEC + "s"))),
    ("a path to the private notes", re.compile(r"(?<![\w.-])" + _SPEC + r"s/")),
    ("a private note's name", re.compile(r"sglang-0\.5\.23-dsv4-kernels|bench-serving-0\.5\.23|rtx6000-box\.md")),
    ("a citation of the private notes",
     re.compile(r"\b" + _SPEC + r"s?\s*(?:sections?\b|§|\d)", re.IGNORECASE)),
    ("a citation of the private notes",
     re.compile(r"\b(?:kernels?|bench-serving|box)\s+" + _SPEC + r"\b|\bthe\s+" + _SPEC + r"\s+(?:says|said)\b",
                re.IGNORECASE)),
    ("a citation in the private notes' abbreviations",
     re.compile(r"\b(?:IX|BK|MD|FM|FT|MP|CFG|MODEL|ENV):\d")),
]

MD_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w-][\w.-]*\.md)\b")
MD_BARE = re.compile(r"(?<![\w/.-])([\w-][\w.-]*\.md)\b")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
CITATION = re.compile(r"sglang-contract\.md\S*((?:[\s,/]*(?:and|or)?\s*§\d+(?:\.\d+)*)+)")
SECTION_REF = re.compile(r"§(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,6}\s+§(\d+(?:\.\d+)*)\s", re.MULTILINE)


def tracked_text_files() -> dict[str, str]:
    try:
        listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        names = subprocess.run(listing, cwd=ROOT, capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                 if p.is_file() and ".git" not in p.relative_to(ROOT).parts]
    files = {}
    for name in filter(None, names):
        path = ROOT / name
        if name == THIS or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary (PNG and the like)
        files[name] = data.decode("utf-8", errors="replace")
    return files


@pytest.fixture(scope="module")
def files():
    return tracked_text_files()


def contract_sections() -> set[str]:
    return set(HEADING.findall((ROOT / CONTRACT).read_text()))


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _exists(name: str, cited_in: str) -> bool:
    return (ROOT / name).is_file() or (ROOT / cited_in).parent.joinpath(name).is_file()


def forbidden_hits(files: dict[str, str]) -> list[str]:
    hits = []
    for name, text in files.items():
        for what, pattern in FORBIDDEN:
            for m in pattern.finditer(text):
                hits.append(f"{name}:{_line(text, m.start())}: {what}: {m.group(0)!r}")
    return hits


def missing_documents(files: dict[str, str]) -> list[str]:
    """``.md`` documents named by a path anywhere, or by name or link in a markdown page, that the
    repository does not hold."""
    hits = []
    for name, text in files.items():
        cited = [(m.start(), m.group(1)) for m in MD_PATH.finditer(text)]
        if name.endswith(".md"):
            cited += [(m.start(), m.group(1)) for m in MD_BARE.finditer(text)]
            for m in MD_LINK.finditer(text):
                target = m.group(1).split("#", 1)[0]
                if target and "://" not in target and not target.startswith("mailto:"):
                    cited.append((m.start(), target))
        for pos, doc in cited:
            if not _exists(doc, name):
                hits.append(f"{name}:{_line(text, pos)}: {doc!r} is not in the repository")
    return hits


def bad_section_citations(files: dict[str, str], sections: set[str]) -> list[str]:
    hits = []
    for name, text in files.items():
        refs = [(m.start(), r) for m in CITATION.finditer(text) for r in SECTION_REF.findall(m.group(1))]
        if name == CONTRACT:
            refs = [(m.start(), m.group(1)) for m in SECTION_REF.finditer(text)]
        for pos, ref in refs:
            if ref not in sections:
                hits.append(f"{name}:{_line(text, pos)}: {CONTRACT} has no §{ref}")
    return hits


def test_contract_has_numbered_sections():
    sections = contract_sections()
    assert {"0", "2", "2.2", "2.3", "2.5", "2.7", "3.1", "4.2", "4.3", "4.4", "5", "8", "8.6"} <= sections


def test_no_path_outside_the_repository_and_no_private_citation(files):
    hits = forbidden_hits(files)
    assert not hits, "\n".join(hits)


def test_every_cited_document_is_in_the_repository(files):
    hits = missing_documents(files)
    assert not hits, "\n".join(hits)


def test_every_contract_citation_names_an_existing_section(files):
    hits = bad_section_citations(files, contract_sections())
    assert not hits, "\n".join(hits)


def test_the_checks_catch_what_they_are_for():
    # Each kind of fault, as it used to appear in this repository, is reported.
    bad = {
        "docs/a.md": "see `/" + "work/shared/" + _SPEC + "s/x.md` and [the notes](notes.md)",
        "kernels/b.py": "Byte layout (" + _SPEC + " section 2.3), Maths (" + _SPEC + " 4.4), BK:4350",
        "tests/c.py": "about 1e-3, as the " + _SPEC + " says; (" + CONTRACT + " §2.99 and §12)",
        "toolkit/d.py": "(bench-serving-0.5.23.md §7) and docs/missing.md",
    }
    forbidden = forbidden_hits(bad)
    for fragment in ("docs/a.md:1", "kernels/b.py:1", "tests/c.py:1", "toolkit/d.py:1"):
        assert any(h.startswith(fragment) for h in forbidden), (fragment, forbidden)
    assert len([h for h in forbidden if h.startswith("kernels/b.py")]) == 3
    missing = missing_documents(bad)
    assert any("'notes.md'" in h for h in missing) and any("'docs/missing.md'" in h for h in missing)
    wrong = bad_section_citations(bad, contract_sections())
    assert [h.rsplit("§", 1)[1] for h in wrong] == ["2.99", "12"]
    # ... and ordinary uses of the word pass.
    fine = {"toolkit/e.py": "spec = importlib.util.find_spec(name); parse_case(spec); "
                            "pip requirement specs; each spec is checked (" + CONTRACT + " §2.2, §4.3)"}
    assert not forbidden_hits(fine) and not bad_section_citations(fine, contract_sections())
