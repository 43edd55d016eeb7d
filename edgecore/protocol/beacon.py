"""The fleet's beacon: the controller's signed, retained proof that a broker is the fleet's.

A broker that answers is not necessarily the fleet's: a standalone one listed by mistake takes a
device's connection and never carries a word from the controller. The leading controller keeps a
beacon retained on ``edge/v1/fleet/beacon`` (every device may read it, only the controller write
it): ``{"schema": 1, "type": "beacon", "ts", "expires"}`` in a DSSE envelope signed by the
controller key the devices already trust, republished on every (re)connect and every
:data:`BEACON_EVERY_S`. An agent that finds neither a valid beacon nor a desired state signed for
itself within ``broker_check_s`` of connecting moves on to its next broker (agent/fleet_check.py).

The beacon is valid for :data:`BEACON_VALIDITY_S`, the window desired states have (7 days), so
that it tolerates the device clock skew a desired state tolerates (docs/security.md, "Clock skew");
a broker the controller left long ago keeps a beacon that proves nothing after that.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.envelope import Envelope, TrustedKeys, sign
from edgecore.protocol.schema import decode_json, encode_json

__all__ = ["BEACON_EVERY_S", "BEACON_TYPE", "BEACON_VALIDITY_S", "Beacon", "signed_beacon", "verify_beacon"]

BEACON_TYPE = "application/vnd.edgectl.beacon.v1+json"
BEACON_EVERY_S = 60.0  # how often the leading controller republishes it
BEACON_VALIDITY_S = 7 * 86400.0  # a desired state's window (edgectl/controller/sets.py): the same skew is tolerated


@dataclass(frozen=True)
class Beacon:
    """When the controller signed it (``ts``) and until when it proves anything (``expires``), in Unix seconds."""

    ts: float
    expires: float

    def to_payload(self) -> bytes:
        return encode_json({"type": "beacon", "ts": self.ts, "expires": self.expires})

    @classmethod
    def from_payload(cls, raw: bytes) -> Beacon:
        f = decode_json(raw, "beacon")
        if f.text("type", 32) != "beacon":
            raise ProtocolError("beacon: type must be 'beacon'")
        return cls(f.number("ts"), f.number("expires"))


def signed_beacon(key: Ed25519PrivateKey, now: float | None = None) -> bytes:
    """A beacon signed with the controller key, valid for :data:`BEACON_VALIDITY_S` from ``now``."""
    ts = time.time() if now is None else now
    return sign(BEACON_TYPE, Beacon(ts, ts + BEACON_VALIDITY_S).to_payload(), key).to_bytes()


def verify_beacon(raw: bytes, trusted: TrustedKeys, now: float | None = None) -> Beacon:
    """The beacon in ``raw`` if a trusted controller key signed it and it has not expired; else EdgeError saying why."""
    beacon = Beacon.from_payload(trusted.verify(Envelope.from_bytes(raw), BEACON_TYPE))
    if (time.time() if now is None else now) > beacon.expires:
        raise VerificationError(f"beacon expired at {time.ctime(beacon.expires)}")
    return beacon
