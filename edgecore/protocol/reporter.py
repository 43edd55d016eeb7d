"""How a device publishes its reports: one implementation for the agent and the light simulated agents.

Each report goes to its own topic under the device's prefix with the QoS and retain flag of its
kind (:mod:`edgecore.protocol.reports`); presence is online after :meth:`Reporter.announce`, offline
in the last will (:func:`presence_will`) and in the goodbye a clean close publishes.
"""

from __future__ import annotations

import time
from typing import Any

from edgecore.errors import InternalError
from edgecore.protocol import topics
from edgecore.protocol.reports import Birth, DeviceEvent, DeviceState, Presence, Report
from edgecore.transport import Transport, Will

__all__ = ["Reporter", "presence_will"]


def presence_will(device_id: str) -> Will:
    """The offline presence the broker publishes (retained) when the device's connection dies."""
    return Will(topics.device(device_id, Presence.LEAF), Presence(device_id, False, time.time()).to_payload())


class Reporter:
    """Publishes one device's reports on ``transport``."""

    def __init__(self, transport: Transport, device_id: str) -> None:
        self.transport = transport
        self.device_id = topics.validate_id(device_id)

    def publish(self, report: Report) -> bool:
        """Publish ``report`` on its topic; False when the broker connection did not take it."""
        if report.device_id != self.device_id:  # a device reports only about itself: the controller would drop it
            raise InternalError(f"device {self.device_id} asked to publish a {report.LEAF} report of {report.device_id}")
        return self.transport.publish(topics.device(self.device_id, report.LEAF), report.to_payload(), qos=report.QOS,
                                      retain=report.RETAIN)

    def announce(self, birth: Birth, state: DeviceState) -> None:
        """Birth, presence and state, on every (re)connect; only publishes, so it may run on the network thread."""
        self.publish(birth)
        self.publish(Presence(self.device_id, True, time.time()))
        self.publish(state)

    def event(self, deployment_id: str, state: str, status: str, detail: str, data: dict[str, Any] | None = None,
              model: str | None = None) -> bool:
        """One deployment transition (or a refusal: ``deployment_id`` "none", status ``rejected``) about ``model``."""
        return self.publish(DeviceEvent(self.device_id, deployment_id, state, status, detail, time.time(), data or {},
                                        model))

    def goodbye(self) -> tuple[str, bytes]:
        """The offline presence to publish (retained) on a clean close: ``transport.close(final=reporter.goodbye())``."""
        return topics.device(self.device_id, Presence.LEAF), Presence(self.device_id, False, time.time()).to_payload()
