"""When TVM's FuseTransposeMatmul may run: ``q @ transpose(k)`` becomes an ``NT_matmul`` PrimFunc of its own,
which forgekit's matmul legalizations (backends/cpu/packed_conv.py, dynamic_matmul.py) never see.

For shapes the CPU rules tile well (BERT's 128 tokens) that saves a transpose kernel.  For the others it
loses their padding: a symbolic sequence length fell to the generic reduction schedule, and ViT's 101 or
197 tokens (primes: columns not whole vectors, rows without a register tile) ran one column at a time
(4.8 GFLOP/s).  So the pass is skipped for a model with either.
"""

from __future__ import annotations

from typing import Any

#: the widest fp32 vector forgekit schedules for (AVX-512): columns in whole vectors of it tile on every CPU
LANES = 16


def ragged(m: int, n: int) -> bool:
    """Whether an [m, k] x [k, n] product is one the CPU matmul rules tile badly as is: columns not whole
    vectors, or more than 8 rows with no divisor from 4 to 8 (a register tile; up to 8 rows are one tile)."""
    return (n % LANES != 0 and n > LANES) or (m > 8 and not any(m % d == 0 for d in range(4, 9)))


def has_ragged_transposed_matmul(func: Any) -> bool:
    """Whether ``func`` (a Relax function) multiplies by a transposed tensor with static, ragged extents."""
    from tvm import relax, tirx

    permuted: set[Any] = set()
    for block in getattr(func.body, "blocks", None) or []:
        for binding in block.bindings:
            value = getattr(binding, "value", None)
            if not isinstance(value, relax.Call):
                continue
            op = getattr(value.op, "name", "")
            if op == "relax.permute_dims":
                permuted.add(binding.var)
            elif op == "relax.matmul" and len(value.args) == 2 and value.args[1] in permuted:
                dims = list(getattr(getattr(binding.var.ty, "shape", None), "values", None) or [])
                if len(dims) >= 2 and all(isinstance(d, tirx.IntImm) for d in dims[-2:]) and \
                        ragged(int(dims[-2]), int(dims[-1])):
                    return True
    return False
