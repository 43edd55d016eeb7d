"""Light agents (edgectl.sim) fetch the artifact by HTTP Range when the signed desired state names URLs, MQTT otherwise."""

from __future__ import annotations

from pathlib import Path

from edgecore.protocol.envelope import TrustedKeys
from edgectl.artifacts import RangeServer
from edgectl.artifacts.publish import export_payload
from edgectl.keys import Keyring
from edgectl.package import Package, read_package
from tests.control.conftest import ControlPlane, active, plane  # noqa: F401  (fixture used here)


def load_package(plane: ControlPlane, path: Path) -> Package:  # noqa: F811
    trusted = TrustedKeys([Keyring(plane.home.path / "keys").signing_key("package").public_key()])
    workdir = plane.home.path.parent / "read" / path.stem
    workdir.mkdir(parents=True, exist_ok=True)
    return read_package(path, trusted, workdir)


def _served(plane: ControlPlane, package: Path) -> RangeServer:  # noqa: F811
    root = plane.home.path.parent / "served"
    export_payload(load_package(plane, package), root)
    return RangeServer(root).start()


def test_light_agents_fetch_over_http_and_the_controller_sends_no_chunk(plane: ControlPlane) -> None:  # noqa: F811
    agents = plane.agents(3)
    controller = plane.start_controller()
    plane.wait_devices(3)
    package = plane.package("clf", 1, extra_matmuls=32)
    server = _served(plane, package)
    try:
        rollout = plane.deploy(str(package), "--fleet", "all", "--waves", "100%", "--bake", "0s",
                               "--artifact-url", f"{server.url}/{{artifact_id}}")
        assert plane.ended(rollout)["status"] == "done"
        size = load_package(plane, package).manifest.payload.size
        assert server.bytes_sent == 3 * size, "each light agent fetched every byte once over HTTP"
        assert controller.server.chunks_sent == 0
        assert all(active(a).version == 1 for a in agents)
    finally:
        server.stop()


def test_a_url_that_does_not_answer_falls_back_to_mqtt_chunks(plane: ControlPlane) -> None:  # noqa: F811
    agents = plane.agents(2)
    controller = plane.start_controller()
    plane.wait_devices(2)
    package = plane.package("clf", 1, extra_matmuls=32)
    rollout = plane.deploy(str(package), "--fleet", "all", "--waves", "100%", "--bake", "0s",
                           "--artifact-url", "http://127.0.0.1:9/{artifact_id}")
    assert plane.ended(rollout, timeout=120)["status"] == "done"
    assert controller.server.chunks_sent >= len(load_package(plane, package).manifest.payload.chunks)
    assert all(active(a).version == 1 for a in agents)
