"""Model profiles: files, resolution, model construction, shared HTTP clients."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from shared.agent.spec import ModelProfile
from shared.errors import ConfigError
from shared.llm.openai_compat import OpenAICompatModel
from shared.llm.profiles import (
    DEMO_PROFILE,
    close_http_clients,
    http_client,
    load_profiles,
    make_model,
    resolve_profile,
)
from shared.llm.scripted import DemoModel, ScriptedModel

TOML = """
[profiles.gpt]
base_url = "https://api.openai.com/v1"
model = "gpt-4o"
api_key_env = "OPENAI_API_KEY"
tool_mode = "native"
pricing = { tiers = [{ max_input_tokens = 128000, input = 2.5, output = 10.0 }] }

[profiles.local]
base_url = "http://127.0.0.1:11434/v1"
model = "qwen3"
tool_mode = "auto"
own_key = true
extra = { temperature = 0.1 }
"""

YAML = """
profiles:
  script:
    provider: scripted
    replies:
      - text: hello
  deep:
    base_url: https://api.deepseek.com/v1
    model: deepseek-reasoner
    max_continuations: 1
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_load_toml(tmp_path: Path) -> None:
    profiles = load_profiles(_write(tmp_path, "models.toml", TOML))
    assert set(profiles) == {"gpt", "local"}
    gpt = profiles["gpt"]
    assert gpt.name == "gpt" and gpt.model == "gpt-4o" and gpt.api_key_env == "OPENAI_API_KEY"
    assert gpt.pricing.tiers[0].input == 2.5
    assert profiles["local"].extra == {"temperature": 0.1} and profiles["local"].own_key


@pytest.mark.parametrize("suffix", [".yaml", ".yml"])
def test_load_yaml(tmp_path: Path, suffix: str) -> None:
    profiles = load_profiles(_write(tmp_path, "models" + suffix, YAML))
    assert profiles["script"].provider == "scripted" and profiles["deep"].max_continuations == 1


def test_load_json(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "m.json", '{"profiles": {"j": {"base_url": "http://x/v1", "model": "y"}}}'
    )
    assert load_profiles(path)["j"].model == "y"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[profiles.bad]\nbase_url = 'x'\nunknown_field = 1\n", "profile 'bad' is invalid"),
        ("[other]\nx = 1\n", "profiles"),
        ("profiles = 3\n", "profiles"),
        ("[profiles]\nbad = 3\n", "must be a table"),
        ("[profiles.x\n", "not valid"),
    ],
)
def test_bad_files_raise_config_error(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_profiles(_write(tmp_path, "m.toml", text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_profiles(tmp_path / "nope.toml")


def test_resolve() -> None:
    known = {"gpt": ModelProfile(name="gpt", base_url="http://x/v1")}
    assert resolve_profile("gpt", known) is known["gpt"]
    assert resolve_profile("demo", known) == DEMO_PROFILE
    assert resolve_profile("demo", {}).provider == "demo"
    inline = ModelProfile(base_url="http://inline/v1", model="m")
    assert resolve_profile(inline, known) is inline


def test_unknown_profile_lists_the_known_names() -> None:
    with pytest.raises(ConfigError, match="unknown model profile 'gtp'.*demo, gpt, local"):
        resolve_profile("gtp", {"gpt": ModelProfile(name="gpt"), "local": ModelProfile()})


def test_make_model() -> None:
    assert isinstance(make_model(DEMO_PROFILE), DemoModel)
    scripted = make_model(ModelProfile(name="s", provider="scripted", replies=[{"text": "hi"}]))
    assert isinstance(scripted, ScriptedModel)
    remote = make_model(ModelProfile(name="r", base_url="http://host.test/v1", model="m"))
    assert isinstance(remote, OpenAICompatModel) and remote.profile.name == "r"


def test_make_model_rejects_incomplete_profiles() -> None:
    with pytest.raises(ConfigError, match="no replies"):
        make_model(ModelProfile(name="s", provider="scripted"))
    with pytest.raises(ConfigError, match="no base_url"):
        make_model(ModelProfile(name="r"))


def test_http_clients_are_shared_per_base_url() -> None:
    close_http_clients()
    try:
        a = make_model(ModelProfile(name="a", base_url="http://one.test/v1", model="m"))
        b = make_model(ModelProfile(name="b", base_url="http://one.test/v1/", model="n"))
        c = make_model(ModelProfile(name="c", base_url="http://two.test/v1", model="m"))
        assert isinstance(a, OpenAICompatModel) and isinstance(b, OpenAICompatModel)
        assert isinstance(c, OpenAICompatModel)
        assert a._client is b._client and a._client is not c._client
    finally:
        close_http_clients()


def test_http_client_cache_is_thread_safe() -> None:
    close_http_clients()
    seen = []
    threads = [
        threading.Thread(target=lambda: seen.append(http_client("http://race.test/v1")))
        for _ in range(32)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(c) for c in seen}) == 1
    close_http_clients()
    assert seen[0].is_closed and http_client("http://race.test/v1") is not seen[0]
    close_http_clients()
