"""The knowledge base's pure text logic: chunking with overlap, sources, queries,
rank fusion, the relevance filter's answer."""

from __future__ import annotations

from shared.agent.knowledge import (
    chunk_document,
    chunk_text,
    format_passages,
    fts5_query,
    parse_query,
    parse_selection,
    passage_quotes,
    reciprocal_rank_fusion,
    search_text,
    websearch_query,
)

SENTENCES = " ".join(f"Sentence {i} tells fact number {i} about the product." for i in range(80))


def test_chunks_are_about_800_chars_with_overlap() -> None:
    chunks = chunk_text(SENTENCES)
    assert len(chunks) > 3
    assert all(len(c) <= 800 + 150 for c in chunks)
    assert all(len(c) >= 400 for c in chunks[:-1])
    for before, after in zip(chunks, chunks[1:], strict=False):
        head = after[:60]
        assert head in before, "each chunk starts with the end of the one before"
        assert 50 <= len(before) - before.rfind(head) <= 150  # ~150 characters repeated
    assert chunks[0].startswith("Sentence 0 ") and "Sentence 79" in chunks[-1]


def test_paragraphs_are_kept_whole_when_they_fit() -> None:
    text = "First paragraph about refunds.\n\nSecond paragraph about shipping.\n\n\nThird."
    assert chunk_text(text) == [
        "First paragraph about refunds.\n\nSecond paragraph about shipping.\n\nThird."
    ]


def test_a_giant_word_run_is_cut_hard() -> None:
    chunks = chunk_text("x" * 2000, size=800, overlap=100)
    assert "".join(c for c in chunks).count("x") >= 2000
    assert all(len(c) <= 800 + 1 + 100 for c in chunks)  # a piece, a space, the overlap


def test_sources_name_pdf_pages_and_markdown_headings() -> None:
    pdf = "--- page 1 ---\nIntro text.\n\n--- page 2 ---\nRefunds take 30 days."
    assert [(c.source, c.text) for c in chunk_document(pdf, "policy.pdf")] == [
        ("policy.pdf, p. 1", "Intro text."),
        ("policy.pdf, p. 2", "Refunds take 30 days."),
    ]
    md = "# Handbook\n\nWelcome.\n\n## Refunds\n\n" + SENTENCES
    sources = [c.source for c in chunk_document(md, "hb.md", markdown=True)]
    assert sources[0] == "hb.md › Handbook" and sources[-1] == "hb.md › Refunds"
    assert {c.source for c in chunk_document("plain text", "a.txt")} == {"a.txt"}


def test_cjk_text_is_indexed_per_character() -> None:
    assert search_text("退款政策 refund") == "退 款 政 策 refund"
    q = parse_query("退款政策")
    assert q.phrases[0] == ["退", "款", "政", "策"] and ["政", "策"] in q.phrases


def test_queries_or_their_terms_and_drop_stop_words() -> None:
    q = parse_query('How do I get a "refund policy" -shipping')
    assert q.words == ["get"] and q.phrases == [["refund", "policy"]]
    assert q.excluded == ["shipping"]
    assert fts5_query(q) == '("get" OR "refund policy") NOT ("shipping")'
    assert websearch_query(q) == ('get or "refund policy"', "shipping")
    assert parse_query("the").words == ["the"]  # only stop words: keep them
    assert fts5_query(parse_query("   ")) is None
    assert fts5_query(parse_query('say "hi')) == '"say" OR "hi"'


def test_reciprocal_rank_fusion_rewards_agreement() -> None:
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 1, 4]])
    assert [i for i, _ in fused][:2] == [1, 3]
    assert fused[0][1] == 1 / 61 + 1 / 62


def test_filter_answer_parsing() -> None:
    assert parse_selection("[2, 1]", 3) == [1, 0]
    assert parse_selection("Relevant: [3, 3, 9, 'x']", 3) == [2]
    assert parse_selection("[]", 3) == []
    assert parse_selection("none of them", 3) is None


def test_passages_for_the_model_and_as_quotes() -> None:
    hits = [{"text": "Refunds take 30 days.", "source": "policy.pdf, p. 2", "document": "p"}]
    assert format_passages(hits) == "[1] Source: policy.pdf, p. 2\nRefunds take 30 days."
    assert format_passages([]) == "No matching passages."
    assert passage_quotes(hits) == [
        {"q": "Refunds take 30 days.", "a": "", "source": "policy.pdf, p. 2"}
    ]
