"""Target parsing, tags and listing (forgekit/targets/)."""

from __future__ import annotations

import json
import shutil

import pytest

import forgekit
from forgekit.errors import TargetError, ToolchainError
from forgekit.targets import TAGS, parse_target


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

    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "rocketlake")
    monkeypatch.setattr(cpu, "host_features", lambda: frozenset({"avx2", "avx512f", "avx512bf16", "avx512fp16",
                                                                  "amx-tile", "amx-bf16", "aes"}))
    spec = parse_target("host")
    assert spec.target["mcpu"] == "rocketlake"
    assert spec.target["mattr"] == ["+avx512bf16", "+avx512fp16"]  # no AMX (intrinsics only), no aes (not codegen)
    assert {"avx512bf16", "avx512fp16"} <= isa_info(spec.tvm_target()).features
    monkeypatch.setattr(cpu, "host_features", lambda: frozenset({"avx2", "avx512f"}))
    assert "mattr" not in parse_target("host").target  # the name says it all: the target is as before
