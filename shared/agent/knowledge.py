"""Knowledge-base text logic (pure): chunking documents, the search text and queries of the
full-text index, rank fusion, passages as tool results and as chat quotes (SPEC C-2), and the
LLM relevance filter's prompt (after retrieval, a model may keep only the relevant chunks).

Search is keyword search with ranked OR semantics: every query term may match, passages that
match more (and rarer) terms rank first. CJK text has no spaces, so each CJK character is a
token of the index (``search_text``) and a CJK run in a query becomes a phrase of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.agent.arguments import loads_tolerant
from shared.agent.messages import Message

__all__ = [
    "CHUNK_CHARS",
    "OVERLAP_CHARS",
    "Chunk",
    "Query",
    "chunk_document",
    "chunk_text",
    "cosine",
    "filter_messages",
    "format_passages",
    "fts5_query",
    "parse_query",
    "parse_selection",
    "passage_quotes",
    "reciprocal_rank_fusion",
    "search_text",
    "websearch_query",
]

CHUNK_CHARS = 800
OVERLAP_CHARS = 150
RRF_K = 60

_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK_CHAR = re.compile(f"([{_CJK}])")
_CJK_RUN = re.compile(f"[{_CJK}]+")
_PARAGRAPHS = re.compile(r"\n[ \t]*\n+")
_SENTENCE_END = re.compile(r"(?<=[.!?;。！？；])\s+|(?<=[。！？；])")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_PAGE_MARK = re.compile(r"^--- page (\d+) ---$", re.MULTILINE)
_WORD = re.compile(r"\w+", re.UNICODE)
_STOPWORDS = frozenset(
    {
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "that",
        "the",
        "this",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "with",
        "you",
        "your",
    }
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One passage of a document: its text and where it comes from (name, page, heading)."""

    text: str
    source: str


# --- chunking ---------------------------------------------------------------------------


def chunk_text(text: str, size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[str]:
    """Paragraphs (then sentences, then words) packed into chunks of about ``size``
    characters; each chunk after the first starts with the last ~``overlap`` characters of
    the one before, cut at a sentence or word boundary."""
    units = list(_units(text, size))
    chunks: list[str] = []
    current: list[tuple[int, str]] = []
    length = 0
    for para, unit in units:
        if current and length + len(unit) + 1 > size:
            chunks.append(_join(current))
            tail = _tail(chunks[-1], overlap)
            current = [(-1, tail)] if tail else []
            length = len(tail)
        current.append((para, unit))
        length += len(unit) + 1
    if current and any(p >= 0 for p, _ in current):
        chunks.append(_join(current))
    return chunks


def _units(text: str, size: int) -> Iterable[tuple[int, str]]:
    """(paragraph number, piece): paragraphs that fit, else their sentences, else words."""
    paragraphs = [p.strip() for p in _PARAGRAPHS.split(text.replace("\r\n", "\n"))]
    for n, para in enumerate(p for p in paragraphs if p):
        if len(para) <= size:
            yield n, para
            continue
        for sentence in (s.strip() for s in _SENTENCE_END.split(para)):
            if not sentence:
                continue
            if len(sentence) <= size:
                yield n, sentence
            else:
                yield from ((n, piece) for piece in _hard_split(sentence, size))


def _hard_split(text: str, size: int) -> list[str]:
    """A sentence longer than a chunk: cut at the last space before ``size`` (or at size)."""
    out = []
    while len(text) > size:
        cut = text.rfind(" ", size // 2, size)
        cut = cut if cut > 0 else size
        out.append(text[:cut].strip())
        text = text[cut:].strip()
    if text:
        out.append(text)
    return out


def _join(units: Sequence[tuple[int, str]]) -> str:
    """Pieces of one paragraph joined by a space, paragraphs by a blank line."""
    out = ""
    prev: int | None = None
    for para, unit in units:
        if out:
            out += " " if para == prev or prev == -1 else "\n\n"
        out += unit
        prev = para
    return out


def _tail(chunk: str, overlap: int) -> str:
    """The end of ``chunk`` to repeat at the start of the next, from a sentence start if one
    is near, else from a word start."""
    if overlap <= 0 or not chunk:
        return ""
    start = max(0, len(chunk) - overlap)
    window = chunk[start:]
    sentence = _SENTENCE_END.search(window)
    if sentence is not None and sentence.end() < len(window) - 20:
        return window[sentence.end() :].strip()
    space = window.find(" ")
    if start > 0 and 0 <= space < len(window) - 20:
        return window[space:].strip()
    return window.strip()


def chunk_document(
    text: str,
    name: str,
    *,
    markdown: bool = False,
    size: int = CHUNK_CHARS,
    overlap: int = OVERLAP_CHARS,
) -> list[Chunk]:
    """A document's chunks with sources: ``name, p. N`` for the pages of an extracted PDF
    (``--- page N ---`` markers; chunks never span pages), ``name › heading`` for markdown
    under a heading, else ``name``."""
    pages = _pages(text)
    if pages:
        return [
            Chunk(c, f"{name}, p. {n}")
            for n, page in pages
            for c in chunk_text(page, size, overlap)
        ]
    chunks = chunk_text(text, size, overlap)
    if not markdown:
        return [Chunk(c, name) for c in chunks]
    return [Chunk(c, _with_heading(name, _heading_before(text, c))) for c in chunks]


def _pages(text: str) -> list[tuple[int, str]]:
    marks = list(_PAGE_MARK.finditer(text))
    if not marks:
        return []
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return [
        (int(m.group(1)), text[m.end() : end].strip())
        for m, end in zip(marks, ends, strict=True)
        if text[m.end() : end].strip()
    ]


def _heading_before(text: str, chunk: str) -> str | None:
    """The markdown heading in effect where ``chunk`` starts (its first line found in text)."""
    head = chunk.split("\n", 1)[0][:80]
    at = text.find(head)
    if at < 0:
        return None
    found = None
    for m in _HEADING.finditer(text, 0, at + len(head)):
        found = m.group(1)
    return found


def _with_heading(name: str, heading: str | None) -> str:
    return f"{name} › {heading}" if heading else name


# --- the index and queries ----------------------------------------------------------------


def search_text(text: str) -> str:
    """The text the full-text index sees: each CJK character a token of its own."""
    return re.sub(r"[ \t]+", " ", _CJK_CHAR.sub(r" \1 ", text)).strip()


@dataclass(frozen=True)
class Query:
    """A parsed search query: words, phrases (quoted, or CJK runs) and excluded words."""

    words: list[str] = field(default_factory=list)
    phrases: list[list[str]] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.words and not self.phrases


def parse_query(q: str) -> Query:
    """``refund "return window" -shipping 退款政策`` → words, phrases, exclusions. English
    stop words are dropped (unless that leaves nothing); a CJK run is a phrase of its
    characters, plus its two-character pieces (partial matches still rank)."""
    words: list[str] = []
    phrases: list[list[str]] = []
    excluded: list[str] = []
    for m in re.finditer(r'(-?)"([^"]*)"|(-?)(\S+)', q):
        if m.group(2) is not None:
            tokens = _tokens(m.group(2))
            if m.group(1):
                excluded += tokens
            elif len(tokens) > 1:
                phrases.append(tokens)
            else:
                words += tokens
        elif m.group(3):
            excluded += _tokens(m.group(4))
        else:
            _add_term(m.group(4), words, phrases)
    kept = [w for w in words if w.lower() not in _STOPWORDS] or words
    return Query(_unique(kept), phrases, _unique(excluded))


def _add_term(term: str, words: list[str], phrases: list[list[str]]) -> None:
    for piece in _WORD.findall(term):
        for part in re.split(f"([{_CJK}]+)", piece):
            if not part:
                continue
            if _CJK_RUN.fullmatch(part):
                chars = list(part)
                if len(chars) == 1:
                    words.append(part)
                    continue
                phrases.append(chars)
                phrases.extend(
                    [chars[i], chars[i + 1]] for i in range(len(chars) - 1) if len(chars) > 2
                )
            else:
                words.append(part)


def _tokens(text: str) -> list[str]:
    return _WORD.findall(search_text(text))


def _unique(items: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for item in items:
        seen.setdefault(item.lower(), None)
    return list(seen)


def _fts5_term(tokens: Sequence[str]) -> str:
    return '"' + " ".join(t.replace('"', '""') for t in tokens) + '"'


def fts5_query(query: Query) -> str | None:
    """The SQLite FTS5 MATCH expression: terms and phrases OR-ed, exclusions NOT-ed."""
    if query.empty:
        return None
    terms = [_fts5_term([w]) for w in query.words] + [_fts5_term(p) for p in query.phrases]
    expr = " OR ".join(terms)
    if query.excluded:
        expr = f"({expr}) NOT ({' OR '.join(_fts5_term([x]) for x in query.excluded)})"
    return expr


def websearch_query(query: Query) -> tuple[str, str] | None:
    """PostgreSQL ``websearch_to_tsquery`` inputs: (terms OR-ed, excluded words OR-ed)."""
    if query.empty:
        return None
    terms = query.words + ['"' + " ".join(p) + '"' for p in query.phrases]
    return " or ".join(terms), " or ".join(query.excluded)


def reciprocal_rank_fusion(
    rankings: Sequence[Sequence[int]], k: int = RRF_K
) -> list[tuple[int, float]]:
    """Hybrid ranking: each id scores Σ 1/(k + rank) over the rankings it appears in."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


# --- passages for the model -----------------------------------------------------------------


def format_passages(hits: Sequence[Mapping[str, Any]]) -> str:
    """What ``knowledge_search`` returns to the model: numbered passages with their source."""
    if not hits:
        return "No matching passages."
    return "\n\n".join(
        f"[{i}] Source: {h.get('source') or h.get('document') or '?'}\n{h['text']}"
        for i, h in enumerate(hits, start=1)
    )


def passage_quotes(hits: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Passages as chat quotes (SPEC C-2): the passage as ``q``, its source as ``source``."""
    return [
        {"q": h["text"], "a": "", "source": h.get("source") or h.get("document") or ""}
        for h in hits
    ]


_FILTER_PROMPT = (
    "You select the passages that help answer a question. Reply with a JSON array of the "
    "numbers of the relevant passages, most relevant first, e.g. [2, 1]. Reply [] when none "
    "is relevant. Reply with the array only."
)


def filter_messages(question: str, hits: Sequence[Mapping[str, Any]]) -> list[Message]:
    """The relevance filter's request: the question and the numbered passages."""
    body = f"Question: {question}\n\nPassages:\n\n{format_passages(hits)}"
    return [Message(role="system", content=_FILTER_PROMPT), Message(role="user", content=body)]


def parse_selection(text: str, n: int) -> list[int] | None:
    """The filter's answer as 0-based passage indexes (1-based in the reply), in its order;
    None when it cannot be read (the caller keeps every passage)."""
    try:
        value = loads_tolerant(text.strip(), "[")
    except ValueError:
        return None
    if not isinstance(value, list):
        return None
    out: list[int] = []
    for item in value:
        try:
            idx = int(item) - 1
        except (TypeError, ValueError):
            continue
        if 0 <= idx < n and idx not in out:
            out.append(idx)
    return out
