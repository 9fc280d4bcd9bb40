"""Local routing before the model (SPEC N-1).

Rules are tried in order and the first match wins, so specific rules go first
("处理冲突" before the general "冲突"). ``any`` needs at least one of its keywords in the text,
``all`` needs every one; a rule with both needs both. Matching is case-insensitive
(casefold after NFKC, so full-width letters match too) substring matching, which works for
CJK text that has no spaces between words.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from shared.agent.spec import RouterRule

__all__ = ["normalize_for_match", "route", "rule_matches"]


def normalize_for_match(text: str) -> str:
    """NFKC, then casefold: ``"ＦＩＸ"`` and ``"Fix"`` both become ``"fix"``."""
    return unicodedata.normalize("NFKC", text).casefold()


def _keywords(words: Sequence[str]) -> list[str]:
    return [k for k in (normalize_for_match(w).strip() for w in words) if k]


def rule_matches(text: str, rule: RouterRule) -> bool:
    """Whether one rule matches ``text`` (empty keywords are ignored; a rule left with no
    keyword at all never matches)."""
    haystack = normalize_for_match(text)
    any_words = _keywords(rule.any)
    all_words = _keywords(rule.all)
    if not any_words and not all_words:
        return False
    if any_words and not any(w in haystack for w in any_words):
        return False
    return all(w in haystack for w in all_words)


def route(text: str, rules: Sequence[RouterRule]) -> RouterRule | None:
    """SPEC N-1: the first rule that matches ``text``, or ``None`` (go to the model)."""
    return next((rule for rule in rules if rule_matches(text, rule)), None)
