"""``--artifact-url`` from the operator to the signed desired states: direct deploy, and a rollout through the controller."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edgecore.errors import UserError
from edgecore.protocol.envelope import DESIRED_TYPE, TrustedKeys
from edgecore.protocol.messages import DesiredState, verify_signed
from edgectl.artifacts import RangeServer
from edgectl.artifacts.urls import check_artifact_urls, urls_for
from edgectl.controller import RolloutOptions, plan_rollout, submit_rollout
from edgectl.examples import tiny_classifier
from edgectl.fleet import FleetRequest, rollout_options
from edgectl.package import BuildOptions, Package, build_package, read_package
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import serves
from tests.fleet import AgentProcess, EdgectlHome
from tests.http.conftest import DEPLOY
from tests.unit.test_controller_dispatch import RunningController, next_desired, running  # noqa: F401

SHA = "ab" * 32


@pytest.mark.parametrize(("urls", "packages", "problem"), [
    (["ftp://host/x"], 1, "expected an http:// or https:// URL"),
    (["http:///no-host"], 1, "expected an http:// or https:// URL"),
    (["https://cdn/a b"], 1, "no spaces"),
    (["https://cdn/payload"], 2, "each URL needs {artifact_id}"),
    ([f"https://cdn/{i}" for i in range(17)], 1, "at most 16"),
])
def test_bad_artifact_urls_are_refused_naming_the_flag(urls: list[str], packages: int, problem: str) -> None:
    with pytest.raises(UserError, match="--artifact-url") as caught:
        check_artifact_urls(urls, packages)
    assert problem in str(caught.value)


def test_templates_are_filled_per_artifact() -> None:
    urls = check_artifact_urls(["https://cdn.example/m/{artifact_id}", "http://origin:8090/{artifact_id}?x=1"], 2)
    assert urls_for(urls, SHA) == (f"https://cdn.example/m/{SHA}", f"http://origin:8090/{SHA}?x=1")
    assert urls_for(["https://s3/presigned?sig=1"], SHA) == ("https://s3/presigned?sig=1",)
    request = FleetRequest([Path("a.edgepkg"), Path("b.edgepkg")], "all", artifact_urls=["https://cdn/x"])
    with pytest.raises(UserError, match="needs \\{artifact_id\\}"):
        rollout_options(request, 60.0)


def test_controller_puts_the_urls_into_each_desired_state(running: RunningController, tmp_path: Path) -> None:  # noqa: F811
    device = running.device("dev-1")
    onnx = tiny_classifier(tmp_path / "m.onnx", size=8)
    build_package(onnx, BuildOptions("m", 1, golden_samples=0), running.package_key, tmp_path / "m.edgepkg")
    (tmp_path / "unpacked").mkdir()
    package = read_package(tmp_path / "m.edgepkg", TrustedKeys([running.package_key.public_key()]), tmp_path / "unpacked")
    rows: list[dict[str, Any]] = [{"device_id": "dev-1", "target": "cpu-x86", "status": "online"}]
    options = RolloutOptions("*", 0.5, 0.0, [], artifact_urls=("https://cdn.example/{artifact_id}", "http://origin/p"))
    submit_rollout(running.store(), plan_rollout(rows, [package], "100%", 0.0), options)
    message = next_desired(device)
    desired = DesiredState.from_payload(verify_signed(message.payload, TrustedKeys([running.key.public_key()]), DESIRED_TYPE))
    assert desired.model is not None
    assert desired.model.urls == (f"https://cdn.example/{package.manifest.artifact_id}", "http://origin/p")


def test_deploy_direct_with_artifact_url(home: EdgectlHome, controller: Controller, agents: Callable[..., AgentProcess],
                                         big_package: Package, range_servers: Callable[..., RangeServer]) -> None:
    agent = agents(home, "u-1", extra={"deploy": DEPLOY})
    server = range_servers(big_package)
    controller.serving = False  # the test's chunk server stays silent; edgectl deploy serves chunks itself
    done = home.edgectl("deploy", str(big_package.path), "--device", "u-1", "--artifact-url", f"{server.url}/{{artifact_id}}",
                        "--timeout", "120", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert serves(agent, "big", 1)
    assert server.bytes_sent == big_package.manifest.payload.size, "every byte came over HTTP"
    bad = home.edgectl("deploy", str(big_package.path), "--device", "u-1", "--artifact-url", "file:///etc/passwd")
    assert bad.returncode == 2 and "--artifact-url" in bad.stderr
