"""Target parsing, tags and listing (forgekit/targets/)."""

from __future__ import annotations

import json
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import forgekit
from forgekit.errors import TargetError, ToolchainError
from forgekit.targets import TAGS, parse_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, ort_run  # noqa: E402


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("llvm -mcpu=skylake -mattr=+avx2", {"kind": "llvm", "mcpu": "skylake", "mattr": ["+avx2"]}),
        # LEIP writes features without a sign; LLVM needs one.
        ("llvm -mcpu=cascadelake -mattr=avx2,+avx512f", {"kind": "llvm", "mcpu": "cascadelake",
                                                           "mattr": ["+avx2", "+avx512f"]}),
        ("cuda -arch=sm_86", {"kind": "cuda", "arch": "sm_86"}),
        ("llvm -device=arm_cpu -mtriple=aarch64-linux-gnu -mattr=+neon -mcpu=cortex-a72",
         {"kind": "llvm", "device": "arm_cpu", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"],
          "mcpu": "cortex-a72"}),
        ('{"kind": "llvm", "mcpu": "znver4", "num-cores": 2}', {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}),
        ("llvm -opt-level=3", {"kind": "llvm", "opt-level": 3}),
    ],
)
def test_legacy_and_json_strings(text: str, expected: dict) -> None:
    assert parse_target(text).target == expected


def test_dict_and_tvm_target_objects() -> None:
    import tvm

    assert parse_target({"kind": "llvm", "mcpu": "znver4"}).target == {"kind": "llvm", "mcpu": "znver4"}
    spec = parse_target(tvm.target.Target({"kind": "llvm", "mcpu": "skylake"}))
    assert spec.target["mcpu"] == "skylake"


def test_system_lib_flag_is_a_build_option() -> None:
    spec = parse_target("llvm -system-lib -mcpu=skylake")
    assert spec.system_lib and "system-lib" not in spec.target


@pytest.mark.parametrize("tag", sorted(TAGS))
def test_every_forgekit_tag_is_a_valid_tvm_target(tag: str) -> None:
    spec = parse_target(tag)
    assert spec.name == tag and spec.family == TAGS[tag][0]
    spec.tvm_target()


def test_tags_users_type() -> None:
    pi5 = parse_target("raspberry-pi/5")
    assert pi5.target["mtriple"] == "aarch64-linux-gnu" and pi5.target["mcpu"] == "cortex-a76"
    assert pi5.is_cross and pi5.arch == "aarch64"
    android = parse_target("android/cpu")
    assert android.family == "android" and "android" in android.triple
    orin = parse_target("jetson/orin")
    assert orin.kind == "cuda" and orin.host["mtriple"] == "aarch64-linux-gnu"


def test_tvm_tags_keep_their_name() -> None:
    spec = parse_target("nvidia/jetson-agx-orin-64gb")
    assert spec.name == "nvidia/jetson-agx-orin-64gb" and spec.kind == "cuda" and spec.target["arch"] == "sm_87"


def test_cuda_with_separate_host() -> None:
    spec = parse_target("cuda -arch=sm_86", host="llvm -mcpu=skylake")
    assert spec.host == {"kind": "llvm", "mcpu": "skylake"}
    assert spec.tvm_target().host is not None


def test_host_detects_this_cpu() -> None:
    spec = parse_target("host")
    assert spec.target["kind"] == "llvm" and spec.target["num-cores"] >= 1 and not spec.is_cross


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [("raspbery-pi/5", "raspberry-pi/5"), ("andriod/cpu", "android/cpu"), ("x86/znver", "x86/znver4")],
)
def test_unknown_target_lists_closest_names(text: str, suggestion: str) -> None:
    with pytest.raises(TargetError, match="Did you mean") as info:
        parse_target(text)
    assert suggestion in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [("llvm -mcpux=skylake", "Did you mean: -mcpu"), ("llvm -num-cores=two", "integer"),
     ("{not json", "JSON"), ("", "Empty target"), ('{"mcpu": "x"}', "kind")],
)
def test_malformed_targets(text: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        parse_target(text)


def test_listing_functions() -> None:
    tags = forgekit.list_target_tags()
    assert tags[: len(TAGS)] == list(TAGS) and len(tags) > 250  # forgekit's then TVM's 287
    assert "android/cpu" in forgekit.list_android_tags()
    assert all(t in forgekit.list_arm_tags() for t in ("raspberry-pi/3", "raspberry-pi/4", "raspberry-pi/5"))
    x86 = forgekit.list_x86_tags()
    assert {"x86/skylake-avx512", "x86/cascadelake", "x86/icelake", "x86/znver3", "x86/znver4", "x86/avx2"} <= set(x86)
    cuda = dict(forgekit.list_cuda_tags(verbose=True))
    assert "jetson/orin" in cuda and "cuda -arch=sm_87" in cuda["jetson/orin"]
    verbose = forgekit.list_target_tags(verbose=True)
    assert all(isinstance(row, tuple) and len(row) == 2 for row in verbose)


def test_spec_to_dict_is_json() -> None:
    json.dumps(parse_target("jetson/orin-nano").to_dict())


def test_missing_cross_toolchain_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    from forgekit.targets import get_family

    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ToolchainError, match="g\\+\\+-aarch64-linux-gnu"):
        get_family("arm").linker(parse_target("raspberry-pi/5"))


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="needs g++-aarch64-linux-gnu (./dev.sh test installs it)")
def test_aarch64_tag_produces_an_aarch64_library(convnet_path, tmp_path) -> None:
    from forgekit.artifact.layout import read_metadata

    result = forgekit.from_onnx(convnet_path, {"input": [1, 3, 16, 16]}).compile(
        target="raspberry-pi/5", output_path=tmp_path / "pi5")
    header = result.library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and header[4] == 2  # 64-bit ELF
    assert int.from_bytes(header[18:20], "little") == 183  # e_machine EM_AARCH64
    meta = read_metadata(result.path)
    assert meta["build"]["arch"] == "aarch64" and meta["build"]["toolchain"]["linker"] == "aarch64-linux-gnu-g++"


def test_host_has_every_vector_extension_the_cpu_executes(monkeypatch) -> None:
    """``host`` is LLVM's name for the CPU plus what CPUID says it runs beyond that name.  A VM reported an
    AVX512-BF16/FP16 Xeon as LLVM's ``rocketlake`` (neither), and ``--precision bf16 -t host`` was refused
    there ("host has none": test_conv1d's bf16 test failed on that machine)."""
    import tvm

    from forgekit.runtime import cpu
    from forgekit.targets.isa import isa_info

    rocketlake = _named("rocketlake")  # a CPU that executes what its name implies, and more
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "rocketlake")
    monkeypatch.setattr(cpu, "host_features", lambda: rocketlake | {"avx512bf16", "avx512fp16", "amx-tile",
                                                                     "amx-bf16", "aes"})
    spec = parse_target("host")
    assert spec.target["mcpu"] == "rocketlake"
    assert spec.target["mattr"] == ["+avx512bf16", "+avx512fp16"]  # no AMX (intrinsics only), no aes (not codegen)
    assert {"avx512bf16", "avx512fp16"} <= isa_info(spec.tvm_target()).features
    monkeypatch.setattr(cpu, "host_features", lambda: rocketlake)
    assert "mattr" not in parse_target("host").target  # the name says it all: the target is as before


def _named(mcpu: str) -> frozenset[str]:
    """The instruction-set extensions (of those the runtime checks) LLVM's name ``mcpu`` implies."""
    import tvm

    from forgekit.runtime.cpu import CODEGEN_FEATURES
    from forgekit.targets.isa import llvm_features

    return llvm_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "mtriple": "x86_64-linux-gnu"})) \
        & CODEGEN_FEATURES


@pytest.mark.parametrize(("mcpu", "masked", "lanes"), [("sapphirerapids", ("amx",), 16),
                                                        ("skylake-avx512", ("avx512",), 8)])
def test_host_leaves_out_what_its_name_implies_and_the_cpu_lacks(monkeypatch, mcpu: str, masked: tuple[str, ...],
                                                                 lanes: int) -> None:
    """A VM may keep its host's CPUID model and mask features: this session's Xeon is ``emeraldrapids`` to LLVM,
    which implies AMX, but its hypervisor leaves AMX out; every ``-t host`` artifact required amx-tile, amx-int8
    and amx-bf16, and the runtime refused to load it on the machine that had just built it.  A VM masking
    AVX-512 likewise: ``host`` is the name minus what the CPU lacks, so its code and tiles are AVX2's."""
    import tvm

    from forgekit.runtime import cpu
    from forgekit.targets.isa import isa_info, required_cpu_features

    have = frozenset(f for f in _named(mcpu) if not f.startswith(masked))
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: mcpu)
    monkeypatch.setattr(cpu, "host_features", lambda: have)
    spec = parse_target("host")
    assert spec.target["mcpu"] == mcpu
    assert spec.target["mattr"] == sorted(f"-{f}" for f in _named(mcpu) - have)
    assert set(required_cpu_features(spec.tvm_target())) <= have
    assert isa_info(spec.tvm_target()).vec_lanes == lanes
    monkeypatch.setattr(cpu, "host_features", lambda: frozenset())  # a CPU that cannot be asked: the name
    assert "mattr" not in parse_target("host").target


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86-64 CPU name")
def test_a_host_build_loads_where_its_cpu_name_implies_more(monkeypatch, tmp_path) -> None:
    """End to end on this machine: LLVM names the CPU ``graniterapids`` (AMX-FP16, AVX512-FP16, ...), which no
    machine here fully is; the host build runs here and matches onnxruntime."""
    import tvm
    from onnx import TensorProto, helper, numpy_helper

    from forgekit.runtime import Engine
    from forgekit.runtime.cpu import host_features

    if not host_features():
        pytest.skip("this CPU cannot be asked for its features")
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "c",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "graniterapids")
    result = forgekit.from_onnx(model).compile("host", output_path=str(tmp_path / "out"))
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype(np.float32)
    assert_close(Engine(result.path).infer(x), ort_run(model, {"x": x})[0])
