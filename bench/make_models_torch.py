"""Models exported from PyTorch with their natural dynamic axes, for the dynamic-shape and recurrent
benchmarks (torch is a benchmark reference only: ``pip install torch==2.13.0`` into the venv first).

    .venv/bin/python bench/make_models_torch.py        # writes bench/models/{bert_dyn,gru_audio,cnn_dyn,yolo_style}.onnx

* ``bert_dyn.onnx``: a BERT-style encoder (vocab 30522, 4 layers, hidden 256, 4 heads, GELU, post-LN),
  inputs ``input_ids``/``attention_mask`` of shape [1, S], S dynamic; seeded random weights.
* ``gru_audio.onnx``: an audio model with two GRU layers (257 -> 128 -> 128) over [1, T, 257] frames,
  T dynamic, and a per-frame sigmoid head (a noise-suppression mask, like the issue's model).
* ``cnn_dyn.onnx``: a ResNet-style CNN on [N, 3, 224, 224], N dynamic.
* ``yolo_style.onnx``: a YOLOv8n-style detector (``yolo_style.py``) on [1, 3, 320, 320], static as the
  benchmark table measures it; output [1, 84, 2100] (boxes and sigmoid class scores).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from torch import nn

from yolo_style import YoloStyle

HERE = Path(__file__).resolve().parent


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.h, self.dk).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.dk) + bias, dim=-1)
        return self.o((att @ v).transpose(1, 2).reshape(b, s, d))


class Layer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.att, self.ln1, self.ln2 = Attention(d, heads), nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.att(x, bias))
        return self.ln2(x + self.ff(x))


class Bert(nn.Module):
    def __init__(self, vocab: int = 30522, d: int = 256, layers: int = 4, heads: int = 4, max_pos: int = 512):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_pos, d)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(Layer(d, heads) for _ in range(layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.ln(self.tok(input_ids) + self.pos(pos))
        bias = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        for layer in self.layers:
            x = layer(x, bias)
        return x


class GruAudio(nn.Module):
    def __init__(self, bins: int = 257, hidden: int = 128) -> None:
        super().__init__()
        self.gru1 = nn.GRU(bins, hidden, batch_first=True)
        self.gru2 = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, bins)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.gru1(x)
        y, _ = self.gru2(y)
        return torch.sigmoid(self.head(y))


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class Cnn(nn.Module):
    """ResNet-18's layout (stem, 4 stages of two basic blocks, pooled classifier)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        chans, blocks = [64, 128, 256, 512], []
        cin = 64
        for i, c in enumerate(chans):
            blocks += [Block(cin, c, 1 if i == 0 else 2), Block(c, c, 1)]
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(512, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def _randomize(model: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def export(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = [
        ("bert_dyn.onnx", _randomize(Bert(), 0),
         (torch.randint(0, 30522, (1, 16)), torch.ones(1, 16, dtype=torch.int64)),
         ["input_ids", "attention_mask"], {"input_ids": {1: "S"}, "attention_mask": {1: "S"}}),
        ("gru_audio.onnx", _randomize(GruAudio(), 1), (torch.randn(1, 60, 257),), ["x"], {"x": {1: "T"}}),
        ("cnn_dyn.onnx", _randomize(Cnn(), 2), (torch.randn(1, 3, 224, 224),), ["x"], {"x": {0: "N"}}),
        ("yolo_style.onnx", _randomize(YoloStyle(), 3), (torch.randn(1, 3, 320, 320),), ["images"], {}),
    ]
    written = []
    for name, model, args, inputs, axes in jobs:
        path = out_dir / name
        with torch.no_grad():
            torch.onnx.export(model, args, str(path), input_names=inputs, output_names=["y"],
                              dynamic_axes=axes, opset_version=17, dynamo=False)
        written.append(path)
        print("wrote", path)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=HERE / "models")
    export(parser.parse_args().out)
