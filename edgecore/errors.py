"""One exception tree for host and device, with stable CLI exit codes.

::

    EdgeError                      exit 1   root; never raised directly
    ├── UserError                  exit 2   the input is wrong: fix it and retry
    │   ├── ConfigError                     a config file, key, flag or environment variable
    │   ├── ModelError                      an ONNX model is malformed, hostile or unsupported
    │   ├── PackageError                    an .edgepkg is malformed or unsafe to extract
    │   ├── ProtocolError                   an MQTT payload or topic breaks the wire contract
    │   └── NotFoundError                   a named device, target, rollout or key does not exist
    ├── VerificationError          exit 3   a signature, hash, version, expiry or target check failed
    ├── BrokerUnavailable          exit 4   the MQTT broker cannot be reached
    ├── OperationFailed            exit 5   the work ran but did not succeed (deployment failed,
    │                                       rollout halted, accuracy budget not met, timeout)
    └── InternalError              exit 1   a bug: please report it with the --debug traceback

Third-party exceptions (onnx, onnxruntime, paho, cryptography) are translated into this tree at
the boundary where they are raised, so callers never see them.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BrokerUnavailable",
    "ConfigError",
    "EdgeError",
    "InternalError",
    "ModelError",
    "NotFoundError",
    "OperationFailed",
    "PackageError",
    "ProtocolError",
    "UserError",
    "VerificationError",
    "listing",
    "one_line",
]

LISTED = 10  # names an error message shows before it says how many more there are


class EdgeError(Exception):
    """Root of every error edgectl and edge-agent raise on purpose."""

    exit_code = 1


class UserError(EdgeError):
    """The input is wrong: a model, package, config, argument or payload."""

    exit_code = 2


class ConfigError(UserError):
    """A config file, key, flag or environment variable is invalid."""


class ModelError(UserError):
    """An ONNX model is malformed, hostile or unsupported."""


class PackageError(UserError):
    """A model package is malformed or unsafe to extract."""


class ProtocolError(UserError):
    """An MQTT payload or topic does not follow wire protocol v1."""


class NotFoundError(UserError):
    """A named device, target profile, rollout or key does not exist."""


class VerificationError(EdgeError):
    """A signature, hash, version, expiry or compatibility check failed."""

    exit_code = 3


class BrokerUnavailable(EdgeError):
    """The MQTT broker cannot be reached."""

    exit_code = 4


class OperationFailed(EdgeError):
    """The work ran but did not succeed."""

    exit_code = 5


class InternalError(EdgeError):
    """A bug in edgectl or edge-agent."""

    exit_code = 1


def one_line(exc: BaseException) -> str:
    """The whole message of ``exc`` on one line (runtimes put the reason after a source location line)."""
    text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


def listing(names: Iterable[object], limit: int = LISTED, sep: str = ", ") -> str:
    """``names`` joined for an error message, the first ``limit`` of them and a count of the rest.

    A hostile package or model can name 100,000 members or inputs: the message stays one short line."""
    shown: list[str] = []
    more = 0
    for name in names:
        if len(shown) < limit:
            text = str(name)
            shown.append(text if len(text) <= 200 else text[:200] + "…")
        else:
            more += 1
    return sep.join(shown) + (f"{sep}... and {more:,} more" if more else "")
