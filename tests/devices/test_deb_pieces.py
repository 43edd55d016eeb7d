"""The Debian package's pieces, quickly: its layout, control file, maintainer scripts and unit.

./scripts/test-deb installs the real package with apt, runs the agent by its unit and removes it
(minutes, root, this machine's packages); its figures are in docs/benchmarks.md.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.checkout import REPO

UNIT = REPO / "configs" / "systemd" / "edge-agent.service"
SUPERVISOR = shutil.which("systemctl3", path=str(Path(REPO / ".venv" / "bin")))


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed (Debian's dpkg)")
    work = tmp_path_factory.mktemp("deb")
    wheels = work / "wheels"
    wheels.mkdir()
    (wheels / "edgectl-0.1.0-py3-none-any.whl").write_bytes(b"stand-in: this test installs nothing")
    built = subprocess.run([str(REPO / "packaging" / "deb" / "build"), "--out", str(work / "dist"), "--wheels", str(wheels)],
                           capture_output=True, text=True, check=True)
    return Path(built.stdout.strip().splitlines()[-1])


def _field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "--field", str(deb), name], capture_output=True, text=True, check=True).stdout.strip()


def test_the_package_holds_the_wheels_unit_and_guide(deb: Path) -> None:
    assert deb.name.startswith("edge-agent_0.1.0_")
    listing = subprocess.run(["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True).stdout
    for path in ("./lib/systemd/system/edge-agent.service", "./usr/share/edge-agent/wheels/edgectl-0.1.0-py3-none-any.whl",
                 "./usr/share/edge-agent/agent.yaml.example", "./usr/share/doc/edge-agent/agent-install.md"):
        assert path in listing, path
    assert "root/root" in listing and "/opt/" not in listing  # the venv is made on the device, by the postinst
    assert _field(deb, "Package") == "edge-agent"
    assert "python3-venv" in _field(deb, "Depends") and "adduser" in _field(deb, "Depends")


def test_maintainer_scripts_parse_and_do_their_jobs(deb: Path, tmp_path: Path) -> None:
    subprocess.run(["dpkg-deb", "--control", str(deb), str(tmp_path)], check=True)
    scripts = {name: (tmp_path / name).read_text() for name in ("postinst", "prerm", "postrm")}
    for name in scripts:
        subprocess.run(["sh", "-n", str(tmp_path / name)], check=True)
        assert (tmp_path / name).stat().st_mode & 0o111, name
    assert "adduser --system" in scripts["postinst"] and "install -d -m 0700 -o edge-agent" in scripts["postinst"]
    assert "--no-index" in scripts["postinst"] and "python3 -m venv /opt/edge-agent" in scripts["postinst"]
    assert "systemctl stop edge-agent" in scripts["prerm"]
    assert "deluser" in scripts["postrm"] and "rm -rf /opt/edge-agent /var/lib/edge-agent /etc/edge-agent" in scripts["postrm"]


def test_the_unit_opens_the_accelerators_device_nodes() -> None:
    lines = UNIT.read_text().splitlines()
    assert {line.split("=", 1)[1] for line in lines if line.startswith("SupplementaryGroups=")} == {"video", "render", "plugdev"}
    allowed = {line.split("=", 1)[1] for line in lines if line.startswith("DeviceAllow=")}
    assert {"char-nvidia* rw", "char-drm rw", "char-accel rw", "char-usb_device rw"} <= allowed
    assert "DevicePolicy=closed" in lines
    assert "ExecStart=/opt/edge-agent/bin/edge-agent run --config /etc/edge-agent/agent.yaml" in lines


@pytest.mark.skipif(SUPERVISOR is None, reason="docker-systemctl-replacement is not installed (the test extra has it)")
def test_the_supervisor_reads_the_unit_as_systemd_does(tmp_path: Path) -> None:
    root = tmp_path / "a" / "b" / "root"
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    shutil.copy(UNIT, root / "etc" / "systemd" / "system")
    shown = subprocess.run([str(SUPERVISOR), f"--root={root}", "show", "edge-agent.service"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert {"User=edge-agent", "Group=edge-agent", "SupplementaryGroups=video render plugdev"} <= set(shown)
