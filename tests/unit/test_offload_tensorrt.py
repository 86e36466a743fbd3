"""TensorRT-style partitioning on the IR: TVM's partitioner + a size filter, ONNX subgraphs checked in
onnxruntime, inlining back to the original module, and CPU compiles of a partitioned module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import forgekit
from forgekit.offload.partition import inline_partitions

from conftest import assert_close, ort_run
from onnx_models import attention_block, make_cnn


def cnn_with_leaky_relu() -> onnx.ModelProto:
    """:func:`make_cnn` with a LeakyRelu after the first conv+relu: TensorRT's patterns have no leakyrelu, so
    the model splits into two regions (conv+add+relu | the rest)."""
    model = make_cnn()
    nodes = list(model.graph.node)
    nodes[1].output[0] = "r1a"
    nodes.insert(2, helper.make_node("LeakyRelu", ["r1a"], ["r1"], alpha=0.1))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


@pytest.fixture()
def cnn() -> forgekit.IRModule:
    return forgekit.from_onnx(cnn_with_leaky_relu(), {"x": [1, 3, 16, 16]})


def test_partition_for_tensorrt_makes_subgraphs_and_the_forge_properties(cnn: forgekit.IRModule) -> None:
    original = cnn.copy()
    assert cnn.subgraph_count == 0 and not cnn.is_tensorrt and cnn.graph_count == 1 and list(cnn) == ["main"]
    assert cnn.partition_for_tensorrt() is cnn
    assert cnn.is_tensorrt and cnn.subgraph_count == 2 and cnn.graph_count == 3
    first, rest = cnn.partitions
    assert first.ops == ("nn.conv2d", "add", "nn.relu") and first.macs == 16 * 16 * 16 * 27
    assert rest.ops[0] == "nn.conv2d" and rest.ops[-1] == "matmul" and rest.outputs == (((1, 10), "float32"),)
    assert list(cnn)[0] == "main" and len(cnn.graphs) == 3 and cnn.main.same_as(cnn.mod["main"])
    assert "leakyrelu" in cnn.main.script(show_meta=False) and cnn.output_node.same_as(cnn.main.body.body)
    assert cnn != original
    assert cnn.inline_partitions() is cnn and cnn.subgraph_count == 0 and not cnn.is_tensorrt
    assert cnn == original  # structural equality: same operators, order, attributes and weights


def test_size_filter_keeps_small_regions_on_the_host(cnn: forgekit.IRModule) -> None:
    cnn.partition_for_tensorrt(min_ops=4)
    assert cnn.subgraph_count == 1 and len(cnn.partitions[0].ops) == 8
    cnn.partition_for_tensorrt(min_ops=1, min_macs=200_000)  # re-partitioning starts from the whole model
    assert cnn.subgraph_count == 0 and not cnn.is_tensorrt
    elementwise = forgekit.from_onnx(_elementwise_model())
    assert elementwise.partition_for_tensorrt().subgraph_count == 0  # no MACs: nothing worth a copy
    assert elementwise.partition_for_tensorrt(min_macs=0).subgraph_count == 1


def _elementwise_model() -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["r"], ["y"])],
                              "ew", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_exported_subgraphs_match_tvm_in_onnxruntime(cnn: forgekit.IRModule, tmp_path: Path) -> None:
    cnn.partition_for_tensorrt()
    checks = cnn.check_subgraphs()
    assert len(checks) == 2 and all(c.ok for c in checks), checks
    paths = cnn.export_subgraphs(tmp_path / "trt")
    assert [p.name for p in paths] == ["0_tensorrt.onnx", "1_tensorrt.onnx"]
    listed = json.loads((tmp_path / "trt" / "partitions.json").read_text())
    assert [r["onnx"] for r in listed] == ["0_tensorrt.onnx", "1_tensorrt.onnx"] and listed[0]["macs"] == 110592
    ops = [n.op_type for n in onnx.load(paths[0]).graph.node]
    assert ops == ["Conv", "Add", "Relu"]
    # The two exported regions with the host's LeakyRelu between them reproduce the whole model.
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    head = ort_run(paths[0], {"x": x})[0]
    tail_input = onnx.load(paths[1]).graph.input[0].name
    y = ort_run(paths[1], {tail_input: np.where(head > 0, head, 0.1 * head).astype(np.float32)})[0]
    assert_close(y, ort_run(cnn_with_leaky_relu(), {"x": x})[0])


def test_partitioned_module_compiles_for_the_cpu_and_matches(cnn: forgekit.IRModule, tmp_path: Path) -> None:
    cnn.partition_for_tensorrt()
    x = np.random.default_rng(4).standard_normal((1, 3, 16, 16)).astype(np.float32)
    want = ort_run(cnn_with_leaky_relu(), {"x": x})[0]
    assert_close(cnn.get_inference_function("host")(x), want)
    assert cnn.subgraph_count == 2  # building did not change the module
    from forgekit.runtime import Engine

    result = cnn.compile(target="host", output_path=tmp_path / "out")
    assert_close(Engine(result.path).infer(x), want)


def test_attention_block_partitions_and_its_subgraphs_match() -> None:
    ir = forgekit.from_onnx(attention_block(), {"x": [1, 8, 32]})
    ir.partition_for_tensorrt()
    assert ir.is_tensorrt and ir.subgraph_count >= 1
    ops = {op for p in ir.partitions for op in p.ops}
    assert {"matmul", "nn.softmax", "permute_dims"} <= ops
    assert all(c.ok for c in ir.check_subgraphs())


def test_constructor_inlines_partitions_of_a_relax_module(cnn: forgekit.IRModule) -> None:
    original = cnn.mod
    partitioned = cnn.partition_for_tensorrt().mod
    assert forgekit.IRModule(partitioned).subgraph_count == 2
    rebuilt = forgekit.IRModule(partitioned, inline_partitions=True)
    assert rebuilt.subgraph_count == 0
    import tvm_ffi

    assert tvm_ffi.structural_equal(inline_partitions(partitioned), original)
