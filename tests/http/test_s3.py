"""``edgectl artifacts publish --s3`` against an S3-compatible store (moto in server mode), and an agent fetching from it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from edgectl.package import Package
from tests.brokers import free_port
from tests.checkout import checkout_env
from tests.deploy.controller import Controller
from tests.deploy.test_rejections import serves
from tests.fleet import AgentProcess, EdgectlHome, wait_for
from tests.http.conftest import DEPLOY, desire

AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on a free port, with a bucket ``models``."""
    moto = shutil.which("moto_server", path=str(Path(sys.executable).parent))
    if moto is None:
        pytest.fail("moto_server is missing: .venv/bin/pip install 'moto[server]' boto3 (the s3 and test extras)")
    port = free_port()
    process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=checkout_env(**AWS))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(f"{url}/moto-api/"), 60, "moto's S3 server")
        _s3(url).create_bucket(Bucket="models")
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _s3(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def _public_read(endpoint: str, bucket: str) -> None:
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}]}
    _s3(endpoint).put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))


def _publish(home: EdgectlHome, package: Package, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**home.env(), **AWS}
    return subprocess.run([sys.executable, "-m", "edgectl.cli.main", "artifacts", "publish", str(package.path),
                           "--s3", "s3://models/fleet/v1", "--endpoint", endpoint, *args],
                          env=env, text=True, capture_output=True, timeout=120, cwd=home.path)


def test_agent_installs_from_a_presigned_s3_url(home: EdgectlHome, controller: Controller,
                                                agents: Callable[..., AgentProcess], big_package: Package,
                                                s3_endpoint: str) -> None:
    agent = agents(home, "s3-1", extra={"deploy": DEPLOY})
    done = _publish(home, big_package, s3_endpoint)
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip().splitlines()[-1]
    artifact = big_package.manifest.artifact_id
    assert url.startswith(f"{s3_endpoint}/models/fleet/v1/{artifact}?") and "X-Amz-Signature=" in url
    controller.serving = False
    assert controller.final("s3-1", desire(controller, "s3-1", big_package, [url])).status == "ok"
    assert serves(agent, "big", 1)
    assert controller.requests == []
    assert "X-Amz-Signature" not in agent.log_text(), "a presigned URL's signature stays out of the logs"


def test_plain_urls_and_errors(home: EdgectlHome, big_package: Package, s3_endpoint: str) -> None:
    done = _publish(home, big_package, s3_endpoint, "--plain", "--json")
    assert done.returncode == 0, done.stderr
    url = json.loads(done.stdout)[0]["url"]
    assert url == f"{s3_endpoint}/models/fleet/v1/{big_package.manifest.artifact_id}"
    _public_read(s3_endpoint, "models")  # a plain URL is for a bucket (or a CDN before it) that anyone may read
    with urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=0-9"}), timeout=10) as r:
        assert r.status == 206 and r.read() == big_package.payload.read_bytes()[:10]
    missing = subprocess.run([sys.executable, "-m", "edgectl.cli.main", "artifacts", "publish", str(big_package.path),
                              "--s3", "s3://no-such-bucket/x", "--endpoint", s3_endpoint],
                             env={**home.env(), **AWS}, text=True, capture_output=True, timeout=120, cwd=home.path)
    assert missing.returncode == 5 and missing.stderr.count("\n") == 1 and "no-such-bucket" in missing.stderr
    bad = _publish(home, big_package, s3_endpoint, "--expires", "200h")
    assert bad.returncode == 2 and "--expires" in bad.stderr
