"""Hardware probe and candidate lists on device trees built in the test (the root-dir seam)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.catalog import absent_backends, candidate_backends
from agent.hardware import probe_hardware

X86_CPUINFO = "".join(
    f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6430\n"
    "flags\t\t: fpu sse2 lm avx avx2 avx512f avx512_vnni amx_tile amx_int8\n\n"
    for i in range(4)
)
ARM_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 62.50\nFeatures\t: fp asimd evtstrm aes asimdhp asimddp\n"
    "CPU implementer\t: 0x41\nCPU part\t: 0xd42\n\n"
    for i in range(8)
)
ALL_ORT = [
    "TensorrtExecutionProvider",
    "CUDAExecutionProvider",
    "OpenVINOExecutionProvider",
    "NnapiExecutionProvider",
    "QNNExecutionProvider",
    "XnnpackExecutionProvider",
    "CPUExecutionProvider",
]


def write(root: Path, rel: str, content: str | bytes) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())


def plain_x86(root: Path) -> Path:
    write(root, "proc/cpuinfo", X86_CPUINFO)
    write(root, "proc/meminfo", "MemTotal:       16318460 kB\nMemFree:  100 kB\n")
    write(root, "sys/class/thermal/thermal_zone0/type", "x86_pkg_temp\n")
    write(root, "sys/class/thermal/thermal_zone0/temp", "47000\n")
    write(root, "sys/class/thermal/thermal_zone1/type", "acpitz\n")
    write(root, "sys/class/thermal/thermal_zone1/temp", "")  # a sensor that reads nothing
    return root


def jetson(root: Path) -> Path:
    write(root, "proc/cpuinfo", ARM_CPUINFO)
    write(root, "proc/meminfo", "MemTotal:       31998772 kB\n")
    write(root, "etc/nv_tegra_release",
          "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n")
    write(root, "proc/device-tree/model", b"NVIDIA Jetson AGX Orin Developer Kit\x00")
    write(
        root,
        "usr/include/aarch64-linux-gnu/NvInferVersion.h",
        "#define NV_TENSORRT_MAJOR 8\n#define NV_TENSORRT_MINOR 5\n#define NV_TENSORRT_PATCH 2\n",
    )
    write(root, "usr/local/cuda/version.json", '{"cuda": {"name": "CUDA SDK", "version": "11.4.19"}}')
    write(root, "sys/class/thermal/thermal_zone0/type", "CPU-therm\n")
    write(root, "sys/class/thermal/thermal_zone0/temp", "39500\n")
    return root


def movidius(root: Path) -> Path:
    plain_x86(root)
    write(root, "sys/bus/usb/devices/1-1/idVendor", "03e7\n")
    write(root, "sys/bus/usb/devices/1-1/idProduct", "2485\n")
    write(root, "sys/bus/usb/devices/1-2/idVendor", "046d\n")  # a keyboard
    write(root, "sys/bus/usb/devices/1-2/idProduct", "c31c\n")
    return root


def nnapi_phone(root: Path) -> Path:
    write(root, "proc/cpuinfo", ARM_CPUINFO)
    write(root, "proc/meminfo", "MemTotal:       7812000 kB\n")
    write(root, "system/build.prop", "# build\nro.build.version.sdk=33\nro.build.version.release=13\nro.product.model=Pixel 7\n")
    write(root, "vendor/build.prop", "ro.soc.manufacturer=QTI\nro.soc.model=SM8550\nro.board.platform=kalama\n")
    return root


def intel_npu(root: Path) -> Path:
    plain_x86(root)
    write(root, "dev/accel/accel0", "")
    write(root, "sys/class/accel/accel0/device/vendor", "0x8086\n")
    return root


def test_plain_x86_cpu_memory_thermal(tmp_path: Path) -> None:
    hw = probe_hardware(plain_x86(tmp_path))
    assert hw.cpu.model == "Intel(R) Xeon(R) Gold 6430"
    assert hw.cpu.arch == "x86_64" and hw.cpu.cores == 4
    assert set(hw.cpu.features) == {"avx2", "avx512f", "avx512_vnni", "amx"}
    assert hw.memory_bytes == 16318460 * 1024
    assert hw.accelerators == ()
    assert [(z.type, z.celsius) for z in hw.thermal] == [("x86_pkg_temp", 47.0)]
    assert hw.os == "linux"


def test_jetson_versions(tmp_path: Path) -> None:
    hw = probe_hardware(jetson(tmp_path))
    acc = hw.accelerator("jetson")
    assert acc is not None and acc.name == "NVIDIA Jetson AGX Orin Developer Kit"
    assert acc.details == {"l4t": "35.4.1", "jetpack": "5.1.2", "tensorrt": "8.5.2", "cuda": "11.4.19"}
    assert hw.cpu.arch == "aarch64" and {"neon", "dotprod", "fp16"} <= set(hw.cpu.features)
    assert hw.cpu.vendor == "ARM" and hw.cpu.model == "NVIDIA Jetson AGX Orin Developer Kit"


def test_movidius_only_vendor_03e7(tmp_path: Path) -> None:
    hw = probe_hardware(movidius(tmp_path))
    assert [(a.kind, a.name) for a in hw.accelerators] == [("movidius", "Myriad X (not booted)")]


def test_nnapi_phone_with_qualcomm_soc(tmp_path: Path) -> None:
    hw = probe_hardware(nnapi_phone(tmp_path))
    assert hw.os == "android"
    nnapi = hw.accelerator("nnapi")
    assert nnapi is not None and nnapi.details == {"sdk": "33", "android": "13"} and nnapi.name == "Pixel 7"
    qualcomm = hw.accelerator("qualcomm")
    assert qualcomm is not None and qualcomm.name == "SM8550"


def test_old_android_has_no_nnapi(tmp_path: Path) -> None:
    write(tmp_path, "getprop.txt", "[ro.build.version.sdk]: [26]\n[ro.product.model]: [Old]\n")
    hw = probe_hardware(tmp_path)
    assert hw.os == "android" and not hw.has("nnapi")


def test_intel_npu_from_dev_accel(tmp_path: Path) -> None:
    hw = probe_hardware(intel_npu(tmp_path))
    assert [a.kind for a in hw.accelerators] == ["intel-npu"]


def test_empty_root_probes_without_failing(tmp_path: Path) -> None:
    hw = probe_hardware(tmp_path)
    assert hw.cpu.model == "unknown" and hw.accelerators == () and hw.memory_bytes == 0


def test_fingerprint_ignores_temperature_but_not_accelerators(tmp_path: Path) -> None:
    first = probe_hardware(movidius(tmp_path)).fingerprint()
    write(tmp_path, "sys/class/thermal/thermal_zone0/temp", "81000\n")
    assert probe_hardware(tmp_path).fingerprint() == first
    (tmp_path / "sys/bus/usb/devices/1-1/idVendor").unlink()
    assert probe_hardware(tmp_path).fingerprint() != first


def test_summary_is_short_and_json_ready(tmp_path: Path) -> None:
    summary = probe_hardware(jetson(tmp_path)).summary()
    assert summary["accelerators"] == ["jetson:NVIDIA Jetson AGX Orin Developer Kit"]
    json.dumps(summary)
    json.dumps(probe_hardware(jetson(tmp_path)).to_dict())


@pytest.mark.parametrize(
    ("build", "ort", "ov", "allowed", "expected"),
    [
        (plain_x86, ["AzureExecutionProvider", "CPUExecutionProvider"], ["CPU"], None,
         ["onnxruntime/CPUExecutionProvider", "openvino/CPU"]),
        (plain_x86, ALL_ORT, ["CPU"], ["CPUExecutionProvider"], ["onnxruntime/CPUExecutionProvider"]),
        (jetson, ALL_ORT, [], None,
         ["onnxruntime/TensorrtExecutionProvider", "onnxruntime/CUDAExecutionProvider",
          "onnxruntime/OpenVINOExecutionProvider", "onnxruntime/XnnpackExecutionProvider",
          "onnxruntime/CPUExecutionProvider"]),
        (jetson, ALL_ORT, [], ["TensorrtExecutionProvider", "CUDAExecutionProvider"],
         ["onnxruntime/TensorrtExecutionProvider", "onnxruntime/CUDAExecutionProvider"]),
        (jetson, ["CPUExecutionProvider"], [], None, ["onnxruntime/CPUExecutionProvider"]),
        (movidius, ALL_ORT, ["CPU", "MYRIAD"], ["OpenVINOExecutionProvider"],
         ["onnxruntime/OpenVINOExecutionProvider", "onnxruntime/OpenVINOExecutionProvider",
          "openvino/MYRIAD", "openvino/CPU"]),
        (movidius, ["CPUExecutionProvider"], ["CPU"], None, ["onnxruntime/CPUExecutionProvider", "openvino/CPU"]),
        (nnapi_phone, ALL_ORT, [], None,
         ["onnxruntime/NnapiExecutionProvider", "onnxruntime/QNNExecutionProvider",
          "onnxruntime/XnnpackExecutionProvider", "onnxruntime/CPUExecutionProvider"]),
        (intel_npu, ALL_ORT, ["CPU", "NPU"], ["openvino"], ["openvino/NPU", "openvino/CPU"]),
    ],
)
def test_candidate_lists(tmp_path: Path, build: Callable[[Path], Path], ort: list[str], ov: list[str],
                         allowed: list[str] | None, expected: list[str]) -> None:
    hw = probe_hardware(build(tmp_path))
    found = candidate_backends(hw, allowed, offered={"onnxruntime": ort, "openvino": ov})
    assert [c.name for c in found] == expected


def test_movidius_candidates_carry_device_options(tmp_path: Path) -> None:
    hw = probe_hardware(movidius(tmp_path))
    found = candidate_backends(hw, ["OpenVINOExecutionProvider"], offered={"onnxruntime": ALL_ORT, "openvino": ["MYRIAD"]})
    assert [c.options for c in found if c.backend == "onnxruntime"] == [{"device_type": "MYRIAD"}, {"device_type": "CPU"}]


def test_probe_cli_json_on_a_jetson_tree(tmp_path: Path) -> None:
    root = jetson(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "probe", "--root", str(root), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["hardware"]["accelerators"][0]["details"]["jetpack"] == "5.1.2"
    # This machine's onnxruntime build has no TensorRT: the Jetson tree gets the CPU provider only.
    assert "onnxruntime/CPUExecutionProvider" in report["backends"]
    assert "onnxruntime/TensorrtExecutionProvider" not in report["backends"]


COREML = "CoreMLExecutionProvider"
M2_SYSCTL = (
    "machdep.cpu.brand_string: Apple M2\nhw.ncpu: 8\nhw.memsize: 17179869184\nhw.optional.arm64: 1\n"
    "hw.optional.neon: 1\nhw.optional.arm.FEAT_DotProd: 1\nhw.optional.arm.FEAT_FP16: 1\nhw.optional.arm.FEAT_I8MM: 0\n"
    "kern.ostype: Darwin\n"
)


def macos(root: Path, sysctl: str = M2_SYSCTL) -> Path:
    """A Mac as a tree: SystemVersion.plist says macOS, a `sysctl -a` dump says which chip."""
    import plistlib

    plist = {"ProductName": "macOS", "ProductVersion": "14.4.1", "ProductBuildVersion": "23E224"}
    write(root, "System/Library/CoreServices/SystemVersion.plist", plistlib.dumps(plist))
    write(root, "sysctl.txt", sysctl)
    return root


def test_apple_silicon_mac_from_plist_and_sysctl(tmp_path: Path) -> None:
    hw = probe_hardware(macos(tmp_path))
    assert hw.os == "macos"
    assert (hw.cpu.model, hw.cpu.vendor, hw.cpu.arch, hw.cpu.cores) == ("Apple M2", "Apple", "aarch64", 8)
    assert hw.cpu.features == ("dotprod", "fp16", "neon")
    assert hw.memory_bytes == 16 * 2**30
    acc = hw.accelerator("apple-silicon")
    assert acc is not None and acc.name == "Apple M2" and acc.details == {"macos": "14.4.1", "build": "23E224"}


def test_intel_mac_and_linux_trees_have_no_apple_silicon(tmp_path: Path) -> None:
    intel = macos(tmp_path / "intel", "machdep.cpu.brand_string: Intel(R) Core(TM) i7-8569U CPU @ 2.80GHz\nhw.ncpu: 8\n"
                                      "hw.optional.avx2_0: 1\nhw.optional.arm64: 0\n")
    hw = probe_hardware(intel)
    assert hw.os == "macos" and hw.accelerators == () and hw.cpu.arch == "x86_64" and hw.cpu.features == ("avx2",)
    linux = probe_hardware(plain_x86(tmp_path / "linux"))
    assert linux.os == "linux" and not linux.has("apple-silicon")


def test_coreml_is_a_candidate_on_apple_silicon_when_onnxruntime_offers_it(tmp_path: Path) -> None:
    hw = probe_hardware(macos(tmp_path))
    found = candidate_backends(hw, offered={"onnxruntime": [COREML, "CPUExecutionProvider"], "openvino": []})
    assert [c.name for c in found] == [f"onnxruntime/{COREML}", f"onnxruntime/{COREML}", "onnxruntime/CPUExecutionProvider"]
    assert [c.options["ModelFormat"] for c in found[:2]] == ["MLProgram", "NeuralNetwork"]
    declared = found[0].declaration()
    assert declared is not None and declared.precisions == ("fp32", "fp16")
    # A Linux-style onnxruntime build on the Mac: no CoreML, and the probe says so.
    without = candidate_backends(hw, offered={"onnxruntime": ["CPUExecutionProvider"], "openvino": []})
    assert [c.name for c in without] == ["onnxruntime/CPUExecutionProvider"]
    absent = {a.name: a.reason for a in absent_backends(hw, offered={"onnxruntime": ["CPUExecutionProvider"], "openvino": []})}
    assert absent[f"onnxruntime/{COREML}"].startswith(f"the installed onnxruntime does not offer {COREML}")


def test_linux_probe_has_no_coreml_and_says_why(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "probe", "--root", str(plain_x86(tmp_path)), "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert f"onnxruntime/{COREML}" not in report["backends"]
    absent = {a["backend"]: a["reason"] for a in report["absent"]}
    assert absent[f"onnxruntime/{COREML}"] == (
        "needs apple-silicon hardware: none found (CoreML runs on Apple silicon under macOS, "
        "in onnxruntime's macOS and iOS builds)")


def test_probe_of_a_root_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    """A mistyped --root read as an empty machine (exit 0, no accelerator) would mislead: it is refused, naming it."""
    done = subprocess.run([sys.executable, "-m", "agent.cli.main", "probe", "--root", str(tmp_path / "absent"), "--json"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 2 and "--root" in done.stderr and "does not exist" in done.stderr, done.stderr
    assert done.stdout == ""
