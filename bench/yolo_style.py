"""A YOLOv8n-style detector in plain PyTorch (no ultralytics): the op mix people ship in detectors.

Backbone of Conv(+BN)+SiLU with stride-2 3x3 convs and C2f blocks (1x1 conv, ``Split``, bottlenecks,
``Concat``), SPPF (three 5x5 max-pools), a PAN neck (nearest ``Resize`` x2 + ``Concat``, stride-2 convs
back down) and the anchor-free decoupled head: per level a box branch (3x3, 3x3, 1x1 to 4x16 bins) and a
class branch (3x3, 3x3, 1x1 to 80 classes), then DFL (``Softmax`` over 16 bins + a fixed 1x1 conv),
distance-to-box against the anchor grid, and a ``Sigmoid`` over the class scores. Output ``[1, 84, A]``
(A = 2100 anchors at 320x320). Widths follow YOLOv8n (16-32-64-128-256); weights are random but
seeded, BatchNorm statistics randomized so the folded convs are not identities.
"""

from __future__ import annotations

import torch
from torch import nn


class Conv(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1, self.cv2, self.add = Conv(c, c, 3), Conv(c, c, 3), shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = False) -> None:
        super().__init__()
        self.c = cout // 2
        self.cv1 = Conv(cin, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, cout, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).split((self.c, self.c), 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.cv1, self.cv2 = Conv(cin, cin // 2, 1), Conv(cin * 2, cout, 1)
        self.m = nn.MaxPool2d(5, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = [self.cv1(x)]
        for _ in range(3):
            y.append(self.m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class Detect(nn.Module):
    def __init__(self, chans: tuple[int, ...], nc: int = 80, reg_max: int = 16) -> None:
        super().__init__()
        self.nc, self.reg_max, self.strides = nc, reg_max, (8, 16, 32)
        c2, c3 = max(16, chans[0] // 4, reg_max * 4), max(chans[0], min(nc, 100))
        self.box = nn.ModuleList(nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1))
                                 for c in chans)
        self.cls = nn.ModuleList(nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, nc, 1))
                                 for c in chans)
        self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        self.dfl.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(1, reg_max, 1, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        b = feats[0].shape[0]
        outs, anchors, strides = [], [], []
        for i, x in enumerate(feats):
            outs.append(torch.cat((self.box[i](x), self.cls[i](x)), 1).view(b, 4 * self.reg_max + self.nc, -1))
            h, w = x.shape[2:]
            sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
            anchors.append(torch.stack((sx, sy), -1).view(-1, 2))
            strides.append(torch.full((h * w, 1), float(self.strides[i])))
        y = torch.cat(outs, 2)
        box, cls = y.split((4 * self.reg_max, self.nc), 1)
        a = box.shape[-1]
        dist = self.dfl(box.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        anchor = torch.cat(anchors).transpose(0, 1).unsqueeze(0)
        stride = torch.cat(strides).transpose(0, 1)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = anchor - lt, anchor + rb
        boxes = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * stride
        return torch.cat((boxes, cls.sigmoid()), 1)


class YoloStyle(nn.Module):
    """YOLOv8n's layout: 3.2 M parameters, about 4.4 GFLOPs at 320x320 (8.7 at 640)."""

    def __init__(self, nc: int = 80) -> None:
        super().__init__()
        self.b0 = nn.Sequential(Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), C2f(32, 32, 1, True),
                                Conv(32, 64, 3, 2), C2f(64, 64, 2, True))             # P3 /8
        self.b1 = nn.Sequential(Conv(64, 128, 3, 2), C2f(128, 128, 2, True))          # P4 /16
        self.b2 = nn.Sequential(Conv(128, 256, 3, 2), C2f(256, 256, 1, True), SPPF(256, 256))  # P5 /32
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.n4, self.n3 = C2f(384, 128), C2f(192, 64)
        self.d3, self.m4 = Conv(64, 64, 3, 2), C2f(192, 128)
        self.d4, self.m5 = Conv(128, 128, 3, 2), C2f(384, 256)
        self.detect = Detect((64, 128, 256), nc)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p3 = self.b0(x)
        p4 = self.b1(p3)
        p5 = self.b2(p4)
        n4 = self.n4(torch.cat((self.up(p5), p4), 1))
        o3 = self.n3(torch.cat((self.up(n4), p3), 1))
        o4 = self.m4(torch.cat((self.d3(o3), n4), 1))
        o5 = self.m5(torch.cat((self.d4(o4), p5), 1))
        return self.detect([o3, o4, o5])
