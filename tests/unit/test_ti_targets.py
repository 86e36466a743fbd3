"""TI Jacinto 7 / Sitara AM6x tags: their Arm cores compile a CNN and a transformer; aarch64 runs verify under qemu."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx
import pytest

import forgekit
from forgekit.targets import TAGS, parse_target
from forgekit.targets.ti import BOARDS, board

from onnx_models import attention_block, make_cnn

TI_TAGS = [b.tag for b in BOARDS]
CAN_CROSS = shutil.which("aarch64-linux-gnu-g++") is not None
CAN_EMULATE = (CAN_CROSS and os.geteuid() == 0
               and all(shutil.which(t) for t in ("debootstrap", "qemu-aarch64-static")))


def test_every_ti_board_is_a_tag_with_its_arm_cores() -> None:
    assert {"ti/tda4vm", "ti/am68pa", "ti/am68a", "ti/am69a", "ti/am62a", "ti/am67a", "ti/am62"} == set(TI_TAGS)
    cores = {t: (parse_target(t).target["mcpu"], parse_target(t).target["num-cores"]) for t in TI_TAGS}
    assert cores["ti/tda4vm"] == cores["ti/am68a"] == ("cortex-a72", 2)
    assert cores["ti/am69a"] == ("cortex-a72", 8)
    assert cores["ti/am62a"] == cores["ti/am67a"] == cores["ti/am62"] == ("cortex-a53", 4)
    for tag in TI_TAGS:
        spec = parse_target(tag)
        assert spec.family == "arm" and spec.arch == "aarch64" and TAGS[tag][0] == "arm"
        assert "+dotprod" not in spec.target["mattr"]  # ARMv8.0 cores: no sdot kernels may be chosen
    assert board("ti/am62").has_tidl is False and board("ti/am68a").tidl_soc == "am68a"
    assert board("ti/am68pa").tvm_platform == "J7" and "asymmetric_per_channel" in board("ti/tda4vm").lacks
    assert "Cortex-A53" in TAGS["ti/am62a"][1] and "C7x" in TAGS["ti/am62a"][1]
    assert board("raspberry-pi/5") is None


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    folder = tmp_path_factory.mktemp("ti_models")
    onnx.save(make_cnn(), folder / "cnn.onnx")
    onnx.save(attention_block(), folder / "attention.onnx")
    return {"cnn": (folder / "cnn.onnx", {"x": [1, 3, 16, 16]}),
            "transformer": (folder / "attention.onnx", {"x": [1, 8, 32]})}


@pytest.mark.slow
@pytest.mark.skipif(not CAN_CROSS, reason="needs g++-aarch64-linux-gnu (./dev.sh test installs it)")
@pytest.mark.parametrize("tag", TI_TAGS)
@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_ti_tag_compiles_a_cnn_and_a_transformer(tag: str, model: str, models: dict, tmp_path: Path) -> None:
    from forgekit.artifact.layout import read_metadata

    path, shapes = models[model]
    result = forgekit.from_onnx(path, shapes).compile(target=tag, output_path=tmp_path / "out")
    header = result.library.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    meta = read_metadata(result.path)
    assert meta["build"]["target_name"] == tag and meta["build"]["arch"] == "aarch64"


@pytest.mark.slow
@pytest.mark.skipif(not CAN_EMULATE, reason="needs root, debootstrap, qemu-user-static and g++-aarch64-linux-gnu")
@pytest.mark.parametrize("tag", ["ti/am68a", "ti/am62a"])  # one Cortex-A72 board, one Cortex-A53 board
@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_ti_artifact_verifies_under_qemu(tag: str, model: str, models: dict, tmp_path: Path) -> None:
    from forgekit.evaluate.verify import verify_artifact

    path, shapes = models[model]
    if model == "transformer":  # verify feeds the ONNX model's own shapes: pin the dynamic S there too
        pinned = onnx.load(path)
        dim = pinned.graph.input[0].type.tensor_type.shape.dim[1]
        dim.Clear()
        dim.dim_value = shapes["x"][1]
        path = tmp_path / "attention_s8.onnx"
        onnx.save(pinned, path)
    out = forgekit.from_onnx(path, shapes).compile(target=tag, output_path=tmp_path / "out").path
    result = verify_artifact(out, path)
    assert result.ok and result.arch == "aarch64" and result.runner != "native", result
    assert all(o.max_abs < 1e-3 for o in result.outputs)
