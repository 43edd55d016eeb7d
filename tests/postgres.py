"""A PostgreSQL cluster of the tests' own: ``initdb`` in a temp dir, ``pg_ctl`` on a free port.

Never the system server on 5432: the cluster listens on a free port of 127.0.0.1 and on a unix
socket in its own directory, trusts local connections, and runs with ``fsync=off`` (a test cluster
loses nothing it needs in a crash). initdb refuses to run as root, so as root the cluster runs as
the ``postgres`` user (``runuser -u postgres --``, its directory under /tmp chowned to that user).
Without PostgreSQL, or as root without a ``postgres`` user, the tests that need it FAIL with one
line saying how to install it: they are not skipped.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["INSTALL", "PostgresCluster", "find_bin", "start_cluster"]

INSTALL = "PostgreSQL is needed for these tests: install it with `sudo apt-get install postgresql` (./scripts/test does as root)"


def find_bin() -> Path | None:
    """The newest PostgreSQL server binaries: Debian's /usr/lib/postgresql/N/bin, else initdb on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresCluster:
    bin: Path
    root: Path
    port: int
    run_as: list[str] = field(default_factory=list)
    listen: str = "127.0.0.1"  # listen_addresses: more than loopback only where a test reaches it from elsewhere
    hba: str = ""  # pg_hba.conf lines added to initdb's (its own trust only local and loopback clients)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.root}&port={self.port}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([*self.run_as, *args], capture_output=True, text=True, timeout=120, cwd="/")
        if result.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            pytest.fail(f"{Path(args[0]).name} failed: {result.stderr.strip() or result.stdout.strip()} {log[-500:]}")
        return result

    def start(self) -> PostgresCluster:
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        if self.hba:
            with (self.data / "pg_hba.conf").open("a") as conf:
                conf.write(self.hba)
        return self.resume()

    def resume(self) -> PostgresCluster:
        """Start the server (again, after :meth:`halt`) on the same port and socket directory."""
        options = (f"-p {self.port} -k {self.root} -c listen_addresses={self.listen} -c fsync=off -c full_page_writes=off "
                   "-c max_connections=200 -c shared_buffers=32MB")
        self._run(str(self.bin / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-o", options)
        return self

    def halt(self) -> None:
        """Stop the server as an operator would (``pg_ctl stop -m fast``: sessions are ended, nothing is lost); the data stays."""
        self._run(str(self.bin / "pg_ctl"), "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data))

    def create_database(self) -> str:
        """A fresh database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "stop", "-m", "immediate", "-D", str(self.data)],
                       capture_output=True, timeout=60, cwd="/")
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster(listen: str = "127.0.0.1", hba: str = "") -> PostgresCluster:
    """Start a cluster, or fail the test with one line saying what to install (``listen``, ``hba``: see the fields)."""
    bin_dir = find_bin()
    if bin_dir is None:
        pytest.fail(INSTALL, pytrace=False)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        pytest.fail("psycopg is needed for these tests: .venv/bin/pip install 'psycopg[binary]' (the test extra has it)",
                    pytrace=False)
    run_as: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="edgectl-pg-"))  # under /tmp: the postgres user must reach it
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("running as root, initdb needs an unprivileged 'postgres' user: "
                        "install PostgreSQL with `apt-get install postgresql` (it creates one)", pytrace=False)
        os.chown(root, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    return PostgresCluster(bin_dir, root, _free_port(), run_as, listen, hba).start()
