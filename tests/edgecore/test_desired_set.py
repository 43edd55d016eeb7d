"""Desired-state schema 2 (a set of models and pipelines under one sequence number), its negotiation in the birth,
the reports that name every model, and pipeline manifests: read strictly, one-line errors naming the field."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgecore import __version__
from edgecore.errors import ProtocolError, VerificationError
from edgecore.protocol.envelope import DESIRED_TYPE, MANIFEST_TYPE, TrustedKeys, sign
from edgecore.protocol.intake import Intake
from edgecore.protocol.ledger import Ledger
from edgecore.protocol.manifest import FileEntry, Manifest, PayloadInfo, TargetInfo, TensorSignature
from edgecore.protocol.messages import DeployOptions, DesiredModel, DesiredSet, DesiredState, read_desired
from edgecore.protocol.pipeline import PipelineSpec, PipelineStep, run_steps
from edgecore.protocol.reports import Birth, DeviceEvent, DeviceState, RunningModel, read_report

SHA = "ab" * 32


def tensor(name: str) -> TensorSignature:
    return TensorSignature(name, "float32", (1, 4))


def model_manifest(name: str, version: int = 1, inputs: tuple[str, ...] = ("x",), outputs: tuple[str, ...] = ("y",)) -> Manifest:
    return Manifest(name=name, version=version, created_at=1.0, expires_at=time.time() + 3600,
                    min_agent_version=__version__, target=TargetInfo("any"), payload=PayloadInfo(10, SHA, 1024, (SHA,)),
                    files=(FileEntry("model.onnx", 10, SHA, "model"),), model="model.onnx",
                    inputs=tuple(map(tensor, inputs)), outputs=tuple(map(tensor, outputs)))


STEPS = PipelineSpec((
    PipelineStep("detect", "det", None, (("x", "image"),), (("y", "boxes"),)),
    PipelineStep("crop", None, "crop.onnx", (("image", "image"), ("boxes", "boxes")), (("patch", "patch"),)),
    PipelineStep("classify", "cls", None, (("x", "patch"),), (("y", "scores"),)),
))


def pipeline_manifest(name: str = "p", spec: PipelineSpec = STEPS, version: int = 1) -> Manifest:
    return dataclasses.replace(model_manifest(name, version, ("image",), ("scores",)), model="", kind="pipeline",
                               pipeline=spec, files=(FileEntry("crop.onnx", 10, SHA, "graph"),))


class Controller:
    def __init__(self) -> None:
        self.key, self.package_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
        self.keys = {"controller": TrustedKeys([self.key.public_key()]),
                     "package": TrustedKeys([self.package_key.public_key()])}

    def entry(self, manifest: Manifest, deployment_id: str = "d-m", options: DeployOptions = DeployOptions()) -> DesiredModel:
        return DesiredModel(manifest.name, manifest.version, sign(MANIFEST_TYPE, manifest.to_bytes(), self.package_key),
                            (), deployment_id, options)

    def signed(self, message: DesiredSet | DesiredState) -> bytes:
        return sign(DESIRED_TYPE, message.to_payload(), self.key).to_bytes()

    def set(self, seq: int, models: tuple[DesiredModel, ...], pipelines: tuple[DesiredModel, ...] = ()) -> bytes:
        now = time.time()
        return self.signed(DesiredSet("cam-1", seq, now, now + 60, "d-set", models, pipelines))


def payload(**changes: Any) -> bytes:
    controller = Controller()
    base = json.loads(DesiredSet("cam-1", 5, 1.0, 2.0, "d-set", (controller.entry(model_manifest("det")),)).to_payload())
    for key, value in changes.items():
        if key.startswith("model_"):
            base["models"][0][key.removeprefix("model_")] = value
        else:
            base[key] = value
    return json.dumps(base).encode()


# -- the message ---------------------------------------------------------------------------------------------


def test_a_set_reads_back_as_written_with_its_schema_number() -> None:
    controller = Controller()
    shadowed = DeployOptions(allow_downgrade=True, shadow_min=0.95)
    desired = DesiredSet("cam-1", 9, 1.0, 2.0, "d-set",
                         (controller.entry(model_manifest("det"), "d-det", shadowed), controller.entry(model_manifest("cls"))),
                         (controller.entry(pipeline_manifest(), "d-p"),))
    raw = desired.to_payload()
    assert json.loads(raw)["schema"] == 2
    assert read_desired(raw) == desired == DesiredSet.from_payload(raw)
    assert desired.entry("det") is not None and desired.entry("det").options == shadowed  # type: ignore[union-attr]
    assert desired.entry("p") is desired.pipelines[0] and desired.entry("nope") is None


def test_schema_1_is_read_as_before_and_means_the_set_of_its_model() -> None:
    controller = Controller()
    model = DesiredModel("det", 1, controller.entry(model_manifest("det")).manifest)
    old = DesiredState("cam-1", 3, 1.0, 2.0, "d-old", model, {"allow_downgrade": True, "shadow": {"min_agreement": 0.5}})
    read = read_desired(old.to_payload())
    assert read == old
    assert isinstance(read, DesiredState)
    one = read.as_set()
    assert one is not None and one.seq == 3 and one.deployment_id == "d-old" and one.pipelines == ()
    assert one.models == (dataclasses.replace(model, deployment_id="d-old", options=DeployOptions(True, 0.5)),)
    assert dataclasses.replace(old, model=None).as_set() is None  # model null: keep what you have
    with pytest.raises(ProtocolError, match=r"desired: model\.name"):
        dataclasses.replace(old, model=dataclasses.replace(model, name="two words")).as_set()


def test_an_agent_of_schema_1_only_refuses_a_set_naming_the_schema() -> None:
    with pytest.raises(ProtocolError, match=r"unsupported schema version 2 \(this agent speaks 1\)"):
        DesiredState.from_payload(payload())
    with pytest.raises(ProtocolError, match=r"unsupported schema version 3 \(this agent speaks 1, 2\)"):
        read_desired(payload(schema=3))


@pytest.mark.parametrize("changes, message", [
    ({"models": "det"}, "desired.models: expected list"),
    ({"models": None}, "desired: missing field 'models'"),
    ({"model_name": "../etc"}, r"invalid desired.models\[0\].name '../etc'"),
    ({"model_version": 0}, r"desired.models\[0\].version: 0 is outside"),
    ({"model_deployment_id": None}, r"desired.models\[0\]: missing field 'deployment_id'"),
    ({"model_options": {"shadow": {"min_agreement": 2}}}, r"desired.models\[0\].options.shadow must be"),
    ({"model_options": {"allow_downgrade": "yes"}}, r"desired.models\[0\].options.allow_downgrade: expected bool"),
    ({"model_urls": ["ftp://x"]}, r"desired.models\[0\].urls: each entry must be"),
    ({"pipelines": "p"}, "desired.pipelines: expected list"),
    ({"models": [{}] * 65}, "desired.models: more than 64 entries"),
])
def test_a_malformed_set_is_refused_in_one_line_naming_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as caught:
        read_desired(payload(**changes))
    assert "\n" not in str(caught.value)


def test_models_and_pipelines_share_one_name_space() -> None:
    controller = Controller()
    twice = DesiredSet("cam-1", 5, 1.0, 2.0, "d", (controller.entry(model_manifest("det")),),
                       (controller.entry(pipeline_manifest("det")),))
    with pytest.raises(ProtocolError, match="det named twice"):
        read_desired(twice.to_payload())


# -- the device's checks ----------------------------------------------------------------------------------------


def test_a_set_passes_every_check_with_its_manifests_verified(tmp_path: Path) -> None:
    controller, ledger = Controller(), Ledger(tmp_path)
    intake = Intake("cam-1", ledger, controller.keys.__getitem__)
    raw = controller.set(5, (controller.entry(model_manifest("det")), controller.entry(model_manifest("cls"))),
                         (controller.entry(pipeline_manifest()),))
    order = intake.desired_set(raw, retained=False)
    assert order is not None and ledger.last_seq == 0  # the caller keeps the work, then moves the sequence on
    assert [v.manifest.name for v in order.entries] == ["det", "cls", "p"]
    assert order.pipelines[0].manifest.pipeline == STEPS
    ledger.accept_seq(5)
    assert intake.desired_set(raw, retained=True) is None


def test_a_schema_1_desired_state_reaches_a_set_speaker_as_the_set_of_its_model(tmp_path: Path) -> None:
    controller, ledger = Controller(), Ledger(tmp_path)
    intake = Intake("cam-1", ledger, controller.keys.__getitem__)
    now = time.time()
    entry = controller.entry(model_manifest("det"))
    order = intake.desired_set(controller.signed(DesiredState("cam-1", 4, now, now + 60, "d-old",
                                                              DesiredModel("det", 1, entry.manifest))), retained=False)
    assert order is not None and [v.entry.deployment_id for v in order.models] == ["d-old"]
    assert intake.desired_set(controller.signed(DesiredState("cam-1", 6, now, now + 60, "d-keep", None)), False) is None
    assert ledger.last_seq == 6  # nothing asked: the sequence moves on at once


@pytest.mark.parametrize("how, match", [
    ("a manifest naming another version", "names det v2 but its signed manifest is det v1"),
    ("a pipeline listed among the models", "lists p among the models but its manifest is a pipeline"),
    ("a model listed among the pipelines", "lists det among the pipelines but its manifest is a model"),
    ("a step running a model not in the set", "step 'classify' runs model 'cls', which the set does not name"),
    ("a step feeding other inputs", "step 'detect' feeds x but det v1 takes a, b"),
    ("a step reading an output the model lacks", "step 'classify' reads output.s. y that cls v1 does not have"),
    ("a manifest signed by another key", "signed only by untrusted key"),
])
def test_a_set_is_refused_whole_and_for_good(tmp_path: Path, how: str, match: str) -> None:
    controller, ledger = Controller(), Ledger(tmp_path)
    det, cls, pipe = model_manifest("det"), model_manifest("cls"), pipeline_manifest()
    models, pipelines = [controller.entry(det), controller.entry(cls)], [controller.entry(pipe)]
    if how == "a manifest naming another version":
        models[0] = dataclasses.replace(models[0], version=2)
    elif how == "a pipeline listed among the models":
        models.append(controller.entry(pipe))
        pipelines = []
    elif how == "a model listed among the pipelines":
        pipelines = [controller.entry(det)]
        models = [controller.entry(cls)]
    elif how == "a step running a model not in the set":
        models = models[:1]
    elif how == "a step feeding other inputs":
        models[0] = controller.entry(model_manifest("det", inputs=("a", "b")))
    elif how == "a step reading an output the model lacks":
        models[1] = controller.entry(model_manifest("cls", outputs=("z",)))
    else:
        other = Ed25519PrivateKey.generate()
        models[0] = dataclasses.replace(models[0], manifest=sign(MANIFEST_TYPE, det.to_bytes(), other))
    with pytest.raises((ProtocolError, VerificationError), match=match):
        intake = Intake("cam-1", ledger, controller.keys.__getitem__)
        intake.desired_set(controller.set(7, tuple(models), tuple(pipelines)), False)
    assert ledger.last_seq == 7  # refused for good: its replay is refused as a replay


# -- pipeline manifests -------------------------------------------------------------------------------------------


def test_a_pipeline_manifest_reads_back_and_a_model_manifest_is_unchanged() -> None:
    pipe = pipeline_manifest()
    assert Manifest.from_bytes(pipe.to_bytes()) == pipe and pipe.is_pipeline and STEPS.models == ("det", "cls")
    raw = json.loads(model_manifest("det").to_bytes())
    assert "kind" not in raw and "pipeline" not in raw  # older readers see the same keys as before pipelines
    assert Manifest.from_bytes(model_manifest("det").to_bytes()).kind == "model"


def _pipeline_json(**changes: Any) -> bytes:
    data = json.loads(pipeline_manifest().to_bytes())
    data.update(changes)
    return json.dumps(data).encode()


def _steps(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"steps": list(steps)}


DETECT = {"name": "detect", "model": "det", "inputs": {"x": "image"}, "outputs": {"y": "scores"}}


@pytest.mark.parametrize("changes, message", [
    ({"kind": "script"}, "manifest.kind: 'script' is not one of model, pipeline"),
    ({"model": "model.onnx"}, "a pipeline names its models in its steps"),
    ({"pipeline": None}, "manifest: missing field 'pipeline'"),
    ({"pipeline": _steps()}, "a pipeline needs at least one step"),
    ({"pipeline": _steps({**DETECT, "graph": "crop.onnx"})}, "give exactly one of 'model'"),
    ({"pipeline": _steps({**DETECT, "inputs": {}})}, "'inputs' and 'outputs' must each map"),
    ({"pipeline": _steps({**DETECT, "inputs": {"x": "nothing"}})}, "reads 'nothing', which no earlier step makes"),
    ({"pipeline": _steps({**DETECT, "outputs": {"y": "image"}})}, "makes 'image' again"),
    ({"pipeline": _steps({**DETECT, "outputs": {"y": "other"}})}, "no step makes the pipeline output.s. scores"),
    ({"pipeline": _steps(DETECT, DETECT)}, "step names must be unique"),
    ({"pipeline": _steps({**DETECT, "model": None, "graph": "missing.onnx"})}, "graph 'missing.onnx' is not among the files"),
    ({"pipeline": _steps({**DETECT, "model": None, "graph": "../x.onnx"})}, "unsafe path"),
    ({"pipeline": _steps({**DETECT, "name": "a b"})}, r"invalid manifest.pipeline.steps\[0\].name"),
])
def test_a_malformed_pipeline_manifest_is_refused_naming_the_problem(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        Manifest.from_bytes(_pipeline_json(**changes))


def test_a_model_manifest_has_no_steps() -> None:
    data = json.loads(model_manifest("det").to_bytes())
    with pytest.raises(ProtocolError, match="only a manifest of kind 'pipeline' has steps"):
        Manifest.from_bytes(json.dumps({**data, "pipeline": _steps(DETECT)}).encode())


def test_run_steps_feeds_each_step_its_mapped_tensors_in_order() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def run(step: PipelineStep, feeds: dict[str, Any]) -> dict[str, Any]:
        seen.append((step.name, feeds))
        total = sum(np.asarray(v) for v in feeds.values())
        return {"y": total + 1} if step.model else {"patch": total * 10}

    out = run_steps(STEPS, {"image": np.array(1.0)}, run, ("scores",))
    # detect: 1 -> 2; crop: image 1 + boxes 2 = 3 -> 30; classify: 30 -> 31
    assert float(out["scores"]) == 31.0 and [name for name, _ in seen] == ["detect", "crop", "classify"]
    assert sorted(seen[1][1]) == ["boxes", "image"]
    with pytest.raises(KeyError, match="step 'detect' gave no output 'y'"):
        run_steps(STEPS, {"image": 1.0}, lambda step, feeds: {}, ("scores",))


# -- reports ------------------------------------------------------------------------------------------------------


def test_the_birth_says_which_desired_schemas_the_agent_speaks() -> None:
    new = Birth("cam-1", desired_schemas=(1, 2))
    assert read_report("edge/v1/devices/cam-1/birth", new.to_payload()) == new and new.speaks(2)
    old = json.loads(new.to_payload())
    del old["desired_schemas"]
    assert not Birth.from_json(old).speaks(2) and Birth.from_json(old).desired_schemas == (1,)  # absent: schema 1 only
    with pytest.raises(ProtocolError, match=r"birth\.desired_schemas: expected a list of schema numbers"):
        Birth.from_json({**old, "desired_schemas": ["2"]})


def test_the_state_lists_every_model_and_reads_an_older_agent_as_the_set_of_its_active_model() -> None:
    det = RunningModel("det", 3, "a" * 64, "onnxruntime/CPUExecutionProvider", "b", "model", "d-det", 41.5,
                       {"onnxruntime/CPUExecutionProvider": 41.5})
    pipe = RunningModel("p", 1, kind="pipeline", backend="pipeline", models=("det", "cls"))
    state = DeviceState.of_set("cam-1", 1.0, (det, pipe), None, 9, 2048.0)
    assert state.active is None  # two things served: no single "active" model for older readers
    assert read_report("edge/v1/devices/cam-1/state", state.to_payload()) == state
    assert DeviceState.of_set("cam-1", 1.0, (det,), None, 9, None).active == det
    old = {"device_id": "cam-1", "active": {"name": "det", "version": 3}, "last_seq": 2}
    assert DeviceState.from_json(old).models == (RunningModel("det", 3),)
    assert DeviceState.from_json({**old, "active": None}).models == ()
    with pytest.raises(ProtocolError, match=r"state.models\[0\].kind: 'script' is not model or pipeline"):
        DeviceState.from_json({**old, "models": [{"name": "x", "version": 1, "kind": "script"}]})


def test_an_event_names_the_model_it_is_about() -> None:
    event = DeviceEvent("cam-1", "d-det", "health", "running", "", 1.0, {}, "det")
    assert read_report("edge/v1/devices/cam-1/events", event.to_payload()) == event
    older = json.loads(event.to_payload())
    del older["model"]
    assert DeviceEvent.from_payload(json.dumps(older).encode()).model is None


def test_deploy_options_read_the_same_at_both_schemas() -> None:
    assert DeployOptions.read({}, "o") == DeployOptions()
    assert DeployOptions.read(DeployOptions(True, 0.25).to_json(), "o") == DeployOptions(True, 0.25)
