"""Taking records out of the fleet: decommission a device (revoking its certificate), delete it, delete a package.

A decommissioned device stays in the store for history (``devices.decommissioned``) and is left out of
selectors, rollouts, gates, counts and metrics; the controller clears its retained desired state on the
broker, cancels what its rollouts had not finished with it, and drops (and counts) its reports from then
on, so a device that reconnects is never a fleet member again. Deleting one removes its rows once it is
decommissioned. A package may be deleted while no rollout, in any status, names it: a finished rollout
can still retry its failed devices and roll back, and it is the record of what was sent.
"""

from __future__ import annotations

import enum
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from edgecore.errors import NotFoundError, OperationFailed, UserError
from edgectl.controller.queries import UploadedPackage
from edgectl.controller.store import Store
from edgectl.pki import FleetPki, default_pki_dir

__all__ = ["Decommissioned", "InUse", "Revocation", "decommission_device", "delete_device", "delete_package", "fleet_pki"]

VARIANT = re.compile(r"[0-9a-f]{64}")


class Revocation(str, enum.Enum):
    """What became of the device's certificate."""

    REVOKED = "revoked"
    ALREADY = "already revoked"
    NOT_ENROLLED = "not enrolled"  # the PKI here never issued it one: revoke it where it was enrolled
    NO_PKI = "no fleet PKI"  # no CA on this host (a plaintext test fleet, or the CA kept on a workstation)

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class Decommissioned:
    device_id: str
    at: float
    certificate: Revocation
    crl_written: tuple[str, ...] = ()  # where the new CRL was written (reload those brokers)

    def to_dict(self) -> dict[str, object]:
        return {"device_id": self.device_id, "decommissioned": self.at, "certificate": self.certificate.value,
                "crl_written": list(self.crl_written)}


class InUse(OperationFailed):
    """A package that rollouts name: it is not deleted."""

    def __init__(self, variant: str, rollouts: list[str]) -> None:
        shown = ", ".join(rollouts[:10]) + (f" and {len(rollouts) - 10} more" if len(rollouts) > 10 else "")
        super().__init__(f"package {variant[:12]} is used by rollout(s) {shown}: a package any rollout names is kept")
        self.rollouts = rollouts


def fleet_pki(root: Path | None = None) -> FleetPki | None:
    """The fleet CA at ``root`` ($EDGECTL_PKI, else $EDGECTL_HOME/pki); None when there is none."""
    root = root or Path(os.environ.get("EDGECTL_PKI") or default_pki_dir())
    pki = FleetPki(root)
    return pki if pki.ca_cert_path.exists() else None


def decommission_device(store: Store, device_id: str, actor: str, pki: FleetPki | None) -> Decommissioned:
    """Revoke the device's certificate (when ``pki`` issued it), then take it out of the fleet; audited."""
    device = store.device(device_id)
    if device is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store")
    certificate, written = _revoke(pki, device_id)
    at = time.time()
    with store.batch():
        if not store.decommission_device(device_id, at):
            raise OperationFailed(f"device {device_id!r} was decommissioned already")
        store.audit("device decommissioned", f"certificate: {certificate}", device_id=device_id, actor=actor)
    return Decommissioned(device_id, at, certificate, tuple(str(p) for p in written))


def _revoke(pki: FleetPki | None, device_id: str) -> tuple[Revocation, list[Path]]:
    if pki is None:
        return Revocation.NO_PKI, []
    if not pki.device_cert_path(device_id).exists():
        return Revocation.NOT_ENROLLED, []
    if not pki.revoke(device_id):
        return Revocation.ALREADY, []
    return Revocation.REVOKED, [pki.crl_path, *pki.crl_targets()]


def delete_device(store: Store, device_id: str, actor: str) -> None:
    """Remove a decommissioned device's rows (its record, served models, history); rollout rows and the audit stay."""
    device = store.device(device_id)
    if device is None:
        raise NotFoundError(f"device {device_id!r} is not in the controller store")
    with store.batch():
        if not store.delete_device(device_id):
            raise OperationFailed(f"device {device_id!r} is a fleet member: decommission it before deleting it")
        store.audit("device deleted", "its record and history removed", device_id=device_id, actor=actor)


def delete_package(store: Store, variant: str, actor: str) -> UploadedPackage:
    """Unlist an uploaded package and remove its file, unless a rollout names it (:class:`InUse`); audited."""
    if not VARIANT.fullmatch(variant):
        raise UserError(f"variant {variant[:80]!r}: expected a package's variant id (64 lowercase hex digits)")
    listed = next((p for p in store.packages() if p.ref.variant == variant), None)
    if listed is None:
        raise NotFoundError(f"no uploaded package with variant {variant[:12]}")
    users = [r.id for r in store.rollouts() if any(p.variant == variant for p in r.spec.packages)]
    if users:
        raise InUse(variant, users)
    store.discard_package(variant)
    ref = listed.ref
    store.audit("package deleted", f"{ref.label} v{ref.version} for {ref.target}, variant {variant[:12]}", actor=actor)
    return listed
