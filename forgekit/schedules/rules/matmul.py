"""dense / matmul / batch_matmul rule.

Any remaining MAC reduction whose output's last index is a spatial iterator: ONNX MatMul / Gemm
(weights are folded to [K, N] so N is contiguous), batched attention matmuls ([B, H, S, D]).  Same
register-tiled micro-kernel as conv2d: vectorize N, register-tile M, parallel over
(N tiles, batch, M tiles), fused epilogue (bias, gelu, scaling, residual add).
"""
from . import tiled


class MatmulRule:
    name = "matmul"

    def matches(self, sch, tinfo):
        return tiled.analyze(sch)

    def space(self, sch, g, tinfo):
        """Knob settings to measure when tuning (the default first)."""
        return tiled.tile_space(sch, g, tinfo)

    def apply(self, sch, g, tinfo, knobs=None):
        return tiled.schedule_gemm_like(sch, g, tinfo, knobs)
