"""Whether the broker the agent connected to is the fleet's; if not, move on to the next URL.

A broker that answers is not necessarily the fleet's: a standalone one listed (first, say) among
the cluster's nodes would hold the device for good, and the controller would never see it. Proof
that a broker is the fleet's is a message only the controller can make: its signed beacon
(edgecore/protocol/beacon.py, retained on ``edge/v1/fleet/beacon``) or a desired state signed for
this device (the retained one, or the controller's acknowledgement of a device it holds none for).
When neither came within ``broker_check_s`` of a (re)connect, the agent calls
``transport.move_on(reason)``: the next URL of its list. With one URL there is nowhere to go: it
says so once and stays. A message signed by any other key proves nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from edgecore.errors import EdgeError, VerificationError
from edgecore.protocol import topics
from edgecore.protocol.beacon import verify_beacon
from edgecore.protocol.envelope import DESIRED_TYPE, TrustedKeys
from edgecore.protocol.messages import read_desired, verify_signed
from edgecore.transport import Message, Transport

__all__ = ["FleetCheck"]

log = logging.getLogger(__name__)


class FleetCheck:
    """One verdict per connection: proven by a controller-signed message, or left after ``check_s`` (0: never).

    :meth:`connected` runs on the network thread at every (re)connect; :meth:`saw` and :meth:`tick`
    on the agent's main thread. ``moved(reason, waited_s)`` is told after each move, once connected
    to the next broker (the agent reports it as an event there)."""

    def __init__(self, device_id: str, transport: Transport, keys: Callable[[], TrustedKeys], check_s: float,
                 moved: Callable[[str, float], None] = lambda _reason, _waited: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.device_id = device_id
        self.transport = transport
        self.keys = keys  # the controller keys trusted now (rotations move them)
        self.check_s = check_s
        self.moved = moved
        self.clock = clock
        self.proven = False
        self.moves = 0  # brokers left for want of proof
        self._connected_at: float | None = None  # None: no verdict pending
        self._warned = False
        self._lock = threading.Lock()
        self.desired_topic = topics.device(device_id, "desired")

    @property
    def topics(self) -> tuple[str, ...]:
        """What to subscribe to besides the device's own topics (nothing when the check is off)."""
        return (topics.FLEET_BEACON,) if self.check_s > 0 else ()

    def connected(self) -> None:
        """A (re)connect: the broker must prove itself again."""
        with self._lock:
            self.proven = False
            self._connected_at = self.clock()

    def saw(self, message: Message) -> None:
        """``message`` proves the broker is the fleet's when it is a valid beacon or a desired state signed for this device."""
        if self.proven or message.topic not in (topics.FLEET_BEACON, self.desired_topic):
            return
        try:
            if message.topic == topics.FLEET_BEACON:
                verify_beacon(message.payload, self.keys())
            else:  # the device's own, however old: expiry and sequence are the intake's business
                desired = read_desired(verify_signed(message.payload, self.keys(), DESIRED_TYPE))
                if desired.device_id != self.device_id:
                    raise VerificationError(f"desired state addressed to {desired.device_id}")
        except EdgeError as exc:
            log.info("no proof that %s is the fleet's broker: %s on %s", self.node, exc, message.topic)
            return
        with self._lock:
            self.proven, self._connected_at = True, None
        log.info("broker %s is the fleet's: the controller's %s came", self.node,
                 "beacon" if message.topic == topics.FLEET_BEACON else "desired state")

    def tick(self) -> None:
        """Move on (or warn, with one URL) when ``check_s`` passed since the connect without proof.

        ``move_on`` connects to the next broker that answers; ``BrokerUnavailable`` when none does."""
        with self._lock:
            if self.check_s <= 0 or self.proven or self._connected_at is None or not self.transport.connected:
                return
            waited = self.clock() - self._connected_at
            if waited < self.check_s:
                return
            self._connected_at = None  # one verdict per connection
        reason = (f"not the fleet's broker: neither a signed beacon nor a desired state from the controller came on "
                  f"{self.node} within {waited:.0f}s (broker_check_s)")
        if self.transport.move_on(reason):
            self.moves += 1
            log.warning("moved on to broker %s: %s", self.node, reason)
            self.moved(reason, waited)
        elif not self._warned:
            self._warned = True
            log.warning("%s; it is the only broker configured, so the agent stays", reason)

    @property
    def node(self) -> str:
        """The broker connected to, as host:port (the in-memory transport has none to name)."""
        address = getattr(self.transport, "address", None)
        return f"{address.host}:{address.port}" if address is not None else "the broker"
