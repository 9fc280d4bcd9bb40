"""Every reference in the code's comments resolves inside the repository.

Comments and docstrings cite behaviours by id (``SPEC L-5``); each id must be the start of a
heading in ``docs/``, so a reader with only the repository can look it up. Issue numbers and
sections of documents kept outside the repository (the team's design notes, protocol notes,
source documents) cannot be looked up, so they must not appear at all: say what is meant, or
point at a page of ``docs/``.

Only comments and docstrings of Python files are read (``tokenize`` and ``ast``), so string
literals in code (``metadata={"ticket": "T-1"}``) and hex colours in CSS are not mistaken for
references.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE_DIRS = ("shared", "worker", "scheduler", "tests", "bench")
THIS_FILE = Path(__file__).resolve()

# A behaviour id: one area letter, a dash, a number ("L-5") or "*" for the whole area ("P-*").
# Not glued to a word or another dash on either side, so "SHA-256", "UTF-8" and "X-API-Key"
# do not match.
BEHAVIOUR_ID = re.compile(r"(?<![\w-])([ACDHLMNPT])-(\d+|\*)(?![\w-])")
# A heading whose text starts with an id: "### L-5 Tool failures are data".
ID_HEADING = re.compile(r"^#{1,6}\s+([ACDHLMNPT]-\d+)\b", re.MULTILINE)

# Issue references: "issue #9", "issues 4", "(issue 12", "#15" standing alone, and the
# "acceptance 3" items of an issue. A "#" glued to a word or a path is something else: a URL
# fragment ("page#12"), another project's issue ("openai/openai-python#2806").
ISSUE_REF = re.compile(
    r"\bissues?\s*#?\d+\b|(?<![\w/&#.-])#\d+(?![\w-])|\bacceptance\s+\d+\b", re.IGNORECASE
)
# An issue named by its title: "(issue Crash safety, ...)" (lower-case "issue", then a
# capitalised word).
NAMED_ISSUE = re.compile(r"\bissues?\s+[A-Z][a-z]+")

# Documents that are not in the repository.
OUTSIDE_DOCS = re.compile(
    r"DESIGN\s*§|\bDESIGN\.md\b|\bSPEC\.md\b|\binterop\.md\b|\bhouse-review\b"
    r"|\bfastgpt-upstream\b|\bcelery-facts\b|\bpeers\.md\b|\bmodel-codebases\b"
    r"|\bseeds?\s+0\d\d\b|§\s*\d|\.\./shared\b",
    re.IGNORECASE,
)
DOCS_PAGE = re.compile(r"\bdocs/([\w.-]+\.md)\b")


@dataclass(frozen=True)
class Note:
    """One comment or docstring: where it is and its text."""

    path: Path
    line: int
    text: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _python_files() -> list[Path]:
    files: list[Path] = []
    for name in CODE_DIRS:
        files += sorted((ROOT / name).rglob("*.py"))
    return [f for f in files if f.resolve() != THIS_FILE]


def _comments(path: Path, source: str) -> Iterator[Note]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            yield Note(path, tok.start[0], tok.string.lstrip("#"))


def _docstrings(path: Path, source: str) -> Iterator[Note]:
    """Module, class and function docstrings, and the bare strings that document a name."""
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            yield Note(path, node.lineno, node.value.value)


def _notes() -> list[Note]:
    notes: list[Note] = []
    for path in _python_files():
        source = path.read_text(encoding="utf-8")
        notes += _comments(path, source)
        notes += _docstrings(path, source)
    return notes


NOTES = _notes()


def _doc_headings() -> set[str]:
    ids: set[str] = set()
    for page in DOCS.glob("*.md"):
        ids.update(ID_HEADING.findall(page.read_text(encoding="utf-8")))
    return ids


def _resolves(area: str, number: str, headings: set[str]) -> bool:
    if number == "*":
        return any(h.startswith(f"{area}-") for h in headings)
    return f"{area}-{number}" in headings


def test_the_docs_exist() -> None:
    pages = {p.name for p in DOCS.glob("*.md")}
    assert {"README.md", "loop.md", "model-client.md", "durability.md", "api.md"} <= pages


def test_every_behaviour_id_resolves_to_a_heading() -> None:
    headings = _doc_headings()
    unresolved = sorted(
        f"{note.where()}: {area}-{number}"
        for note in NOTES
        for area, number in BEHAVIOUR_ID.findall(note.text)
        if not _resolves(area, number, headings)
    )
    assert not unresolved, "ids without a heading in docs/:\n" + "\n".join(unresolved)


def test_the_code_cites_behaviour_ids() -> None:
    """The scan finds what it is meant to find (a regex that matches nothing passes vacuously)."""
    cited = {f"{a}-{n}" for note in NOTES for a, n in BEHAVIOUR_ID.findall(note.text)}
    assert {"L-5", "M-7", "C-2", "H-1"} <= cited


def test_no_issue_numbers_in_comments() -> None:
    found = sorted(
        f"{note.where()}: {match.group(0)!r}"
        for note in NOTES
        for pattern in (ISSUE_REF, NAMED_ISSUE)
        for match in pattern.finditer(note.text)
    )
    assert not found, "issue references in comments (say what is meant instead):\n" + "\n".join(
        found
    )


def test_no_references_to_documents_outside_the_repository() -> None:
    found = sorted(
        f"{note.where()}: {match.group(0)!r}"
        for note in NOTES
        for match in OUTSIDE_DOCS.finditer(note.text)
    )
    assert not found, "references to documents not in the repository:\n" + "\n".join(found)


def test_the_documentation_cites_nothing_outside_the_repository() -> None:
    """The docs themselves, the READMEs and the console's text name only what a reader has."""
    texts = [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "bench").glob("*.md")]
    texts += sorted((ROOT / "scheduler").rglob("*.js"))
    found = sorted(
        f"{path.relative_to(ROOT)}: {match.group(0)!r}"
        for path in texts
        for match in OUTSIDE_DOCS.finditer(path.read_text(encoding="utf-8"))
    )
    assert not found, "references to documents not in the repository:\n" + "\n".join(found)


def test_docs_pages_named_in_comments_exist() -> None:
    missing = sorted(
        f"{note.where()}: docs/{page}"
        for note in NOTES
        for page in DOCS_PAGE.findall(note.text)
        if not (DOCS / page).is_file()
    )
    assert not missing, "comments name docs pages that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize(
    ("text", "hits"),
    [
        ("tool failure is data (SPEC L-5)", ["L-5"]),
        (
            "SPEC M-1…M-10 and H-1..H-3; L-8/C-3; P-*",
            ["M-1", "M-10", "H-1", "H-3", "L-8", "C-3", "P-*"],
        ),
        ("SHA-256, UTF-8, X-API-Key, run-1, PT-1, A-1b", []),
    ],
)
def test_the_id_pattern(text: str, hits: list[str]) -> None:
    assert [f"{a}-{n}" for a, n in BEHAVIOUR_ID.findall(text)] == hits


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("Webhooks (issue #9)", True),
        ("issue 4 acceptance 6: round 60", True),
        ("see #15 for why", True),
        ("Issues 12", True),
        ("Recovery (issue Crash safety, acceptance 2 and 3)", True),
        ("the issue is that Python", False),
        ("noqa: E501", False),
        ("colour #2563eb and #fff", False),
        ("upstream bug openai/openai-python#2806", False),
        ("https://example.com/page#12", False),
        ("step 3 of 4, 10:30, 2 issues found", False),
    ],
)
def test_the_issue_patterns(text: str, flagged: bool) -> None:
    assert bool(ISSUE_REF.search(text) or NAMED_ISSUE.search(text)) is flagged


@pytest.mark.parametrize(
    ("text", "flagged"),
    [
        ("The schema (DESIGN §5)", True),
        ("see interop.md §2.4", True),
        ("seed 000 §3.3.5: the dataset sub agent", True),
        ("Seed 003's example", True),
        ("random.Random(seed)", False),
        ("the design of the round (docs/durability.md)", False),
        ("SPEC L-5", False),
    ],
)
def test_the_outside_docs_pattern(text: str, flagged: bool) -> None:
    assert bool(OUTSIDE_DOCS.search(text)) is flagged
