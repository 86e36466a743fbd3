"""Generate the benchmark ONNX models (default folder: bench/models/, git-ignored).

* light_resnet50 / light_squeezenet from the onnx wheel, with every ConstantOfShape(0.02)
  weight node replaced by a seeded random initializer (role-aware: conv/gemm weights are
  He-scaled, BN variances/scales positive) so correctness checks are discriminating.
* ResNet-18, MobileNetV2 and a 4-layer/256-hidden/seq-128 BERT-style encoder defined in
  plain torch with seeded random weights, exported with torch.onnx.export(opset 17, dynamo=False).

Needs torch (``pip install torch==2.13.0``, CPU wheel) for the last three; without it only the two
onnx-wheel models are written::

    .venv/bin/python bench/make_models.py [--out DIR]
"""
import os

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "models")


def randomize_light(src, dst, seed=0):
    m = onnx.load(src)
    g = m.graph
    rng = np.random.default_rng(seed)
    inits = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    consumers = {}
    for n in g.node:
        for k, i in enumerate(n.input):
            consumers.setdefault(i, []).append((n, k))
    new_inits, keep_nodes, drop = [], [], set()
    for n in g.node:
        if n.op_type != "ConstantOfShape":
            keep_nodes.append(n)
            continue
        shape = tuple(int(s) for s in inits[n.input[0]])
        drop.add(n.input[0])
        cons, k = consumers[n.output[0]][0]
        op = cons.op_type
        if op == "BatchNormalization":
            if k in (1, 4):  # scale, var
                a = rng.uniform(0.5, 1.5, shape)
            else:  # bias, mean
                a = rng.normal(0, 0.1, shape)
        elif op in ("Conv", "Gemm") and k == 1:
            fan_in = int(np.prod(shape[1:]))
            a = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
        else:
            a = rng.normal(0, 0.05, shape)
        new_inits.append(numpy_helper.from_array(a.astype(np.float32), n.output[0]))
    del g.node[:]
    g.node.extend(keep_nodes)
    kept = [i for i in g.initializer if i.name not in drop]
    del g.initializer[:]
    g.initializer.extend(kept + new_inits)
    ins = [i for i in g.input if i.name not in drop and i.name not in {x.name for x in new_inits}]
    ins += [onnx.helper.make_tensor_value_info(x.name, onnx.TensorProto.FLOAT, list(x.dims))
            for x in new_inits]  # ir_version 3 needs initializers listed as inputs
    del g.input[:]
    g.input.extend(ins)
    onnx.checker.check_model(m)
    onnx.save(m, dst)
    print("wrote", dst)


def torch_models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)

    class Basic(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                      nn.ReLU(), nn.MaxPool2d(3, 2, 1))
            layers, cin = [], 64
            for cout, s in [(64, 1), (128, 2), (256, 2), (512, 2)]:
                layers += [Basic(cin, cout, s), Basic(cout, cout, 1)]
                cin = cout
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(512, 1000)

        def forward(self, x):
            x = self.layers(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class InvRes(nn.Module):
        def __init__(self, cin, cout, stride, t):
            super().__init__()
            hid = cin * t
            mods = []
            if t != 1:
                mods += [nn.Conv2d(cin, hid, 1, bias=False), nn.BatchNorm2d(hid), nn.ReLU6()]
            mods += [nn.Conv2d(hid, hid, 3, stride, 1, groups=hid, bias=False), nn.BatchNorm2d(hid),
                     nn.ReLU6(), nn.Conv2d(hid, cout, 1, bias=False), nn.BatchNorm2d(cout)]
            self.body = nn.Sequential(*mods)
            self.res = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.res else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self):
            super().__init__()
            cfg = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                   (6, 160, 3, 2), (6, 320, 1, 1)]
            mods = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
            cin = 32
            for t, c, n, s in cfg:
                for i in range(n):
                    mods.append(InvRes(cin, c, s if i == 0 else 1, t))
                    cin = c
            mods += [nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU6()]
            self.features = nn.Sequential(*mods)
            self.fc = nn.Linear(1280, 1000)

        def forward(self, x):
            x = self.features(x)
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class Layer(nn.Module):
        def __init__(self, d=256, h=4, ff=1024):
            super().__init__()
            self.h, self.dh = h, d // h
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.f1, self.f2 = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x, mask):
            B, S, D = x.shape
            sp = lambda t: t.view(B, S, self.h, self.dh).transpose(1, 2)
            q, k, v = sp(self.q(x)), sp(self.k(x)), sp(self.v(x))
            a = torch.matmul(q, k.transpose(-1, -2)) / (self.dh ** 0.5) + mask
            a = torch.matmul(torch.softmax(a, -1), v).transpose(1, 2).reshape(B, S, D)
            x = self.ln1(x + self.o(a))
            return self.ln2(x + self.f2(F.gelu(self.f1(x))))

    class Bert(nn.Module):
        def __init__(self, vocab=8000, d=256, L=4, S=128):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, S, d) * 0.02)
            self.ln = nn.LayerNorm(d)
            self.layers = nn.ModuleList(Layer(d) for _ in range(L))

        def forward(self, ids, attn):
            x = self.ln(self.tok(ids) + self.pos)
            mask = (1.0 - attn[:, None, None, :].float()) * -10000.0
            for l in self.layers:
                x = l(x, mask)
            return x

    def rand_bn(m):
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                mod.running_mean.normal_(0, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.data.uniform_(0.5, 1.5)
                mod.bias.data.normal_(0, 0.1)
        return m.eval()

    x = torch.randn(1, 3, 224, 224)
    for name, net in [("resnet18", ResNet18()), ("mobilenetv2", MobileNetV2())]:
        net = rand_bn(net)
        torch.onnx.export(net, (x,), os.path.join(OUT, f"{name}.onnx"), opset_version=17,
                          dynamo=False, input_names=["input"], output_names=["output"])
        print("wrote", name)
    bert = Bert().eval()
    ids = torch.randint(0, 8000, (1, 128))
    attn = torch.ones(1, 128, dtype=torch.int64)
    torch.onnx.export(bert, (ids, attn), os.path.join(OUT, "bert4l.onnx"), opset_version=17,
                      dynamo=False, input_names=["input_ids", "attention_mask"],
                      output_names=["output"])
    print("wrote bert4l")


def make_all(out: str = OUT) -> None:
    """Write every benchmark model into ``out`` (the torch ones only when torch is installed)."""
    global OUT
    OUT = out
    os.makedirs(OUT, exist_ok=True)
    light = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light")
    randomize_light(os.path.join(light, "light_resnet50.onnx"), os.path.join(OUT, "resnet50.onnx"), 0)
    randomize_light(os.path.join(light, "light_squeezenet.onnx"), os.path.join(OUT, "squeezenet.onnx"), 1)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: skipping resnet18, mobilenetv2, bert4l (pip install torch==2.13.0)")
        return
    torch_models()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    make_all(parser.parse_args().out)
