"""Integer conv2d/matmul rule: the register-tiled dot-product micro-kernel of :mod:`.dot_tile` with
``vpdpbusd`` on AVX512-VNNI, ``sdot`` on ARMv8.2 or ``vpmaddwd`` on AVX2 (see :mod:`forgekit.backends.cpu.int8`).

Matches the blocks made by the int8 legalization (``conv2d_nhwc_int8`` / ``matmul_int8``): spatial
``[..., r, v]`` and reduction ``[..., c, i]`` with ``i`` the 4 bytes of one dot product (2 int16 on AVX2);
16 lanes on VNNI, 4 on sdot, 8 on AVX2.  The epilogue carries the -offset*sum(W) fix-up, dequantize, bias,
relu and the requantize of the next layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import int8
from .dot_tile import DotTileRule

if TYPE_CHECKING:
    from ....targets.isa import IsaInfo

BLOCKS = ("conv2d_nhwc_int8", "matmul_int8")


class GemmInt8Rule(DotTileRule):
    """The int8 micro-kernel for one :class:`~forgekit.backends.cpu.int8.DotKernel`; matches only on targets
    that have its instruction (the legalization packed the weights for it)."""

    blocks = BLOCKS
    red = int8.RED
    what = "int8"

    def __init__(self, kernel: int8.DotKernel) -> None:
        self.kernel = kernel
        self.name = kernel.rule
        self.lanes = kernel.lanes
        self.red = kernel.red

    def available(self, tinfo: IsaInfo) -> bool:
        return tinfo.dot == self.kernel.key

    def intrinsic(self) -> str:
        return self.kernel.register()
