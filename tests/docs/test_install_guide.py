"""The install guide, run as written: docs/agent-install.md by hand, as root, and the agent must come up.

The guide's own blocks run, line for line as the page has them: on the workstation (a fresh
EDGECTL_HOME) the enrolment block; on "the device" the by-hand install (useradd, the venv in
/opt/edge-agent, /etc/edge-agent, /var/lib/edge-agent, the unit) and the start block (modes,
``systemctl enable --now``, ``edge-agent probe``), with docker-systemctl-replacement as ``systemctl``
(the supervisor ./scripts/test-deb uses; it reads ``User=``, ``Group=``, ``SupplementaryGroups=``,
``StateDirectory=``). The prose steps between them are done here as the page says: the bundle copied
to /etc/edge-agent and a target profile added to its agent.yaml.

The device is a throwaway root: a mount namespace whose /etc, /opt, /var and /run are overlays on
this machine's (the user, the venv and the unit vanish with it), a network namespace of its own
where ``broker.example`` is the loopback and Mosquitto listens on 8883 with the config
``edgectl broker config`` writes, and a PID namespace, so nothing it started outlives it. pip has
no network there: ``pip install 'edgectl[agent]'`` runs as written against a local wheel
directory (PIP_NO_INDEX, PIP_FIND_LINKS, as behind a mirror) holding this checkout's wheel and the
`agent` extra's installed distributions, repacked. The agent is up when it runs as edge-agent and its
presence at the broker (read with the controller's certificate) says online.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.metadata as metadata
import os
import re
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.checkout import REPO, checkout_env
from tests.devices.lean import declared, requirement_closure
from tests.docs.blocks import Block, blocks

pytestmark = pytest.mark.slow

GUIDE = REPO / "docs" / "agent-install.md"
SUPERVISOR = REPO / ".venv" / "bin" / "systemctl3"
TIMEOUT_S = 420


def guide_block(containing: str) -> Block:
    """The one command block of the guide with a line that contains ``containing``."""
    found = [block for block in blocks(GUIDE) if block.language == "bash" and any(containing in line for line in block.body)]
    assert len(found) == 1, f"docs/agent-install.md: expected one block with {containing!r}, found {[b.where for b in found]}"
    return found[0]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, dest: Path) -> Path:
    """A wheel of an installed distribution: its files under site-packages, its dist-info, a fresh RECORD.

    Console scripts come back from entry_points.txt when pip installs it; nothing outside site-packages
    (``../../bin``) is kept."""
    origin = Path(str(dist.locate_file("")))
    info = next(Path(str(f)).parts[0] for f in dist.files or [] if Path(str(f)).parts[0].endswith(".dist-info"))
    wheel_meta = (origin / info / "WHEEL").read_text()
    tags = [tag.split("-") for tag in re.findall(r"^Tag: (\S+)$", wheel_meta, re.MULTILINE)]
    assert tags, f"{info}/WHEEL names no tag"
    # The compressed tag set (py2.py3-none-any): each part's values, in order.
    tag = "-".join(".".join(dict.fromkeys(parts[i] for parts in tags)) for i in range(3))
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    path = dest / f"{name}-{dist.version}-{tag}.whl"
    skip = {f"{info}/RECORD", f"{info}/INSTALLER", f"{info}/REQUESTED", f"{info}/direct_url.json"}
    record: list[str] = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as wheel:
        for file in dist.files or []:
            relative = Path(str(file)).as_posix()
            if relative.startswith("..") or "__pycache__" in relative or relative in skip:
                continue
            data = (origin / relative).read_bytes()
            wheel.writestr(relative, data)
            record.append(f"{relative},{_record_hash(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def wheelhouse(dest: Path) -> Path:
    """This checkout's wheel and the `agent` extra's closure, from this venv: what pip finds on the device."""
    dest.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w", str(dest)],
                   check=True, capture_output=True, env=checkout_env())
    for dist in requirement_closure(declared("agent")).values():
        repack(dist, dest)
    return dest


def device_script(by_hand: Block, start: Block, bundle: Path, broker: Path, ca: Path, controller: tuple[Path, Path],
                  overlays: Path) -> str:
    """The device's side: the throwaway root, the broker, then the guide's blocks as written."""
    cert, key = controller
    lines = [
        "set -euo pipefail",
        "trap 'status=$?; echo \"::failed $LINENO $status\" >&2' ERR",
        "step() { echo \"::step $*\" >&2; }",
        "step the throwaway root",
        "mount --make-rprivate /",
        "for d in etc opt var run; do",
        f"  mkdir -p {overlays}/$d/upper {overlays}/$d/work",
        f"  mount -t overlay overlay -o lowerdir=/$d,upperdir={overlays}/$d/upper,workdir={overlays}/$d/work /$d",
        "done",
        "! getent passwd edge-agent >/dev/null || { echo 'an edge-agent user exists already' >&2; exit 3; }",
        "ip link set lo up",
        "echo '127.0.0.1 broker.example' >> /etc/hosts",
        "step the broker",
        f"printf 'user root\\nlog_dest file {broker}/mosquitto.log\\n' >> {broker}/mosquitto.conf",
        f"mosquitto -d -c {broker}/mosquitto.conf",
        f"cd {REPO}",
        f"step {by_hand.where}: by hand",
        *(command for _, command in by_hand.commands()),
        "step copy the bundle to /etc/edge-agent and add a target profile",
        f"cp -r {bundle}/. /etc/edge-agent/",
        "echo 'target: cpu-x86' >> /etc/edge-agent/agent.yaml",
        f"step {start.where}: enrolling and starting",
        *(command for _, command in start.commands()),
        "step the agent is online at the broker",
        f"presence=$(mosquitto_sub -h broker.example -p 8883 --cafile {ca} --cert {cert} --key {key} -i docs-check"
        " -t edge/v1/devices/cam-17/presence -C 1 -W 120)",
        "echo \"presence: $presence\" >&2",
        "echo \"$presence\" | grep -q '\"online\": *true'",
        "step the agent runs as edge-agent, with the accelerator groups",
        "pid=$(systemctl show -p MainPID edge-agent | cut -d= -f2)",
        "[ \"$(stat -c %U /proc/$pid)\" = edge-agent ]",
        "for group in video render plugdev; do",
        "  grep -qw \"$(getent group $group | cut -d: -f3)\" <(sed -n 's/^Groups://p' /proc/$pid/status)",
        "done",
        "step the agent stops",
        "systemctl stop edge-agent",
        "echo ::done >&2",
    ]
    return "\n".join(lines) + "\n"


def _agent_log(overlays: Path) -> str:
    logs = sorted((overlays / "var" / "upper" / "log").rglob("*edge-agent*")) if (overlays / "var" / "upper").exists() else []
    return "\n".join(path.read_text(errors="replace")[-3000:] for path in logs if path.is_file())


@pytest.fixture(scope="module")
def device_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("the install guide runs as root (useradd, mounts); ./scripts/test runs as root in its container")
    for tool in ("unshare", "mosquitto", "mosquitto_sub", "ip", "useradd"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            pytest.fail(f"{tool} is not installed: ./scripts/test installs it")
    if not SUPERVISOR.exists():
        pytest.fail("docker-systemctl-replacement is not installed (the test extra has it)")


def test_the_install_guide_as_written_brings_the_agent_up(device_tools: None, tmp_path: Path) -> None:
    enroll, by_hand, start = guide_block("edgectl device enroll"), guide_block("useradd"), guide_block("systemctl daemon-reload")
    # The workstation: the guide's enrolment block, and a broker for broker.example (docs/security.md).
    work, home = tmp_path / "workstation", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    base = {name: value for name, value in os.environ.items() if not name.startswith(("EDGECTL_", "EDGE_AGENT_"))}
    env = checkout_env(base, EDGECTL_HOME=str(home / ".edgectl"), HOME=str(home),
                       PATH=os.pathsep.join([str(REPO / ".venv" / "bin"), base.get("PATH", "")]))
    script = "set -euo pipefail\n" + "\n".join(command for _, command in enroll.commands()) + "\n" \
        + "edgectl broker config --out ./broker --host broker.example --port 8883\n"
    done = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{enroll.where}: the enrolment block failed:\n{done.stdout}{done.stderr}"
    pki = home / ".edgectl" / "pki"

    # The device.
    wheels = wheelhouse(tmp_path / "wheels")
    shim = tmp_path / "supervisor"
    shim.mkdir()
    (shim / "systemctl").symlink_to(SUPERVISOR)
    overlays = tmp_path / "root"
    device = device_script(by_hand, start, work / "cam-17", work / "broker", pki / "ca.pem",
                           (pki / "controller.pem", pki / "controller.key"), overlays)
    device_env = {"PATH": f"{shim}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
                  "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_NO_CACHE_DIR": "1",
                  "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    with subprocess.Popen(["unshare", "--mount", "--net", "--pid", "--fork", "--mount-proc", "bash", "-c", device],
                          env=device_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as run:
        try:
            stdout, stderr = run.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            stdout, stderr = run.communicate()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
    steps = re.findall(r"::step (.+)", stderr)
    if "::done" not in stderr:
        pytest.fail(f"the install guide failed at: {steps[-1] if steps else 'the start'} (exit {run.returncode})\n"
                    f"{stdout[-2000:]}{stderr[-3000:]}\nagent log:\n{_agent_log(overlays)}")
    assert "chmod 600 it" not in _agent_log(overlays), _agent_log(overlays)
