"""Putting a package's payload where devices fetch it by HTTP(S): a served directory or an S3 bucket.

The object is the package's ``payload.tar`` byte for byte, named by its sha256 (the artifact id),
so one name never holds two payloads and a URL template ``.../{artifact_id}`` fits every package.
S3 needs boto3 (the ``s3`` extra); any S3-compatible store works through ``--endpoint``.
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgecore.errors import OperationFailed, UserError
from edgectl.package import Package

__all__ = ["S3Location", "export_payload", "publish_s3"]

MAX_PRESIGN_S = 7 * 86400  # the most SigV4 allows


@dataclass(frozen=True)
class S3Location:
    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, uri: str) -> S3Location:
        parts = urllib.parse.urlsplit(uri)
        if parts.scheme != "s3" or not parts.netloc:
            raise UserError(f"--s3 {uri!r}: expected s3://BUCKET[/PREFIX]")
        return cls(parts.netloc, parts.path.strip("/"))

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name


def export_payload(package: Package, directory: Path) -> Path:
    """Copy the payload to ``directory/<artifact id>`` (atomically; kept if already there and whole)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / package.manifest.artifact_id
    if out.is_file() and out.stat().st_size == package.manifest.payload.size:
        return out
    partial = directory / f".{out.name}.partial"
    shutil.copyfile(package.payload, partial)
    os.replace(partial, out)
    return out


def publish_s3(package: Package, location: S3Location, endpoint: str | None, region: str | None,
               presign_s: int | None) -> str:
    """Upload the payload; return a presigned GET URL valid ``presign_s`` seconds, or the plain URL when None."""
    if presign_s is not None and not 1 <= presign_s <= MAX_PRESIGN_S:
        raise UserError(f"--expires: {presign_s}s is outside 1s..168h (the most an S3 presigned URL allows)")
    client = _client(endpoint, region)
    key = location.key(package.manifest.artifact_id)
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client.upload_file(str(package.payload), location.bucket, key,
                           ExtraArgs={"ContentType": "application/octet-stream"})
        if presign_s is None:
            return _plain_url(client, location.bucket, key)
        url: str = client.generate_presigned_url("get_object", Params={"Bucket": location.bucket, "Key": key},
                                                 ExpiresIn=presign_s)
        return url
    except (Boto3Error, BotoCoreError, ClientError) as exc:  # translated at the boundary
        raise OperationFailed(f"publishing to s3://{location.bucket}/{key}: {_one_line(exc)}") from exc


def _client(endpoint: str | None, region: str | None) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:
        raise UserError("publishing to S3 needs boto3: pip install 'edgectl[s3]'") from exc
    # Path-style addressing works on every S3-compatible store (MinIO, Ceph, moto) and on AWS.
    config = Config(signature_version="s3v4", s3={"addressing_style": "path"})
    return boto3.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", config=config)


def _plain_url(client: Any, bucket: str, key: str) -> str:
    base = str(client.meta.endpoint_url).rstrip("/")
    return f"{base}/{urllib.parse.quote(bucket)}/{urllib.parse.quote(key)}"


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
