"""Agents pin keys in their config and move to a new key only on a rotation signed by a key they trust."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore.protocol import topics
from edgecore.protocol.envelope import public_key_pem
from edgecore.protocol.trust import KeyRotation
from tests.deploy.controller import Controller, resign_manifest
from tests.deploy.test_rejections import DEPLOY, serves
from tests.fleet import AgentProcess, EdgectlHome, wait_for


def test_rotation_signed_by_old_key_moves_the_device(home: EdgectlHome, controller: Controller,
                                                     agents: Callable[..., AgentProcess], model_v: Callable[..., Path]) -> None:
    agent = agents(home, "r-1", extra={"deploy": DEPLOY})
    old = controller.ring.signing_key("package")
    assert controller.final("r-1", controller.desired("r-1", controller.package(model_v(1), "m", 1))).status == "ok"

    # A rotation signed by a key the device does not trust is refused.
    forged = KeyRotation("package", 1, time.time(), (public_key_pem(Ed25519PrivateKey.generate().public_key()),))
    since = len(controller.events)
    controller.publish(topics.device("r-1", "commands"), forged.sign(Ed25519PrivateKey.generate()).to_bytes())
    assert "untrusted" in controller.rejection("r-1", since).detail

    result = home.edgectl("keys", "rotate", "package", "--retire-old", "--device", "r-1", check=True)
    assert "sent rotation to r-1" in result.stdout
    wait_for(lambda: any(e.state == "key-rotation" and e.status == "ok" for e in controller.events), 20, "rotation accepted")

    agent.stop()
    agent.start()  # the accepted rotation survives a restart
    v2 = controller.package(model_v(2), "m", 2)  # signed by the new active key
    assert controller.final("r-1", controller.desired("r-1", v2)).status == "ok"
    v3 = controller.package(model_v(3), "m", 3)
    since = len(controller.events)
    controller.desired("r-1", v3, manifest=resign_manifest(v3, old))  # the retired key no longer counts
    assert "untrusted" in controller.rejection("r-1", since).detail
    assert serves(agent, "m", 2)
