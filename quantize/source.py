"""The user's model: read as given (the reference for every figure), and the float model quantization starts from.

The reference is the file the user gave, untouched. The *base* model is that model with its
Constant-node weights moved to initializers, every node named and its dynamic inputs fixed: none of
that changes an output on the shapes used, and ``quantize.reference`` checks it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from edgecore.errors import ModelError, UserError
from edgecore.modelcheck import load_model_checked
from quantize.passes import lift_constants, name_nodes
from quantize.rules import is_quantized, weight_tensors
from quantize.samples import SampleSet, input_specs
from quantize.shapes import dynamic_inputs, fix_input_shapes, unloadable_with_branches
from targets.shapes import static_shape_hint

__all__ = ["UserModel", "load_user_model", "runtime_refusal", "static_base"]


@dataclass(frozen=True)
class UserModel:
    """The model as given, the base float model derived from it, and what the user's model already is."""

    path: Path
    original: onnx.ModelProto
    base: onnx.ModelProto
    quantized_ops: tuple[str, ...]  # quantization ops the author already put in (empty for a float model)


def load_user_model(path: Path, notes: list[str]) -> UserModel:
    """The user's model and its base copy; ModelError (exit 2) when onnxruntime cannot load it as given."""
    original = load_model_checked(path)
    refusal = runtime_refusal(original)
    if refusal is not None:
        import onnxruntime as ort

        raise ModelError(f"{path}: onnxruntime {ort.__version__} cannot load the model as given ({refusal}); every "
                         "figure is measured against your model, so it is not rewritten to make it load: fix the "
                         "export (check it with `edgectl inspect`) and quantize the fixed file")
    base = onnx.ModelProto()
    base.CopyFrom(original)
    lifted = lift_constants(base)
    if lifted:
        notes.append(f"{lifted} Constant nodes moved to initializers (weights exported as Constant nodes)")
    already = tuple(is_quantized(base))
    if not already and not any(t.data_type == onnx.TensorProto.FLOAT for _, t in weight_tensors(base.graph)):
        raise ModelError(f"{path}: no float32 weights to quantize (neither initializers nor Constant nodes)")
    return UserModel(path, original, name_nodes(base), already)


def runtime_refusal(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime's CPU provider refuses to load `model` (None when it loads)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph/NotImplemented types
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:240]
    return None


def static_base(model: onnx.ModelProto, asked: dict[str, list[int]], sample_dir: Path | None,
                preprocess: Path | None, notes: list[str]) -> onnx.ModelProto:
    """The model with static input shapes: --static-shape, else the first sample's, else batch 1."""
    if asked:
        model, note = fix_input_shapes(model, asked, "--static-shape")
        refused = runtime_refusal(model)
        if refused is not None:
            raise UserError(f"--static-shape {_show(asked)}: onnxruntime cannot load the model at these shapes "
                            f"({refused}); give the shapes the model was exported for")
        notes.append(note)
    dynamic = dynamic_inputs(model)
    if not dynamic:
        return model
    if sample_dir is not None:
        first = SampleSet.from_dir(sample_dir, input_specs(model), preprocess).first_shapes()
        fixed, note = fix_input_shapes(model, {s.name: first[s.name] for s in dynamic if s.name in first},
                                       f"from the first sample in {sample_dir}")
        refused = unloadable_with_branches(fixed)
        if refused is not None:  # silero-vad v5: its untaken branch cannot take the sample's fixed shape
            notes.append(f"inputs kept dynamic: with the shapes of the first sample in {sample_dir}, "
                         f"onnxruntime cannot load the model ({refused})")
            return model
        model = fixed
        notes.append(note)
        dynamic = dynamic_inputs(model)
    if all(d is not None for s in dynamic for d in s.shape[1:]):  # only the batch is dynamic: use 1
        if dynamic:
            model, note = fix_input_shapes(model, {s.name: [1, *(d or 1 for d in s.shape[1:])] for s in dynamic},
                                           "dynamic batch set to 1")
            notes.append(note)
        return model
    spec = next(s for s in dynamic if any(d is None for d in s.shape[1:]))
    raise UserError(f"input '{spec.name}' has dynamic dims {spec.describe()}: give {static_shape_hint(model)} "
                    "with numbers, or --calib DIR with samples of the shape to use")


def _show(shapes: dict[str, list[int]]) -> str:
    return " ".join(f"{n}={'x'.join(map(str, d))}" for n, d in shapes.items())
