"""The C runtime (runtime/: libforgekit_runtime.so, forgekit-run), built here with g++ against the wheel's TVM
runtime by forgekit.deploy.capi, run as real processes on real artifacts and compared with onnxruntime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import ort_run
from forgekit.deploy.capi import SOURCE_DIR, build_capi, build_program

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the C runtime")

TOL = 1e-5
PASSWORD = "correct horse battery"


def dynamic_model() -> onnx.ModelProto:
    """x: float32 [N, 4], ids: int64 [N] -> (2 * x, ids + 1): two inputs sharing a dynamic dim, an int64 output."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Add", ["ids", "one"], ["next"])], "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("next", TensorProto.INT64, ["N"])],
        initializer=[numpy_helper.from_array(np.array(2, np.float32), "two"),
                     numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def capi(tmp_path_factory):
    return build_capi(tmp_path_factory.mktemp("capi"))


@pytest.fixture(scope="module")
def dynamic_artifact(tmp_path_factory) -> Path:
    import forgekit

    out = tmp_path_factory.mktemp("capi_dyn") / "dyn"
    forgekit.from_onnx(dynamic_model(), {"x": ["N", 4], "ids": ["N"]}, dynamic={"N": "1..8"}).compile(
        target="host", output_path=out)
    return out


def run(capi, artifact, *inputs: Path, out: Path, env: dict[str, str] | None = None, extra=()):
    return subprocess.run([str(capi.program), str(artifact), *[a for i in inputs for a in ("-i", str(i))], "-o",
                           str(out), *extra], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def save(tmp_path: Path, name: str, array: np.ndarray) -> Path:
    np.save(tmp_path / name, array)
    return tmp_path / name


def test_forgekit_run_matches_onnxruntime(capi, convnet_compiled, convnet_path, convnet_input, tmp_path) -> None:
    done = run(capi, convnet_compiled, save(tmp_path, "in.npy", convnet_input), out=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert "probs: 2x10 float32" in done.stdout
    got = np.load(tmp_path / "out" / "probs.npy")
    expected = ort_run(onnx.load(convnet_path), {"input": convnet_input})[0]
    assert got.dtype == np.float32 and got.shape == (2, 10)
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)
    from forgekit.runtime import Engine  # the same library through the Python runtime: the same bits

    np.testing.assert_array_equal(got, Engine(convnet_compiled).infer(convnet_input)[0])


@pytest.mark.parametrize("n", [1, 3, 8])
def test_dynamic_dims_int64_and_inputs_by_name(capi, dynamic_artifact, tmp_path, n) -> None:
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    ids = np.arange(n, dtype=np.int64) * 7
    done = run(capi, dynamic_artifact, f"ids={save(tmp_path, 'ids.npy', ids)}", save(tmp_path, "x.npy", x),
               out=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    y, nxt = ort_run(dynamic_model(), {"x": x, "ids": ids})
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), y, rtol=TOL, atol=TOL)
    got = np.load(tmp_path / "out" / "next.npy")
    assert got.dtype == np.int64 and got.shape == (n,)
    np.testing.assert_array_equal(got, nxt)


def check_lines(capi, artifact, *args: str) -> tuple[int, list[list[str]]]:
    program = build_program(SOURCE_DIR / "tests" / "capi_check.c", capi)  # compiled as C99: the header is C
    done = subprocess.run([str(program), str(artifact), *args], capture_output=True, text=True, timeout=60)
    return done.returncode, [line.split(" ", 3) if line.startswith("status") else line.split()
                             for line in done.stdout.splitlines()]


def test_info_queries_and_c_api_errors(capi, convnet_compiled, dynamic_artifact) -> None:
    code, lines = check_lines(capi, convnet_compiled)
    assert code == 0
    assert lines[0] == ["model", "1", "1"]
    assert lines[1] == ["input", "0", "input", "float32", "NCHW", "shape=2,3,16,16", "names=-,-,-,-",
                        "min=2,3,16,16", "max=2,3,16,16", "step=1,1,1,1"]
    assert lines[2][:6] == ["output", "0", "probs", "float32", "-", "shape=2,10"]  # layout: 4-d tensors only
    status = {line[1]: (int(line[2]), line[3] if len(line) > 3 else "") for line in lines if line[0] == "status"}
    assert status["bad-index"] == (2, "input index 1 is out of range: the model has 1.")
    assert status["no-run"] == (2, "No outputs yet: call fk_run first.")
    assert status["not-set"][0] == 9 and "Input 'input' was not set" in status["not-set"][1]
    assert status["dtype"] == (9, "Input 'input' has dtype complex128; the model expects float32.")
    assert status["run"] == (0, "")
    assert status["reopen"] == (0, "")  # closed, then two handles of the model at once
    result = [line for line in lines if line[0] == "result"]
    # zeros in: every logit is fc_b, the softmax of each row sums to 1
    assert result == [["result", "0", "float32", "shape=2,10", "nbytes=80", "sum=2"]]

    code, lines = check_lines(capi, dynamic_artifact)
    assert code == 0
    assert lines[1] == ["input", "0", "x", "float32", "-", "shape=-1,4", "names=N,-", "min=1,4", "max=8,4",
                        "step=1,1"]
    assert lines[2] == ["input", "1", "ids", "int64", "-", "shape=-1", "names=N", "min=1", "max=8", "step=1"]
    assert ["result", "1", "int64", "shape=1", "nbytes=8", "sum=0"] in lines  # N at its smallest served size


def test_cpp_wrapper_readme_example(capi, convnet_compiled, convnet_path) -> None:
    program = build_program(SOURCE_DIR / "examples" / "minimal.cc", capi)
    done = subprocess.run([str(program), str(convnet_compiled)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    expected = ort_run(onnx.load(convnet_path), {"input": np.full((2, 3, 16, 16), 0.5, np.float32)})[0]
    assert done.stdout.startswith("input -> probs[0] = ")
    assert float(done.stdout.split("= ")[1]) == pytest.approx(float(expected[0, 0]), rel=1e-5)
    readme = (SOURCE_DIR.parent / "README.md").read_text()
    block = readme[readme.index("```cpp\n", readme.index("## C API")):]
    example = [line.split("//")[0].strip() for line in block[7:block.index("```", 7)].splitlines()]
    code = {line.split("//")[0].strip() for line in (SOURCE_DIR / "examples" / "minimal.cc").read_text().splitlines()}
    assert len(example) >= 7 and set(example) <= code  # the README shows what this test ran


def test_errors_are_one_line_with_forgekit_exit_codes(capi, convnet_compiled, dynamic_artifact, tmp_path) -> None:
    good = save(tmp_path, "good.npy", np.zeros((2, 3, 16, 16), np.float32))
    cases = [
        (run(capi, tmp_path / "missing", good, out=tmp_path / "o"), 7, "does not exist"),
        (run(capi, convnet_compiled, save(tmp_path, "b.npy", np.zeros((1, 3, 16, 16), np.float32)),
             out=tmp_path / "o"), 9,
         "Input 'input' has shape 1x3x16x16; the model expects 2x3x16x16 (dimension 0 must be 2)"),
        (run(capi, convnet_compiled, save(tmp_path, "d.npy", np.zeros((2, 3, 16, 16))), out=tmp_path / "o"), 9,
         "has dtype float64; the model expects float32"),
        (run(capi, convnet_compiled, good, good, out=tmp_path / "o"), 9, "takes 1 input(s) (input), got 2"),
        (run(capi, convnet_compiled, tmp_path / "none.npy", out=tmp_path / "o"), 9, "cannot be read"),
        (run(capi, dynamic_artifact, save(tmp_path, "x9.npy", np.zeros((9, 4), np.float32)),
             save(tmp_path, "i9.npy", np.zeros(9, np.int64)), out=tmp_path / "o"), 9, "serves N from 1 to 8"),
        (run(capi, dynamic_artifact, save(tmp_path, "x2.npy", np.zeros((2, 4), np.float32)),
             save(tmp_path, "i3.npy", np.zeros(3, np.int64)), out=tmp_path / "o"), 9,
         "Input 'ids' has N=3 but input 'x' has N=2"),
        (run(capi, convnet_compiled, good, out=tmp_path / "o", extra=["--bogus"]), 2, "unexpected argument '--bogus'"),
    ]
    for done, code, message in cases:
        assert done.returncode == code, done.stderr
        assert done.stderr.count("\n") == 1 and message in done.stderr and "forgekit-run: error: " in done.stderr
    assert not (tmp_path / "o").exists()


def test_incompatible_artifact_refused_before_loading(capi, convnet_compiled, tmp_path) -> None:
    from forgekit.runtime.cpu import CODEGEN_FEATURES, host_features

    copy = shutil.copytree(convnet_compiled, tmp_path / "a")
    meta = json.loads((copy / "metadata.json").read_text())
    meta["build"]["arch"] = "aarch64"
    (copy / "metadata.json").write_text(json.dumps(meta))
    done = run(capi, copy, tmp_path / "x.npy", out=tmp_path / "o")
    assert done.returncode == 16 and "is an aarch64 library and this machine is x86_64" in done.stderr
    # features an artifact can record (CODEGEN_FEATURES): avx512vp2intersect was on this list, and on a Xeon with
    # FP16 and AVX-VNNI the test picked it, which no artifact records and the C runtime does not check
    lacking = [f for f in ("avx512fp16", "avxvnni", "fma4", "xop", "avx512bf16")
               if f in CODEGEN_FEATURES and f not in host_features()]
    meta["build"]["arch"], meta["build"]["cpu_features"] = "x86_64", ["sse2", lacking[0]]
    (copy / "metadata.json").write_text(json.dumps(meta))
    done = run(capi, copy, tmp_path / "x.npy", out=tmp_path / "o")
    assert done.returncode == 16 and f"this CPU lacks {lacking[0]}" in done.stderr


def test_encrypted_artifact_decrypted_in_memory(capi, convnet_compiled, convnet_input, tmp_path) -> None:
    from forgekit.artifact.encryption import encrypt_artifact

    sealed = shutil.copytree(convnet_compiled, tmp_path / "sealed")
    key = encrypt_artifact(sealed, PASSWORD)
    x = save(tmp_path, "x.npy", convnet_input)
    if not capi.encryption:  # built without OpenSSL (no libssl-dev): refused in one line
        done = run(capi, sealed, x, out=tmp_path / "out", env={"FORGEKIT_ENCRYPT_PASSWORD": PASSWORD})
        assert done.returncode == 12 and "built without OpenSSL" in done.stderr
        return
    plain = run(capi, convnet_compiled, x, out=tmp_path / "plain")
    done = run(capi, sealed, x, out=tmp_path / "out", env={"MODEL_PW": PASSWORD},
               extra=["--key", str(key), "--password-env", "MODEL_PW"])
    assert plain.returncode == 0 and done.returncode == 0, done.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "probs.npy"), np.load(tmp_path / "plain" / "probs.npy"))
    default_key = run(capi, sealed, x, out=tmp_path / "out", env={"FORGEKIT_ENCRYPT_PASSWORD": PASSWORD})
    assert default_key.returncode == 0, default_key.stderr  # modelKey.bin next to the library, the default variable
    code, lines = check_lines(capi, sealed, str(key), PASSWORD)  # fk_open's key and password arguments
    assert code == 0 and ["status", "reopen", "0", ""] in [line + [""] * (4 - len(line)) for line in lines]

    env = {k: v for k, v in os.environ.items() if k != "FORGEKIT_ENCRYPT_PASSWORD"}
    no_password = subprocess.run([str(capi.program), str(sealed), "-i", str(x), "-o", str(tmp_path / "o")],
                                 capture_output=True, text=True, env=env, timeout=60)
    assert no_password.returncode == 11 and "no key provided" in no_password.stderr
    wrong = run(capi, sealed, x, out=tmp_path / "o", env={"FORGEKIT_ENCRYPT_PASSWORD": "not the password"})
    assert wrong.returncode == 11 and "Wrong password for key file" in wrong.stderr
    original = (sealed / "model_library.so").read_bytes()
    for offset, message in ((-40, "fails authentication"),  # one ciphertext bit of the last chunk
                            (30, "header checksum mismatch")):  # one bit of the header's JSON
        data = bytearray(original)
        data[offset] ^= 1
        (sealed / "model_library.so").write_bytes(bytes(data))
        tampered = run(capi, sealed, x, out=tmp_path / "o", env={"FORGEKIT_ENCRYPT_PASSWORD": PASSWORD})
        assert tampered.returncode == 11 and message in tampered.stderr, tampered.stderr
    assert not (tmp_path / "o").exists()


def test_portable_artifact_runs_its_best_level(capi, tmp_path) -> None:
    """The default target (x86-64) ships one library per level; the C runtime picks the one Engine picks, and
    FORGEKIT_LEVEL forces another, also when the levels are encrypted."""
    import forgekit
    from forgekit.artifact.encryption import encrypt_artifact
    from forgekit.runtime import Engine

    from conftest import make_two_output_model

    artifact = tmp_path / "portable"
    forgekit.from_onnx(make_two_output_model(), {"a": [2, 4], "b": [2, 4]}).compile(output_path=artifact)
    a, b = (np.random.default_rng(s).standard_normal((2, 4)).astype(np.float32) for s in (1, 2))
    inputs = (save(tmp_path, "a.npy", a), save(tmp_path, "b.npy", b))
    done = run(capi, artifact, *inputs, out=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert f"level: {Engine(artifact).level}" in done.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "prod.npy"), a * b)
    encrypt_artifact(artifact, PASSWORD)
    forced = run(capi, artifact, *inputs, out=tmp_path / "v2",
                 env={"FORGEKIT_LEVEL": "x86-64-v2", "FORGEKIT_ENCRYPT_PASSWORD": PASSWORD})
    assert forced.returncode == 0 and "level: x86-64-v2" in forced.stdout, forced.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "v2" / "sum.npy"), a + b)
    unknown = run(capi, artifact, *inputs, out=tmp_path / "o", env={"FORGEKIT_LEVEL": "v9"})
    assert unknown.returncode == 16 and "FORGEKIT_LEVEL=v9 is not a level" in unknown.stderr


def test_portable_levels_share_one_weights_file(capi, tmp_path) -> None:
    """A portable artifact whose levels keep their common weights in one file (shared_weights.py): every level
    runs from it, and a missing or foreign file is refused when the model loads (FK_ERR_ARTIFACT), one line."""
    import json

    import forgekit

    from conftest import ort_run
    from onnx_models import levels_model

    artifact = forgekit.from_onnx(levels_model()).compile(output_path=tmp_path / "shared").path
    weights = json.loads((artifact / "metadata.json").read_text())["library"]["weights"]["file"]
    xa = np.random.default_rng(3).random((1, 8, 16, 16), dtype=np.float32)
    x = save(tmp_path, "x.npy", xa)
    expected = ort_run(levels_model(), {"x": xa})[0]
    for level in ("x86-64-v3", "x86-64-v2"):
        done = run(capi, artifact, x, out=tmp_path / level, env={"FORGEKIT_LEVEL": level})
        assert done.returncode == 0 and f"level: {level}" in done.stdout, done.stderr
        (result,) = list((tmp_path / level).glob("*.npy"))
        np.testing.assert_allclose(np.load(result), expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())
    data = bytearray((artifact / weights).read_bytes())
    data[30] ^= 0xFF  # a byte of the header's digest: another build's file
    (artifact / weights).write_bytes(bytes(data))
    foreign = run(capi, artifact, x, out=tmp_path / "foreign")
    assert foreign.returncode == 7 and "does not match the sha256" in foreign.stderr, foreign.stderr
    meta = json.loads((artifact / "metadata.json").read_text())  # no recorded digest: the library's own check
    del meta["library"]["weights"]["sha256"]
    (artifact / "metadata.json").write_text(json.dumps(meta))
    foreign = run(capi, artifact, x, out=tmp_path / "foreign")
    assert foreign.returncode == 7 and "header mismatch" in foreign.stderr, foreign.stderr
    (artifact / weights).unlink()
    missing = run(capi, artifact, x, out=tmp_path / "missing")
    assert missing.returncode == 7 and "cannot open" in missing.stderr and weights in missing.stderr, missing.stderr
    assert not (tmp_path / "foreign").exists() and not (tmp_path / "missing").exists()

def test_a_truncated_library_is_refused_at_load(capi, convnet_compiled, convnet_input, tmp_path) -> None:
    """As forgekit.runtime.compat.check_size: a library shorter than metadata.json records, one line, exit 7."""
    copy = shutil.copytree(convnet_compiled, tmp_path / "copy")
    data = (copy / "model_library.so").read_bytes()
    (copy / "model_library.so").write_bytes(data[: len(data) - 4096])
    done = run(capi, copy, save(tmp_path, "in.npy", convnet_input), out=tmp_path / "out")
    assert done.returncode == 7 and "partly copied" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()

def test_build_is_cached_by_source_hash(capi, tmp_path) -> None:
    again = build_capi(capi.directory.parent)
    assert again == capi and again.library.stat().st_mtime == capi.library.stat().st_mtime
    source = shutil.copytree(SOURCE_DIR, tmp_path / "runtime", ignore=shutil.ignore_patterns("build*"))
    (source / "src" / "metadata.cc").write_text((source / "src" / "metadata.cc").read_text() + "\n// changed\n")
    changed = build_capi(capi.directory.parent, source_dir=source, encryption=False)
    assert changed.directory != capi.directory and changed.library.is_file() and not changed.encryption


def test_a_flipped_byte_is_refused_at_load(capi, convnet_compiled, convnet_input, tmp_path) -> None:
    """As forgekit.runtime.integrity: a library whose bytes differ from the sha256 in metadata.json (same size, so
    check_size passes), one line, exit 7; without the check it loaded and ran."""
    copy = shutil.copytree(convnet_compiled, tmp_path / "copy")
    data = bytearray((copy / "model_library.so").read_bytes())
    data[len(data) // 2] ^= 1
    (copy / "model_library.so").write_bytes(bytes(data))
    done = run(capi, copy, save(tmp_path, "in.npy", convnet_input), out=tmp_path / "out")
    assert done.returncode == 7 and "does not match the sha256 in its metadata.json" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_an_index_out_of_range_is_exit_9(capi, tmp_path) -> None:
    """The bounds checks compiled into the model (forgekit/passes/index_checks.py) end the run with one line and
    the input error's code, not a crash or another table's bytes."""
    import forgekit

    table = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "table")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0)], "emb",
                              [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 3, 4])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "emb")
    good = run(capi, tmp_path / "emb", save(tmp_path, "good.npy", np.array([[0, 1, -1]])), out=tmp_path / "ok")
    assert good.returncode == 0, good.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "ok" / "emb.npy")[0], np.arange(8).reshape(2, 4)[[0, 1, 1]])
    for bad in (2, -3, 2_000_000_000):
        done = run(capi, tmp_path / "emb", save(tmp_path, "bad.npy", np.array([[0, bad, 1]])), out=tmp_path / "o")
        assert done.returncode == 9, done.stderr
        assert done.stderr.count("\n") == 1 and "Index out of range" in done.stderr and "'ids'" in done.stderr
    assert not (tmp_path / "o").exists()


def test_a_reshape_to_values_the_data_cannot_take_is_exit_9(capi, tmp_path) -> None:
    """A Reshape whose target is an input's values (tests/unit/test_value_shapes.py): a target of the data's
    element count runs, another one ends with one line and exit 9 (it read past the data before the check)."""
    import forgekit

    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["y"])], "r",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "r")
    x = save(tmp_path, "x.npy", np.arange(12, dtype=np.float32).reshape(2, 6))
    good = run(capi, tmp_path / "r", x, save(tmp_path, "s.npy", np.array([3, -1])), out=tmp_path / "ok")
    assert good.returncode == 0, good.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "ok" / "y.npy"), np.arange(12).reshape(3, 4))
    done = run(capi, tmp_path / "r", x, save(tmp_path, "bad.npy", np.array([5, 5])), out=tmp_path / "o")
    assert done.returncode == 9, done.stderr
    assert done.stderr.count("\n") == 1 and "shape the data does not have" in done.stderr
    assert not (tmp_path / "o").exists()


def test_a_replaced_artifact_is_loaded_anew(capi, tmp_path) -> None:
    """fk_open of an artifact recompiled at the same path while a handle on the old one is open: the new library
    (dlopen returned the old one for the same path string), also after `cp` onto the loaded file (same inode)."""
    import forgekit
    from onnx_models import constant_op_model

    out = tmp_path / "out"
    forgekit.from_onnx(constant_op_model("Add", 2.0)).compile(target="host", output_path=out)
    for value, (name, replace) in zip((3.0, 5.0), [("recompiled", None), ("copied", "cp")]):
        forgekit.from_onnx(constant_op_model("Add", value)).compile(target="host", output_path=tmp_path / name)
        program = build_program(SOURCE_DIR / "tests" / "capi_check.c", capi)
        proc = subprocess.Popen([str(program), str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "FK_CHECK_RELOAD": "1"})
        while proc.stdout.readline().strip() != "ready":
            pass
        if replace:  # the same inode, new bytes (rewritten without truncating: the open handle maps the file)
            for file in ("model_library.so", "metadata.json"):
                with open(out / file, "r+b") as handle:
                    handle.write((tmp_path / name / file).read_bytes())
                    handle.truncate()
        else:
            shutil.rmtree(out)
            shutil.copytree(tmp_path / name, out)
        rest, _ = proc.communicate("go\n", timeout=60)
        assert f"reload 0 sum={16 * value:g}" in rest, (rest, proc.returncode)


def test_a_topk_artifact_runs(capi, tmp_path) -> None:
    """TopK's kernel calls tvm.contrib.sort.topk, which TVM builds into libtvm_runtime_extra.so: forgekit-run
    (libtvm_runtime.so only) failed at the run ("Cannot find function tvm.contrib.sort.topk").  The C runtime
    now loads it from libtvm_runtime.so's folder: the top 3 of each row as onnxruntime gives them."""
    import forgekit
    from onnx_models import topk_model

    model = topk_model()
    forgekit.from_onnx(model).compile(target="host", output_path=tmp_path / "topk")
    x = np.random.default_rng(0).permutation(40).reshape(4, 10).astype(np.float32)  # no ties
    done = run(capi, tmp_path / "topk", save(tmp_path, "x.npy", x), out=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    values, indices = ort_run(model, {"x": x})
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "values.npy"), values)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "indices.npy"), indices)


def test_a_recurrent_layer_whose_steps_split_runs(capi, tmp_path) -> None:
    """A recurrent layer with large weights splits each step over the threads and asks the pool its size
    (``runtime.NumThreads``, from the kernel: forgekit/importer/converters/recurrence.py): forgekit-run gives the
    Python runtime's bits, with 1 thread and with 2, and onnxruntime's values."""
    import forgekit
    from forgekit.runtime import Engine
    from onnx_models import rnn_model

    model = rnn_model(kind="GRU", T="T", N=1, I=8, H=256, direction="bidirectional", with_init=False, seed=2,
                      outputs=("Y",))
    ir = forgekit.from_onnx(model)
    assert any(gv.name_hint.endswith("_split") for gv in ir.mod.get_global_vars())
    ir.compile(target="host", output_path=tmp_path / "gru")
    x = np.random.default_rng(1).standard_normal((5, 1, 8)).astype(np.float32)
    expected = Engine(tmp_path / "gru").infer(x)[0]
    np.testing.assert_allclose(expected, ort_run(model, {"X": x})[0], rtol=1e-4, atol=1e-5)
    for threads in ("1", "2"):
        done = run(capi, tmp_path / "gru", save(tmp_path, "x.npy", x), out=tmp_path / f"out{threads}",
                   env={"TVM_NUM_THREADS": threads})
        assert done.returncode == 0, done.stderr
        np.testing.assert_array_equal(np.load(tmp_path / f"out{threads}" / "Y.npy"), expected)
