"""Helper kinds: classify, extract, expand_query (SPEC H-1, H-2, H-3)."""

from __future__ import annotations

import json

import pytest

from shared.agent.arguments import validate_against_schema
from shared.agent.helpers import (
    classify_messages,
    classify_result,
    expand_query_messages,
    extract_messages,
    extract_response_format,
    extract_schema,
    lexical_similarity,
    match_category,
    parse_extract,
    parse_queries,
    select_diverse,
)
from shared.agent.messages import Message
from shared.agent.spec import Category, ExtractField

CATEGORIES = [
    Category(key="weather", description="questions about the weather"),
    Category(key="weather_alert", description="storm and flood warnings"),
    Category(key="billing", description="invoices and payments"),
    Category(key="other", description="anything else"),
]

# --- SPEC H-1 classify ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "key"),
    [
        ("weather", "weather"),
        ("  Billing. ", "billing"),
        ('"weather_alert"', "weather_alert"),
        ("`other`", "other"),
        ('{"category": "billing", "reason": "mentions an invoice"}', "billing"),
    ],
)
def test_exact_match(reply: str, key: str) -> None:
    assert match_category(reply, CATEGORIES) == key


def test_key_substring_prefers_the_longest_key() -> None:
    assert match_category("I think it is weather_alert here", CATEGORIES) == "weather_alert"
    assert match_category("The category: billing", CATEGORIES) == "billing"


def test_description_substring() -> None:
    assert match_category("This is about invoices and payments.", CATEGORIES) == "billing"


def test_no_match_falls_back_to_the_last_category() -> None:
    # SPEC H-1: the LAST category, not the first
    assert match_category("no idea", CATEGORIES) == "other"
    assert match_category("", CATEGORIES) == "other"
    two = [Category(key="a1", description=""), Category(key="b2", description="")]
    assert match_category("something", two) == "b2"


def test_cjk_category() -> None:
    cats = [Category(key="冲突", description="模组冲突"), Category(key="其他", description="")]
    assert match_category("这个属于冲突类", cats) == "冲突"


def test_classify_result() -> None:
    assert classify_result("billing", CATEGORIES) == {"category": "billing"}
    assert classify_result('{"category": "billing", "reason": "invoice"}', CATEGORIES) == {
        "category": "billing",
        "reason": "invoice",
    }


def test_classify_messages() -> None:
    history = [Message(role="user", content="earlier"), Message(role="assistant", content="ok")]
    msgs = classify_messages(
        "Will it rain?",
        CATEGORIES,
        background="A help desk.",
        last_result="billing",
        history=history,
    )
    assert [m.role for m in msgs] == ["system", "user", "assistant", "user"]
    system = msgs[0].text
    assert '"key": "weather_alert"' in system
    assert "A help desk." in system
    assert "billing" in system.split("## Previous result")[1]
    assert "key of the category only" in system
    assert msgs[-1].text == "Will it rain?"


# --- SPEC H-2 extract -------------------------------------------------------------------

FIELDS = [
    ExtractField(name="city", type="string", required=True, default="Paris"),
    ExtractField(name="days", type="integer", required=True),
    ExtractField(name="budget", type="number"),
    ExtractField(name="pets", type="boolean"),
    ExtractField(name="mode", type="string", enum=["train", "plane"]),
]


def test_schema_and_response_format() -> None:
    schema = extract_schema(FIELDS)
    assert schema["required"] == ["city", "days"]
    assert schema["properties"]["mode"] == {"type": "string", "enum": ["train", "plane"]}
    assert schema["properties"]["days"] == {"type": "integer"}
    rf = extract_response_format(FIELDS)
    assert rf["type"] == "json_schema"
    assert rf["json_schema"]["schema"] == schema
    assert validate_against_schema({"city": "Rome", "days": 3}, schema) is None


def test_extract_messages() -> None:
    msgs = extract_messages("Three days in Rome.", FIELDS, last_result={"city": "Oslo"})
    assert [m.role for m in msgs] == ["system", "user"]
    assert json.dumps(extract_schema(FIELDS), ensure_ascii=False, indent=2) in msgs[0].text
    assert "Required keys: city, days." in msgs[0].text
    assert '"Oslo"' in msgs[0].text
    assert "Three days in Rome." in msgs[1].text


def test_parse_clean_json() -> None:
    fields, ok = parse_extract('{"city": "Rome", "days": 3, "pets": true}', FIELDS)
    assert fields == {"city": "Rome", "days": 3, "pets": True}
    assert ok


def test_parse_tolerant_json5_in_prose() -> None:
    reply = "Sure:\n```json\n{city: 'Rome', days: 3, budget: 1200.5,}\n```"
    fields, ok = parse_extract(reply, FIELDS)
    assert fields == {"city": "Rome", "days": 3, "budget": 1200.5}
    assert ok


def test_unknown_keys_and_empty_strings_are_dropped() -> None:
    fields, ok = parse_extract('{"city": "Rome", "days": 2, "hotel": "x", "mode": "  "}', FIELDS)
    assert fields == {"city": "Rome", "days": 2}
    assert ok


def test_missing_required_filled_with_default() -> None:
    fields, ok = parse_extract('{"days": 4}', FIELDS)
    assert fields == {"city": "Paris", "days": 4}
    assert ok


def test_missing_required_without_default_is_not_success() -> None:
    fields, ok = parse_extract('{"city": "Rome"}', FIELDS)
    assert fields == {"city": "Rome"}
    assert not ok


@pytest.mark.parametrize("reply", ["", "no json here", "{broken", "[1, 2]", "{'a': }", "null"])
def test_garbage_gives_empty_and_never_raises(reply: str) -> None:
    fields, ok = parse_extract(reply, FIELDS)
    assert fields == {"city": "Paris"}  # only the default of a required field
    assert not ok
    bare = [ExtractField(name="x", required=True)]
    assert parse_extract(reply, bare) == ({}, False)


def test_simple_type_slips_are_coerced() -> None:
    fields, _ = parse_extract('{"city": 7, "days": "3", "budget": "1,200", "pets": "no"}', FIELDS)
    assert fields == {"city": "7", "days": 3, "budget": 1200.0, "pets": False}


def test_null_is_no_value() -> None:
    fields, ok = parse_extract('{"city": null, "days": null}', FIELDS)
    assert fields == {"city": "Paris"}
    assert not ok


# --- SPEC H-3 expand_query --------------------------------------------------------------


def test_expand_query_messages() -> None:
    history = [
        Message(role="user", content="What is FastGPT?"),
        Message(role="assistant", content="A platform."),
        Message(role="tool", content="ignored", tool_call_id="c"),
    ]
    msgs = expand_query_messages("Is it free?", count=7, history=history)
    assert [m.role for m in msgs] == ["system", "user"]
    assert "JSON array" in msgs[0].text
    user = msgs[1].text
    assert "user: What is FastGPT?\nassistant: A platform." in user
    assert "ignored" not in user
    assert "Question: Is it free?" in user
    assert "up to 7 queries" in user


def test_parse_queries_output_is_original_plus_kept() -> None:
    reply = json.dumps(
        ["FastGPT pricing", "Is FastGPT free", "FastGPT license", "self-hosted cost", "price"]
    )
    out = parse_queries(reply, "Is it free?", count=10, keep=3)
    assert out[0] == "Is it free?"
    assert len(out) == 4
    assert len(set(out)) == 4
    assert all(q in json.loads(reply) for q in out[1:])


def test_parse_queries_tolerant() -> None:
    reply = "Here you go:\n```json\n['a query', \"b query\",]\n```"
    assert parse_queries(reply, "orig", 10, 5) == ["orig", "a query", "b query"]


@pytest.mark.parametrize("reply", ["", "no array", "[broken", '{"a": 1}', "[]", "[1, 2]"])
def test_parse_failure_gives_just_the_original(reply: str) -> None:
    assert parse_queries(reply, "orig", 10, 3) == ["orig"]


def test_dedup_on_letters_and_digits() -> None:
    reply = json.dumps(["Orig!", "orig", "other one", "Other-One", "  "])
    assert parse_queries(reply, "orig", 10, 5) == ["orig", "other one"]


def test_count_limits_the_candidates() -> None:
    reply = json.dumps([f"query number {i}" for i in range(20)])
    out = parse_queries(reply, "orig", count=2, keep=5)
    assert out == ["orig", "query number 0", "query number 1"]


def test_selection_prefers_diverse_queries() -> None:
    original = "how to fix mod conflicts"
    candidates = [
        "how to fix mod conflict",
        "how to fix a mod conflicts",
        "minecraft crash incompatible mods",
        "resolve duplicate mod loader error",
    ]
    kept = select_diverse(original, candidates, 2)
    assert set(kept) == {candidates[2], candidates[3]}
    assert select_diverse(original, candidates, 2) == kept  # deterministic
    assert select_diverse(original, candidates, 0) == []
    assert sorted(select_diverse(original, candidates, 10)) == sorted(candidates)


def test_lexical_similarity() -> None:
    assert lexical_similarity("abc", "abc") == 1.0
    assert lexical_similarity("abc", "xyz") == 0.0
    assert 0 < lexical_similarity("模组冲突", "模组崩溃") < 1
