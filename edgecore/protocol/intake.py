"""What a device accepts from its controller: one implementation for the agent and the light simulated agents.

:class:`Intake` checks a desired state or a command the way every device must: the controller's
signature and the payload type, the address, the sequence number against the ledger, the expiry,
and for a desired state the package key's signature over its manifest. :func:`refusal` says why a
verified manifest must still not be installed here (expired, needs a newer agent, another target,
an older version). What the device then does with an order (a deployment, a rollback) is its own.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from edgecore.errors import EdgeError, ProtocolError
from edgecore.protocol.envelope import COMMAND_TYPE, DESIRED_TYPE, MANIFEST_TYPE, Envelope, TrustedKeys
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import Manifest
from edgecore.protocol.messages import (
    Command,
    DesiredModel,
    DesiredSet,
    DesiredState,
    check_addressed,
    read_desired,
    verify_signed,
)

__all__ = ["Intake", "Order", "SetOrder", "Verified", "check_pipeline_models", "refusal", "version_key"]

_VERSION = re.compile(r"^(\d+(?:\.\d+)*)(.*)$")


def version_key(text: str) -> tuple[tuple[int, ...], int, str]:
    """A sort key for a version such as ``0.10.0`` or ``1.2rc1``: release numbers compared as integers.

    Trailing zeros do not count (``1.0`` equals ``1``); a suffix after the numbers (``rc1``, ``.dev3``)
    sorts before the plain release. Raises ProtocolError for text that does not start with a number."""
    match = _VERSION.match(text.strip())
    if match is None:
        raise ProtocolError(f"version {text!r}: expected numbers separated by dots, such as 0.10.0")
    release = tuple(int(part) for part in match.group(1).split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    suffix = match.group(2)
    return release, 0 if suffix else 1, suffix


def refusal(manifest: Manifest, ledger: Ledger, device_target: str | None, allow_downgrade: bool,
            agent_version: str, now: float | None = None) -> str | None:
    """Why this verified manifest must not be installed here, or None: expiry, agent version, target, version."""
    if (now or time.time()) > manifest.expires_at:
        return f"manifest of {manifest.name} v{manifest.version} has expired"
    try:
        too_old = version_key(agent_version) < version_key(manifest.min_agent_version)
    except ProtocolError as exc:
        return f"min_agent_version of {manifest.name} v{manifest.version}: {exc}"
    if too_old:
        return (f"{manifest.name} v{manifest.version} needs agent {manifest.min_agent_version} or newer;"
                f" this agent is {agent_version}")
    if not manifest.target.accepts(device_target):
        return f"package is for target {manifest.target.name!r}, this device is {device_target!r}"
    last = ledger.version(manifest.name)
    if manifest.version < last and not allow_downgrade:
        return f"version {manifest.version} of {manifest.name} is older than the accepted {last}"
    return None


@dataclass(frozen=True)
class Order:
    """A desired state that passed every check, with its verified manifest (the signed bytes and their reading)."""

    desired: DesiredState
    manifest: Manifest
    manifest_bytes: bytes


@dataclass(frozen=True)
class Verified:
    """One entry of a desired set with its verified manifest (the signed bytes and their reading)."""

    entry: DesiredModel
    manifest: Manifest
    manifest_bytes: bytes


@dataclass(frozen=True)
class SetOrder:
    """A desired set (schema 2, or schema 1 read as the set of its model) whose every manifest passed the checks."""

    desired: DesiredSet
    models: tuple[Verified, ...]
    pipelines: tuple[Verified, ...]

    @property
    def entries(self) -> tuple[Verified, ...]:
        return (*self.models, *self.pipelines)


class Intake:
    """A device's checks of what its controller sends: signature and type, address, sequence, expiry, manifest.

    ``keys(role)`` gives the keys trusted now for ``package`` or ``controller`` (rotations move them).
    The caller moves the ledger's sequence on (:meth:`Ledger.accept_seq`) once it has kept what an
    order asks, so that a message it acknowledged is never lost; :meth:`desired` does it itself
    for what asks nothing more (no model) and for a manifest refused for good."""

    def __init__(self, device_id: str, ledger: Ledger, keys: Callable[[str], TrustedKeys]) -> None:
        self.device_id = device_id
        self.ledger = ledger
        self.keys = keys

    def desired(self, raw: bytes, retained: bool) -> Order | None:
        """The order in a signed desired state; None when there is nothing to do.

        The broker hands back the retained desired state on every (re)connect: one already handled
        is ignored silently. Raises EdgeError for anything refused (the caller reports it)."""
        desired = DesiredState.from_payload(verify_signed(raw, self.keys("controller"), DESIRED_TYPE))
        if retained and desired.seq <= self.ledger.last_seq and desired.device_id == self.device_id:
            return None
        check_addressed(desired, self.device_id, self.ledger.last_seq)
        if desired.model is None:
            self.ledger.accept_seq(desired.seq)
            return None
        try:
            manifest_bytes = self.keys("package").verify(desired.model.manifest, MANIFEST_TYPE)
            manifest = Manifest.from_bytes(manifest_bytes)
            if (manifest.name, manifest.version) != (desired.model.name, desired.model.version):
                raise ProtocolError("desired state names a different model than its signed manifest")
        except EdgeError:
            self.ledger.accept_seq(desired.seq)  # refused for good: its replay is refused as a replay
            raise
        return Order(desired, manifest, manifest_bytes)

    def desired_set(self, raw: bytes, retained: bool) -> SetOrder | None:
        """The verified set in a signed desired state of either schema; None when there is nothing to do.

        Schema 1 is the set of its one model (``model: null``: nothing to do). Every manifest must
        carry the package key's signature, name the entry's name and version, be of the kind its
        list holds (``models``: model, ``pipelines``: pipeline), and every pipeline step must name
        a model of the set; one that does not refuses the whole set, for good. Raises EdgeError
        for anything refused (the caller reports it)."""
        message = read_desired(verify_signed(raw, self.keys("controller"), DESIRED_TYPE))
        if retained and message.seq <= self.ledger.last_seq and message.device_id == self.device_id:
            return None
        check_addressed(message, self.device_id, self.ledger.last_seq)
        try:
            desired = message.as_set() if isinstance(message, DesiredState) else message
            if desired is None:
                self.ledger.accept_seq(message.seq)
                return None
            order = SetOrder(desired, tuple(self._verified(e, "model") for e in desired.models),
                             tuple(self._verified(e, "pipeline") for e in desired.pipelines))
            _check_pipelines(order)
        except EdgeError:
            self.ledger.accept_seq(message.seq)  # refused for good: its replay is refused as a replay
            raise
        return order

    def _verified(self, entry: DesiredModel, kind: str) -> Verified:
        manifest_bytes = self.keys("package").verify(entry.manifest, MANIFEST_TYPE)
        manifest = Manifest.from_bytes(manifest_bytes)
        if (manifest.name, manifest.version) != (entry.name, entry.version):
            raise ProtocolError(f"desired state names {entry.name} v{entry.version} but its signed manifest is "
                                f"{manifest.name} v{manifest.version}")
        if manifest.kind != kind:
            raise ProtocolError(f"desired state lists {entry.name} among the {kind}s but its manifest is a {manifest.kind}")
        return Verified(entry, manifest, manifest_bytes)

    def command(self, envelope: Envelope) -> Command:
        """The signed command in ``envelope``, addressed to this device, newer than the ledger's sequence, not expired."""
        command = Command.from_payload(self.keys("controller").verify(envelope, COMMAND_TYPE))
        check_addressed(command, self.device_id, self.ledger.last_seq)
        return command


def _check_pipelines(order: SetOrder) -> None:
    models = {v.manifest.name: v.manifest for v in order.models}
    for pipeline in order.pipelines:
        check_pipeline_models(pipeline.manifest, models)


def check_pipeline_models(pipeline: Manifest, models: Mapping[str, Manifest]) -> None:
    """Every step of ``pipeline`` runs one of ``models``, feeds each of its inputs and reads only outputs it has.

    The device checks a desired set with it, ``edgectl pipeline build`` a pipeline with its models' packages."""
    spec = pipeline.pipeline
    assert spec is not None  # a pipeline manifest always has its steps
    for step in spec.steps:
        if step.model is None:
            continue
        model = models.get(step.model)
        what = f"pipeline {pipeline.name}: step {step.name!r}"
        if model is None:
            raise ProtocolError(f"{what} runs model {step.model!r}, which the set does not name")
        inputs, outputs = [t.name for t in model.inputs], [t.name for t in model.outputs]
        fed = [name for name, _ in step.inputs]
        if sorted(fed) != sorted(inputs):
            raise ProtocolError(f"{what} feeds {', '.join(sorted(fed))} but {model.name} v{model.version} takes "
                                f"{', '.join(sorted(inputs))}")
        unknown = sorted({name for name, _ in step.outputs} - set(outputs))
        if unknown:
            raise ProtocolError(f"{what} reads output(s) {', '.join(unknown)} that {model.name} v{model.version} "
                                f"does not have (its outputs: {', '.join(outputs)})")
