"""Local routing before the model (SPEC N-1)."""

from __future__ import annotations

from shared.agent.router import normalize_for_match, route, rule_matches
from shared.agent.spec import RouterRule

RESOLVE = RouterRule(any=["冲突"], all=["处理"], handler="resolve_conflicts")
RESOLVE_ANY = RouterRule(any=["处理冲突", "解决冲突", "停用冲突"], handler="resolve_conflicts")
SCAN = RouterRule(any=["冲突", "conflict"], handler="scan_conflicts")
SEARCH = RouterRule(any=["search", "搜索"], pass_to_model=True)
RULES = [RESOLVE, SCAN, SEARCH]

# SPEC N-1: ordered rules, first match wins, any/all, case-insensitive, CJK-safe


def test_specific_rule_before_general_one() -> None:
    # SPEC N-1: the specific "处理冲突" goes before the general "冲突"
    assert route("帮我处理一下模组冲突", RULES) is RESOLVE
    assert route("检查模组冲突", RULES) is SCAN


def test_first_match_wins_so_order_matters() -> None:
    general_first = [SCAN, RESOLVE]
    assert route("帮我处理一下模组冲突", general_first) is SCAN


def test_cjk_substring_without_spaces() -> None:
    assert route("我的整合包有冲突吗", [SCAN]) is SCAN
    assert route("处理冲突", [RESOLVE_ANY]) is RESOLVE_ANY


def test_case_insensitive() -> None:
    assert route("Check for CONFLICTS please", RULES) is SCAN
    assert route("ＳＥＡＲＣＨ for sodium", RULES) is SEARCH  # full-width letters too
    assert normalize_for_match("Straße") == "strasse"


def test_all_needs_every_keyword() -> None:
    rule = RouterRule(all=["fix", "conflict"], handler="h")
    assert rule_matches("please fix this conflict", rule)
    assert not rule_matches("please fix this", rule)


def test_any_and_all_together() -> None:
    rule = RouterRule(any=["conflict", "冲突"], all=["fix"], handler="h")
    assert rule_matches("fix the 冲突", rule)
    assert not rule_matches("the 冲突", rule)
    assert not rule_matches("fix it", rule)


def test_no_match_goes_to_the_model() -> None:
    assert route("what time is it", RULES) is None
    assert route("anything", []) is None


def test_pass_to_model_rule_is_returned() -> None:
    rule = route("搜索 sodium 模组", RULES)
    assert rule is SEARCH and rule.pass_to_model


def test_empty_keywords_never_match_everything() -> None:
    rule = RouterRule(any=["", "  "], handler="h")
    assert not rule_matches("any text", rule)
    assert route("any text", [rule, SCAN]) is None
