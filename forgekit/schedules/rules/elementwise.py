"""Injective functions (elementwise, broadcast, transpose/reshape, concat, layout transforms):
inline everything into the output block(s), fuse loops, vectorize the innermost lanes and
parallelize the rest."""
from .common import blocks_of, is_output_block, is_reduction, parallel_spatial, try_inline


class ElementwiseRule:
    name = "elementwise"

    def matches(self, sch, tinfo):
        blocks = blocks_of(sch)
        if any(is_reduction(sch, b) for b in blocks):
            return None
        return blocks

    def apply(self, sch, blocks, tinfo):
        for b in blocks:
            if not is_output_block(sch, b):
                try_inline(sch, b)
        for b in blocks_of(sch):
            parallel_spatial(sch, b, tinfo.vec_lanes)
        return sch
