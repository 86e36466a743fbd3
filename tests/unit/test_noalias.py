"""Every kernel of a CPU library keeps ``noalias`` on its buffers (forgekit/backends/cpu/noalias.py).

TVM 0.27's LLVM codegen gives every function of a module the ``tirx.noalias`` of the alphabetically last one,
and the VM's shape function (any model with a dynamic dimension) has none: where it sorted last, LLVM kept
no accumulator of a kernel that sums into a buffer in registers.  A unidirectional LSTM's loop (H=512, 40
steps, 2 threads, a Xeon): 1.68 ms in its model's library, 1.12 ms built alone; 1.07 ms in its library now."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import library_ir
from onnx_models import rnn_model

_COMPUTE = re.compile(r"define internal fastcc (?:range\([^)]*\) )?\w+ @(\w+)_compute_\((.*)\) (?:local_)?unnamed_addr")


def _mlp(dynamic: str) -> object:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dynamic, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dynamic, 32])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("case", ["lstm_dynamic_length", "mlp_dynamic_batch"])
def test_kernels_keep_noalias_where_the_shape_function_sorts_last(case: str) -> None:
    model = rnn_model(kind="LSTM", T="T", I=8, H=32) if case == "lstm_dynamic_length" else _mlp("N")
    ir = library_ir(model)
    computes = dict(_COMPUTE.findall(ir))
    kernels = {name: params for name, params in computes.items() if name != "shape_func"}
    # TVM keeps a kernel's body in a function of its own only when it gives it a noalias parameter (NoInline
    # with NoAlias, codegen_cpu.cc CreateComputeScope): without the pass there is none at all
    assert kernels and "shape_func" in computes, f"kernels without noalias: {sorted(computes)}"
    assert max(computes) == "shape_func", sorted(computes)  # the shape function sorts last: the case of the bug
    for name, params in kernels.items():
        pointers = [p for p in re.split(r", (?=ptr|i\d)", params) if p.startswith("ptr")]
        assert pointers and all(" noalias " in f"{p} " for p in pointers), (name, params)


def test_the_pass_marks_only_functions_of_one_pointer() -> None:
    import tvm

    from forgekit.backends.cpu.noalias import NOALIAS, noalias_where_trivial

    one = """
@T.prim_func
def one(a: T.Buffer((4,), "int64")):
    a[0] = a[1]
"""
    two = """
@T.prim_func
def two(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
    for i in range(4):
        b[i] = a[i]
"""
    mod = noalias_where_trivial()(tvm.IRModule({"one": tvm.script.from_source(one),
                                                "two": tvm.script.from_source(two)}))
    assert mod["one"].attrs[NOALIAS]
    assert mod["two"].attrs is None or NOALIAS not in mod["two"].attrs
