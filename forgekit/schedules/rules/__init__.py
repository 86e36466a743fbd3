"""Schedule rules, tried in order; the first whose ``matches`` returns non-None is applied.

A rule is any object with ``name``, ``matches(sch, tinfo) -> match | None`` and
``apply(sch, match, tinfo) -> Schedule``.  To add one, drop a module here and insert an instance
into ``RULES``.
"""
from .conv2d import Conv2DRule
from .elementwise import ElementwiseRule
from .fallback import FallbackRule
from .matmul import MatmulRule
from .pool import PoolRule
from .reduction import ReductionRule

RULES = [Conv2DRule(), MatmulRule(), PoolRule(), ReductionRule(), ElementwiseRule(),
         FallbackRule()]
