"""ONNX Einsum of two operands that is a matrix product imports as matmul (forgekit/importer/converters/einsum.py).

TVM's converter emitted ``topi.einsum`` as one opaque kernel on TVM's generic loop nest: a GRU decoder's output
projection ``tbh,hk->tbk`` took 2.16 ms against onnxruntime's 0.15 ms, and the whole model 1.55x onnxruntime
(0.77x now; AVX-512 Xeon, 2 threads).  The class: projections by a weight, batched products (attention's
``bhqd,bhkd->bhqk``), outer products, row-wise dots, outputs in any letter order, static or symbolic extents.
Equations with an ellipsis, a diagonal or a letter summed within one operand keep TVM's converter."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import forgekit
from conftest import assert_close, ort_run

#: equation -> (left shape, right shape or None: a constant weight of that shape)
COVERED = {
    "tbh,hk->tbk (a projection by a weight)": ("tbh,hk->tbk", ["T", 1, 16], ("w", [16, 24])),
    "bij,bjk->bik": ("bij,bjk->bik", [3, 5, 7], [3, 7, 4]),
    "bhqd,bhkd->bhqk (attention scores)": ("bhqd,bhkd->bhqk", [2, 3, "S", 8], [2, 3, "S", 8]),
    "bhqk,bhkd->bhqd (attention values)": ("bhqk,bhkd->bhqd", [2, 3, 6, 6], [2, 3, 6, 8]),
    "ij,jk->ki (the output transposed)": ("ij,jk->ki", [5, 6], [6, 7]),
    "i,j->ij (an outer product)": ("i,j->ij", [5], [7]),
    "bn,n->b (a matrix times a vector)": ("bn,n->b", [4, 9], [9]),
    "ij,ij->i (row-wise dots)": ("ij,ij->i", [5, 8], [5, 8]),
    "abcd,dbe->caeb (batch, free and contracted letters mixed)": ("abcd,dbe->caeb", [2, 3, 4, 5], [5, 3, 6]),
}

LEFT_TO_TVM = {
    "...ij,...jk->...ik (an ellipsis)": ("...ij,...jk->...ik", [2, 3, 4], [2, 4, 5]),
    "ii,ij->ij (a diagonal)": ("ii,ij->ij", [4, 4], [4, 5]),
    "ij,jk->k (a letter summed in one operand)": ("ij,jk->k", [3, 4], [4, 5]),
}


def _model(equation: str, left: list, right: object):
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, left)]
    inits = []
    if isinstance(right, tuple):
        inits.append(numpy_helper.from_array(rng.standard_normal(right[1]).astype(np.float32), right[0]))
        names = ["a", right[0]]
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, right))
        names = ["a", "b"]
    graph = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "einsum", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _feeds(model, size: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(size)
    return {vi.name: rng.standard_normal([d.dim_value or size for d in vi.type.tensor_type.shape.dim])
            .astype(np.float32) for vi in model.graph.input}


def _einsum_kernels(ir) -> list[str]:
    return [gv.name_hint for gv in ir.mod.get_global_vars() if "einsum" in gv.name_hint]


@pytest.mark.parametrize("case", sorted(COVERED))
def test_an_einsum_that_is_a_matmul_imports_as_one(case: str) -> None:
    model = _model(*COVERED[case])
    ir = forgekit.from_onnx(model)
    assert not _einsum_kernels(ir), ir.mod.script()
    assert "R.matmul" in ir.mod.script()
    run = ir.get_inference_function("host", opt_level=3)
    for size in (3, 10):  # the symbolic letters (T, S) at two sizes
        feeds = _feeds(model, size)
        assert_close(np.asarray(run(*feeds.values())), ort_run(model, feeds)[0])


@pytest.mark.parametrize("level", [0, 2, 4])
def test_every_level(level: int) -> None:
    model = _model(*COVERED["bhqd,bhkd->bhqk (attention scores)"])
    run = forgekit.from_onnx(model).get_inference_function("host", opt_level=level)
    feeds = _feeds(model, 7)
    assert_close(np.asarray(run(*feeds.values())), ort_run(model, feeds)[0])


@pytest.mark.parametrize("case", sorted(LEFT_TO_TVM))
def test_other_equations_keep_tvm_s_converter(case: str) -> None:
    model = _model(*LEFT_TO_TVM[case])
    ir = forgekit.from_onnx(model)
    assert _einsum_kernels(ir)
    feeds = _feeds(model, 4)
    assert_close(np.asarray(ir.get_inference_function("host", opt_level=3)(*feeds.values())),
                 ort_run(model, feeds)[0])
