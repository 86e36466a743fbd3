"""Schedule rules, tried in order; the first whose ``matches`` returns non-None is applied.

A rule is any object with ``name``, ``matches(sch, tinfo) -> match | None`` and
``apply(sch, match, tinfo) -> Schedule``.  To add one, drop a module here and insert an instance
into ``RULES``.
"""
from .. import int8
from .column_reduction import ColumnReductionRule
from .conv2d import Conv2DRule
from .elementwise import ElementwiseRule
from .fallback import FallbackRule
from .gemm_bf16 import GemmBf16Rule
from .gemm_int8 import GemmInt8Rule
from .matmul import MatmulRule
from .pool import PoolRule
from .reduction import ReductionRule
from .winograd import WinogradRule

RULES = [WinogradRule(), GemmBf16Rule(), GemmInt8Rule(int8.VNNI), GemmInt8Rule(int8.SDOT), GemmInt8Rule(int8.AVX2),
         Conv2DRule(), MatmulRule(), PoolRule(), ColumnReductionRule(), ReductionRule(), ElementwiseRule(),
         FallbackRule()]
