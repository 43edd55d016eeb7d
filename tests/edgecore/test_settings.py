"""Config loading: the shipped examples parse; mistakes name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentConfig, load_agent_config
from agent.isolation import NICE_ENV
from edgecore.compiled_cache import ENV
from edgecore.errors import ConfigError
from edgecore.settings import load_settings
from edgectl.config import EdgectlConfig, load_edgectl_config

REPO = Path(__file__).resolve().parents[2]


def test_shipped_configs_parse() -> None:
    agent = load_settings(AgentConfig, REPO / "configs/agent.yaml", "NOPE_", environ={})
    assert agent.inference.port == 8080 and agent.deploy.health_runs == 20
    host = load_settings(EdgectlConfig, REPO / "configs/edgectl.yaml", "NOPE_", environ={})
    assert host.deploy.chunk_size == 65536


@pytest.mark.parametrize("text, expected", [
    ("device_id: a\ninference: {port: eighty}\n", "inference.port must be int"),
    ("device_id: a\nbogus: 1\n", "unknown key bogus"),
    ("device_id: [a\n", "invalid YAML at line"),
    ("- a\n- b\n", "top level must be a mapping"),
    ("broker: mqtt://127.0.0.1:1\n", "missing required key device_id"),
])
def test_errors_name_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_settings(AgentConfig, path, "NOPE_", environ={})
    assert str(path) in str(info.value)


def test_environment_and_overrides_beat_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("device_id: a\ninference: {port: 1}\n")
    cfg = load_settings(AgentConfig, path, "EA_", {"deploy.health_runs": "7"}, environ={"EA_INFERENCE__PORT": "2"})
    assert (cfg.inference.port, cfg.deploy.health_runs) == (2, 7)


def test_plaintext_to_a_remote_broker_needs_insecure(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    key.write_text("x")
    with pytest.raises(ConfigError, match="plaintext"):
        load_agent_config(None, {"device_id": "a", "broker": "mqtt://10.0.0.5:1883", "trust.packages": str(key)})
    cfg = load_agent_config(None, {"device_id": "a", "broker": "mqtt://10.0.0.5:1883", "insecure": "true",
                                   "trust.packages": str(key)})
    assert cfg.insecure


def test_agent_needs_a_trusted_package_key() -> None:
    with pytest.raises(ConfigError, match=r"trust\.packages is empty"):
        load_agent_config(None, {"device_id": "a"})


def test_what_the_agent_passes_its_children_in_the_environment_is_not_read_as_configuration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled-model cache and the child's nice level travel in the environment; under the EDGE_AGENT_ prefix
    they were read back as configuration keys and every agent started after them exited 2 ("unknown key")."""
    key = tmp_path / "k.pem"
    key.write_text("x")
    for name in (ENV, NICE_ENV):
        monkeypatch.setenv(name, str(tmp_path))
    cfg = load_agent_config(None, {"device_id": "a", "broker": "mqtt://127.0.0.1:1883", "trust.packages": str(key)})
    assert cfg.device_id == "a"


def test_edgectl_variables_that_select_files_are_not_read_as_configuration(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EDGECTL_PKI and EDGECTL_TARGETS_PATH are documented for the CLI; read as keys they failed every command."""
    for name in ("EDGECTL_CONFIG", "EDGECTL_BROKER", "EDGECTL_HOME", "EDGECTL_PKI", "EDGECTL_TARGETS_PATH"):
        monkeypatch.setenv(name, str(tmp_path))
    file = tmp_path / "edgectl.yaml"
    file.write_text("deploy:\n  timeout_s: 5\n")
    monkeypatch.setenv("EDGECTL_DEPLOY__TIMEOUT_S", "12")
    assert load_edgectl_config(file).deploy.timeout_s == 12
    monkeypatch.setenv("EDGECTL_PKY", "x")  # a misspelt key is still an error
    with pytest.raises(ConfigError, match="unknown key pky"):
        load_edgectl_config(file)
