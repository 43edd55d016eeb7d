"""Artifacts over HTTP(S): serve a directory with Range support, publish payloads to S3, resolve URLs."""

from edgectl.artifacts.range_server import RangeNotSatisfiable, RangeServer, parse_range

__all__ = ["RangeNotSatisfiable", "RangeServer", "parse_range"]
