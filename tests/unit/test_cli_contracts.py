"""The command line's contract with scripts: every option spelling any earlier release took still works.

:data:`SPELLINGS` is every option of every verb in the history of ``forgekit/cli.py`` and ``forgekit/cli/``
(``git log -p -- forgekit/cli``: read from each version's typer declarations), with whether it was a flag or
took a value.  Three changed meaning since: ``inspect --json`` was a flag that printed JSON (it now takes
FILE: a bare ``--json`` is stdout again), ``quantize-report -o/--output FILE`` became ``--json FILE``, and
``targets -v/--verbose`` showed each tag's string before ``-v`` became the shared "TVM's output" flag."""

from __future__ import annotations

import json

import pytest

from conftest import run_cli

_FLAG, _VALUE = True, False
#: verb -> (flags, options with a value) of every earlier release
SPELLINGS: dict[str, tuple[str, str]] = {
    "bench": ("--no-memory --profile", "--json --key --markdown --onnx --password-file --peer --rpc-host --rpc-key "
                                       "--rpc-tracker --runs --threads --warmup -n"),
    "compile": ("--bias-correction --encrypt --export-ir --export-metadata --export-relay --float16 --force "
                "--no-bias-correction --per-channel --quantize-depthwise -f",
                "--calib-data --calib-method --dynamic --freeze --host --input-path --input-shape --input_path "
                "--input_shape --layout --max-accuracy-drop --offload --opt-level --optimization --output "
                "--output-path --output_path --password-file --precision --quant-type --quantize --records "
                "--rpc-host --rpc-key --rpc-tracker --target --tune-trials --uuid -O -o -t"),
    "decrypt": ("--force -f", "--key --output --password-file -o"),
    "encrypt": ("", "--password-file"),
    "images build": ("--rebuild", "--base-image --build-arg --tag --tidl --wheelhouse"),
    "images debootstrap": ("", "--mirror --rootfs-tar"),
    "images wheelhouse": ("--force -f", "--image --platform"),
    "inspect": ("--check --json", "--dynamic --freeze --input-path --input-shape --input_path --input_shape --json"),
    "publish": ("--force --include-key --with-runtime -f", "--bench --json --name --output --version -o"),
    "quantize-report": ("--bias-correction --no-bias-correction --per-channel --quantize-depthwise",
                        "--calib-data --calib-method --input-shape --input_shape --json --max-accuracy-drop --output "
                        "--quant-type --quantize -o"),
    "rekey": ("", "--new-password-file --password-file"),
    "run": ("--random", "--bench --input --key --password-file --save -i"),
    "runtime build": ("", "--output --target --tvm-source -o -t"),
    "targets": ("--strings --verbose -v", "--family"),
    "verify": ("", "--atol --json --key --onnx --password-file --rtol --seed"),
}
#: spellings whose kind changed, each kept by a rewrite and pinned by a test below
REWRITTEN = {("inspect", "--json", _FLAG)}


def _options() -> dict[tuple[str, str], bool]:
    """(verb, option) -> is it a flag, for today's command line."""
    import typer.main

    from forgekit.cli import app

    found: dict[tuple[str, str], bool] = {}

    def walk(cmd, path: list[str]) -> None:
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])
        for param in cmd.params:
            if hasattr(param, "is_flag"):
                for opt in [*param.opts, *param.secondary_opts]:
                    found[(" ".join(path), opt)] = param.is_flag

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.parametrize("verb", sorted(SPELLINGS))
def test_every_earlier_option_spelling_is_still_taken(verb: str) -> None:
    today = _options()
    flags, values = SPELLINGS[verb]
    for kind, names in ((_FLAG, flags), (_VALUE, values)):
        for option in names.split():
            assert (verb, option) in today, f"forgekit {verb} no longer takes {option}"
            if (verb, option, kind) not in REWRITTEN:
                assert today[(verb, option)] is kind, f"forgekit {verb} {option} changed from a " + (
                    "flag to an option with a value" if kind else "option with a value to a flag")


@pytest.mark.parametrize("args", [["MODEL", "--json"], ["--json", "MODEL"], ["MODEL", "--json", "--check"],
                                  ["--json", "MODEL", "--check"], ["MODEL", "--check", "--json"],
                                  ["MODEL", "--json", "-"],
                                  ["MODEL", "--check", "--json", "--input-shape", "input=2x3x16x16"]])  # docs/importing.md
def test_inspect_json_as_the_first_releases_wrote_it_prints_json(convnet_path, args: list[str]) -> None:
    proc = run_cli("inspect", *[str(convnet_path) if a == "MODEL" else a for a in args])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # nothing but the JSON on stdout
    assert data["model"] == str(convnet_path)
    assert ("imports" in data) is ("--check" in args)


def test_inspect_json_file_still_writes_the_file_and_the_table(convnet_path, tmp_path) -> None:
    proc = run_cli("inspect", str(convnet_path), "--json", str(tmp_path / "info.json"))
    assert proc.returncode == 0 and "operators:" in proc.stdout, proc.stderr
    assert json.loads((tmp_path / "info.json").read_text())["model"] == str(convnet_path)


def test_quantize_report_output_is_its_json_file_with_a_deprecation_line(tmp_path) -> None:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "q",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [weights])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    np.save(tmp_path / "calib.npy", np.random.default_rng(1).standard_normal((4, 1, 16)).astype(np.float32))
    common = ["quantize-report", str(tmp_path / "m.onnx"), "--calib-data", str(tmp_path / "calib.npy")]
    for spelling in ("-o", "--output"):
        proc = run_cli(*common, spelling, str(tmp_path / f"{spelling}.json"))
        assert proc.returncode == 0, proc.stderr
        assert "layers" in json.loads((tmp_path / f"{spelling}.json").read_text())
        assert proc.stderr.strip() == ("warning: quantize-report --output/-o FILE is deprecated (it still works): "
                                       "use --json FILE"), proc.stderr
    both = run_cli(*common, "-o", str(tmp_path / "a.json"), "--json", str(tmp_path / "b.json"))
    assert both.returncode == 2 and "once" in both.stderr and "Traceback" not in both.stderr


@pytest.mark.parametrize("spelling", ["-v", "--verbose"])
def test_targets_verbose_shows_the_strings_with_a_deprecation_line(spelling: str) -> None:
    proc = run_cli("targets", "--family", "x86", spelling)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_cli("targets", "--family", "x86", "--strings").stdout
    assert "-mcpu=znver4" in proc.stdout
    assert proc.stderr.strip() == "warning: targets --verbose/-v is deprecated (it still works): use targets --strings"
