"""The device protocol as an Android app speaks it: a small reference client, the spec for a Kotlin port.

It imports nothing of this project (paho-mqtt, cryptography and onnxruntime only), so every step an
app must take is on this page, in order (docs/targets.md#android-and-nnapi, docs/protocol.md):

1. Connect with the last will ``edge/v1/devices/<id>/presence`` = offline (retained); publish the
   birth, presence online and state (all retained, QoS 1); subscribe to ``.../desired``.
2. A desired state is a DSSE envelope: verify the ed25519 signature over ``PAE(type, payload)`` with
   a trusted **controller** key before reading anything; then its type, device id, expiry and a
   sequence number above the last one accepted. Its model's manifest is another envelope, signed by
   a trusted **package** key.
3. Subscribe to ``edge/v1/artifacts/<payload sha256>/chunks/+`` and ask for every chunk on
   ``.../chunk-requests``; keep each chunk whose sha256 is the manifest's, ask again for what is
   missing after a quiet interval, then check the whole payload's sha256.
4. Take the ORT-format model (file role ``ort``, from ``edgectl build --target nnapi --ort-out``) or
   the ONNX one from the payload (a tar), check its sha256, load it (onnxruntime-android with the NNAPI
   execution provider in the app; onnxruntime's CPU provider here), report events and the new state.

Each published JSON object carries ``"schema": 1``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
import paho.mqtt.client as mqtt
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_pem_public_key
from paho.mqtt.enums import CallbackAPIVersion

DESIRED_TYPE = "application/vnd.edgectl.desired.v1+json"
MANIFEST_TYPE = "application/vnd.edgectl.manifest.v1+json"
REQUEST_INTERVAL_S = 2.0


class Refused(Exception):
    """A message the app must not act on; the reason is reported as a ``rejected`` or ``failed`` event."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def key_id(public_pem: bytes) -> str:
    """First 16 hex digits of sha256 over the raw 32-byte ed25519 public key."""
    key = load_pem_public_key(public_pem)
    return hashlib.sha256(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()[:16]


def open_envelope(envelope: Mapping[str, Any], expected_type: str, trusted: Mapping[str, bytes]) -> dict[str, Any]:
    """The JSON payload of a DSSE envelope, after a trusted key's signature over it is verified."""
    if envelope.get("payloadType") != expected_type:
        raise Refused(f"envelope type {envelope.get('payloadType')!r} is not {expected_type}")
    payload = base64.b64decode(envelope["payload"], validate=True)
    for signature in envelope.get("signatures", []):
        pem = trusted.get(signature.get("keyid"))
        if pem is None:
            continue
        key = load_pem_public_key(pem)
        assert isinstance(key, Ed25519PublicKey)
        try:
            key.verify(base64.b64decode(signature["sig"], validate=True), pae(expected_type, payload))
        except InvalidSignature:
            continue
        parsed: dict[str, Any] = json.loads(payload)
        return parsed
    raise Refused("no trusted signature")


@dataclass
class Download:
    """One payload arriving in chunks: each kept only when its sha256 is the signed one."""

    artifact_id: str
    size: int
    chunk_size: int
    hashes: list[str]
    chunks: dict[int, bytes] = field(default_factory=dict)
    last_progress: float = field(default_factory=time.monotonic)

    def accept(self, index: int, data: bytes) -> None:
        if 0 <= index < len(self.hashes) and index not in self.chunks and hashlib.sha256(data).hexdigest() == self.hashes[index]:
            self.chunks[index] = data
            self.last_progress = time.monotonic()

    def missing(self) -> list[list[int]]:
        """The ``[start, end)`` ranges still missing, as a chunk request names them."""
        ranges: list[list[int]] = []
        for index in (i for i in range(len(self.hashes)) if i not in self.chunks):
            if ranges and ranges[-1][1] == index:
                ranges[-1][1] = index + 1
            else:
                ranges.append([index, index + 1])
        return ranges[:512]

    def payload(self) -> bytes:
        data = b"".join(self.chunks[i] for i in range(len(self.hashes)))
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.artifact_id:
            raise Refused("the assembled payload does not match its signed size and sha256")
        return data


class AppClient:
    """One app-side device: follows its desired state, downloads, loads and serves the model."""

    def __init__(self, device_id: str, host: str, port: int, controller_keys: list[bytes], package_keys: list[bytes]):
        self.device_id, self.host, self.port = device_id, host, port
        self.controllers = {key_id(pem): pem for pem in controller_keys}
        self.packages = {key_id(pem): pem for pem in package_keys}
        self.last_seq = 0
        self.active: dict[str, Any] | None = None
        self.session: ort.InferenceSession | None = None
        self.download: Download | None = None
        self.deployment: dict[str, Any] | None = None  # {"id", "manifest"}
        self.lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=device_id, protocol=mqtt.MQTTv311)
        self.client.will_set(self._topic("presence"), self._json({"online": False, "ts": time.time()}), qos=1, retain=True)
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._ask_again, daemon=True)

    def start(self) -> AppClient:
        self.client.connect(self.host, self.port)
        self.client.loop_start()
        self.worker.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.client.publish(self._topic("presence"), self._json({"online": False, "ts": time.time()}), qos=1, retain=True)
        self.client.loop_stop()
        self.client.disconnect()

    def infer(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        assert self.session is not None, "no model yet"
        return list(self.session.run(None, dict(feeds)))

    # -- MQTT -------------------------------------------------------------------------------------

    def _topic(self, leaf: str) -> str:
        return f"edge/v1/devices/{self.device_id}/{leaf}"

    def _json(self, body: dict[str, Any]) -> bytes:
        return json.dumps({"schema": 1, "device_id": self.device_id, **body}).encode()

    def _on_connect(self, client: mqtt.Client, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        now = time.time()
        client.publish(self._topic("birth"), self._json({"ts": now, "agent_version": "app-reference-1", "target": "nnapi",
                                                         "runtimes": {"onnxruntime": ort.__version__}}), qos=1, retain=True)
        client.publish(self._topic("presence"), self._json({"online": True, "ts": now}), qos=1, retain=True)
        self._publish_state()
        client.subscribe(self._topic("desired"), qos=1)

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        # An app hands these to a worker thread; the reference client keeps it short instead.
        try:
            if message.topic == self._topic("desired"):
                self._desired(json.loads(message.payload))
            elif message.topic.startswith("edge/v1/artifacts/"):
                self._chunk(message.topic, bytes(message.payload))
        except (Refused, ValueError, KeyError, TypeError) as exc:
            deployment = self.deployment["id"] if self.deployment else ""
            self._event(deployment, "verify", "rejected" if not deployment else "failed", str(exc))
            self.deployment, self.download = None, None

    def _desired(self, envelope: dict[str, Any]) -> None:
        desired = open_envelope(envelope, DESIRED_TYPE, self.controllers)
        if desired.get("schema") != 1 or desired.get("type") != "desired" or desired.get("device_id") != self.device_id:
            raise Refused("a desired state for another device, type or schema")
        if int(desired["seq"]) <= self.last_seq:
            return  # a retained one already handled: ignore it silently
        if float(desired["expires_at"]) < time.time():
            raise Refused("the desired state expired")
        self.last_seq = int(desired["seq"])
        if desired.get("model") is None:
            return
        manifest = open_envelope(desired["model"]["manifest"], MANIFEST_TYPE, self.packages)
        if float(manifest["expires_at"]) < time.time():
            raise Refused("the manifest expired")
        payload = manifest["payload"]
        with self.lock:
            self.deployment = {"id": desired["deployment_id"], "manifest": manifest}
            self.download = Download(payload["sha256"], int(payload["size"]), int(payload["chunk_size"]), list(payload["chunks"]))
        self._event(desired["deployment_id"], "download", "running", f"{len(payload['chunks'])} chunks")
        self.client.subscribe(f"edge/v1/artifacts/{payload['sha256']}/chunks/+", qos=1)
        self._request(repeat=False)

    def _request(self, repeat: bool) -> None:
        download = self.download
        if download is not None:
            body = {"artifact_id": download.artifact_id, "ranges": download.missing(), "repeat": repeat}
            self.client.publish(self._topic("chunk-requests"), self._json(body), qos=1)

    def _ask_again(self) -> None:
        """Ask again for the chunks still missing after a quiet interval (lost, or sent before we subscribed)."""
        while not self.stopping.wait(0.5):
            download = self.download
            if download is not None and time.monotonic() - download.last_progress > REQUEST_INTERVAL_S:
                download.last_progress = time.monotonic()
                self._request(repeat=True)

    def _chunk(self, topic: str, data: bytes) -> None:
        artifact, index = topic.split("/")[3], topic.split("/")[5]  # edge/v1/artifacts/<id>/chunks/<n>
        with self.lock:
            download, deployment = self.download, self.deployment
            if download is None or deployment is None or artifact != download.artifact_id:
                return
            download.accept(int(index), data)
            if len(download.chunks) < len(download.hashes):
                return
            self.download = None
        self.client.unsubscribe(f"edge/v1/artifacts/{artifact}/chunks/+")
        self._install(deployment, download.payload())

    def _install(self, deployment: dict[str, Any], payload: bytes) -> None:
        manifest = deployment["manifest"]
        files = {entry["path"]: entry for entry in manifest["files"]}
        # The reduced (ORT-format only) onnxruntime build of an app takes the "ort" file; a full build either one.
        path = next((p for p, e in files.items() if e["role"] == "ort"), manifest["model"])
        with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
            member = tar.extractfile(path)
            if member is None:
                raise Refused(f"{path} is not a file in the payload")
            model = member.read()
        if hashlib.sha256(model).hexdigest() != files[path]["sha256"]:
            raise Refused(f"{path} does not match its signed sha256")
        self._event(deployment["id"], "stage", "running", f"loading {path}")
        self.session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        self.active = {"name": manifest["name"], "version": manifest["version"], "artifact_id": manifest["payload"]["sha256"],
                       "backend": "onnxruntime/CPUExecutionProvider", "slot": "a"}
        self.deployment = None
        self._publish_state()
        self._event(deployment["id"], "done", "ok", f"serving {manifest['name']} v{manifest['version']} from {path}")

    def _event(self, deployment_id: str, state: str, status: str, detail: str) -> None:
        body = {"deployment_id": deployment_id, "state": state, "status": status, "detail": detail[:500],
                "ts": time.time(), "data": {}}
        self.client.publish(self._topic("events"), self._json(body), qos=1)

    def _publish_state(self) -> None:
        body = {"ts": time.time(), "active": self.active, "deployment": None, "last_seq": self.last_seq}
        self.client.publish(self._topic("state"), self._json(body), qos=1, retain=True)
