"""A BERT-style encoder written with onnx.helper and numpy, laid out the way transformers' ONNX export lays
BERT out (Gather embeddings, LayerNormalization, per-head Reshape/Transpose, scaled QK^T plus an additive mask,
Softmax, GELU through Erf, residuals), seeded random weights."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .zoo_cnn import Net

VOCAB = 30522  # bert-base-uncased's vocabulary


class _Encoder(Net):
    def __init__(self, seed: int, batch: int, seq: int, hidden: int, heads: int) -> None:
        super().__init__(seed)
        self.batch, self.seq, self.hidden, self.heads = batch, seq, hidden, heads

    def linear(self, x: str, cin: int, cout: int) -> str:
        # 1/sqrt(fan_in): after LayerNorm, q.k/sqrt(d) has unit scale, so attention is not uniform (as trained
        # attention is not) and the softmax's precision matters.
        w = (self.rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype(np.float32)
        b = (self.rng.standard_normal(cout) * 0.02).astype(np.float32)
        return self.op("Add", [self.op("MatMul", [x, self.const(w, "w")]), self.const(b, "b")])

    def layer_norm(self, x: str) -> str:
        g = (1 + self.rng.standard_normal(self.hidden) * 0.1).astype(np.float32)
        b = (self.rng.standard_normal(self.hidden) * 0.05).astype(np.float32)
        return self.op("LayerNormalization", [x, self.const(g, "ln_g"), self.const(b, "ln_b")], axis=-1, epsilon=1e-12)

    def heads_of(self, x: str, perm: list[int]) -> str:
        shape = self.const(np.array([self.batch, self.seq, self.heads, self.hidden // self.heads], np.int64), "shape")
        return self.op("Transpose", [self.op("Reshape", [x, shape])], perm=perm)

    def attention(self, x: str, mask: str) -> str:
        h = self.hidden
        q = self.heads_of(self.linear(x, h, h), [0, 2, 1, 3])
        k = self.heads_of(self.linear(x, h, h), [0, 2, 3, 1])  # K^T directly, as the export does
        v = self.heads_of(self.linear(x, h, h), [0, 2, 1, 3])
        scale = self.const(np.array(np.sqrt(h // self.heads), np.float32), "scale")
        scores = self.op("Add", [self.op("Div", [self.op("MatMul", [q, k]), scale]), mask])
        ctx = self.op("Transpose", [self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
        ctx = self.op("Reshape", [ctx, self.const(np.array([self.batch, self.seq, h], np.int64), "shape")])
        return self.layer_norm(self.op("Add", [self.linear(ctx, h, h), x]))

    def mlp(self, x: str) -> str:
        h = self.linear(x, self.hidden, 4 * self.hidden)
        erf = self.op("Erf", [self.op("Div", [h, self.const(np.array(np.sqrt(2), np.float32))])])
        gelu = self.op("Mul", [self.op("Mul", [h, self.op("Add", [erf, self.const(np.array(1, np.float32))])]),
                               self.const(np.array(0.5, np.float32))])
        return self.layer_norm(self.op("Add", [self.linear(gelu, 4 * self.hidden, self.hidden), x]))


def bert_style(batch: int = 1, layers: int = 4, hidden: int = 256, heads: int = 4, seq: int = 128) -> onnx.ModelProto:
    """input_ids, attention_mask (int64 [batch, seq]) -> last_hidden_state [batch, seq, hidden]."""
    net = _Encoder(4, batch, seq, hidden, heads)
    words = (net.rng.standard_normal((VOCAB, hidden)) * 0.5).astype(np.float32)
    positions = (net.rng.standard_normal((512, hidden)) * 0.5).astype(np.float32)
    token_type = (net.rng.standard_normal((1, hidden)) * 0.5).astype(np.float32)
    pos_ids = net.const(np.arange(seq, dtype=np.int64)[None], "pos_ids")
    x = net.op("Add", [net.op("Gather", [net.const(words, "word_emb"), "input_ids"], axis=0),
                       net.op("Gather", [net.const(positions, "pos_emb"), pos_ids], axis=0)])
    x = net.layer_norm(net.op("Add", [x, net.const(token_type, "type_emb")]))
    # transformers' extended mask: (1 - mask) * finfo(float32).min, broadcast over heads and query rows.  The
    # float32 minimum does not survive a cast to fp16 (it becomes -inf), which is why the export's form is kept.
    m = net.op("Cast", [net.op("Unsqueeze", ["attention_mask", net.const(np.array([1, 2], np.int64), "axes")])],
               to=TensorProto.FLOAT)
    mask = net.op("Mul", [net.op("Sub", [net.const(np.array(1, np.float32), "one"), m]),
                          net.const(np.array(np.finfo(np.float32).min, np.float32), "neg")])
    for _ in range(layers):
        x = net.mlp(net.attention(x, mask))
    net.nodes[-1].output[0] = "last_hidden_state"
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, [batch, seq]) for n in ("input_ids", "attention_mask")]
    graph = helper.make_graph(net.nodes, "bert_style", ids,
                              [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [batch, seq, hidden])],
                              net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model

