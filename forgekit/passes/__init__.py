"""Relax-to-Relax passes, and the registry that says which run at which optimization level.

Like TVM's ``relax/pipeline.py``, the pipeline is data: :data:`GRAPH_PASSES` lists every graph pass with
the level it starts at and the options it needs; :func:`graph_passes` builds the list for a compile.
Adding a pass is one :func:`register_pass` call (a pass module of its own if it is forgekit's).

====  =====================================================================================
 0    Legalize and build operator by operator: no folding, no fusion (for debugging).
 1    + constant folding, common-subexpression and dead-code elimination, binding cleanup.
 2    + operator fusion (FuseOps/FuseTIR, in the backend), batch-norm folding into convolutions.
 3    + transpose-into-matmul fusion, merging of parallel matmuls, and on CPUs forgekit's schedules.
 4    + LLVM fast-math (reassociation, contraction): results may differ in the last bits.
====  =====================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UsageError

OPT_LEVELS: dict[int, str] = {
    0: "legalize and build each operator; no folding or fusion",
    1: "constant folding, CSE, dead-code elimination",
    2: "level 1 + operator fusion + batch-norm folding",
    3: "level 2 + matmul rewrites + target schedules",
    4: "level 3 + LLVM fast-math",
}


@dataclass(frozen=True)
class GraphPass:
    """One registered graph pass: from which opt level, under which options, how to make it."""

    name: str
    level: int
    make: Callable[..., Any]
    #: (precision, layout) -> whether it runs; default: always
    when: Callable[[str, str | None], bool] = lambda precision, layout: True
    #: ``make`` takes the opt level: a pass whose work depends on what the level's backend does after it
    per_level: bool = False


GRAPH_PASSES: list[GraphPass] = []


def register_pass(name: str, level: int, make: Callable[..., Any],
                  when: Callable[[str, str | None], bool] | None = None, per_level: bool = False) -> None:
    """Append a pass to the pipeline (names are unique); ``per_level``: ``make(opt_level)``."""
    if any(p.name == name for p in GRAPH_PASSES):
        raise ValueError(f"A graph pass named '{name}' is already registered.")
    GRAPH_PASSES.append(GraphPass(name, level, make, when or (lambda precision, layout: True), per_level))


def _relax(name: str, **kwargs: Any) -> Callable[[], Any]:
    def make() -> Any:
        from tvm import relax

        return getattr(relax.transform, name)(**kwargs)

    return make


def input_symbols(func: Any) -> list[str]:
    """Names of the symbolic dimensions of ``func``'s parameters, in order of appearance (``W`` of
    ``x: [1, 3, 48, W]``); dims that only appear inside the function are not listed."""
    from tvm import tirx

    seen: list[str] = []
    for param in func.params:
        shape = getattr(getattr(param, "ty", None), "shape", None)
        for dim in getattr(shape, "values", None) or []:
            if isinstance(dim, tirx.Var) and dim.name not in seen:
                seen.append(dim.name)
    return seen


def _static_shapes_only(name: str) -> Callable[[], Any]:
    """TVM's pass ``name``, skipped for a model with symbolic input dims.

    FuseTransposeMatmul turns ``q @ transpose(k)`` into an ``NT_matmul`` PrimFunc of its own, which the
    symbolic-extent matmul legalization (backends/cpu/dynamic_matmul.py) never sees: on a dynamic sequence
    length that kernel fell to the generic reduction schedule.  Also skipped for ragged static shapes
    (:mod:`.transpose_matmul`)."""
    def make() -> Any:
        import tvm
        from tvm import relax

        inner = getattr(relax.transform, name)()

        @tvm.ir.transform.module_pass(opt_level=0, name=f"forgekit.{name}IfStatic")
        def wrapped(mod: Any, ctx: Any) -> Any:
            from .transpose_matmul import has_ragged_transposed_matmul

            if not any(gv.name_hint == "main" for gv in mod.get_global_vars()):
                return inner(mod)
            main = mod["main"]
            # a symbolic or ragged (ViT's 101 tokens) q @ k^T keeps forgekit's padded matmul instead
            return mod if input_symbols(main) or has_ragged_transposed_matmul(main) else inner(mod)

        return wrapped

    return make


def _combine_parallel_matmul() -> Any:
    """TVM's CombineParallelMatmul, or the module unchanged where TVM's rewrite fails.

    Matmuls sharing a left operand with a symbolic dim, whose right operands mix constants and run-time
    tensors (a Linear layer and a matmul by another input on the same dynamic batch), fail inside TVM 0.27's
    pattern rewriter, before its ``check`` callback is asked: "Cannot treat type `ir.PrimType` as type
    `relax.TensorType`" (fuzz seed 4099: compile error at levels 3-4).  Combining is an optimization: each
    matmul then runs on its own, as at level 2.  Kept under TVM's name: compile reports list it so."""
    from tvm import relax

    from .functions import or_keep

    return or_keep(relax.transform.CombineParallelMatmul(), "CombineParallelMatmul", "matmuls kept apart")


def _fold_batch_norms() -> Any:
    from .batchnorm import fold_batch_norms_pass

    return fold_batch_norms_pass()


def _long_reductions(opt_level: int) -> Any:
    from .long_reductions import long_reductions_pass

    # level 3+ backends sum a softmax row in vector-wide partial sums themselves (see long_reductions.WHOLE_ROW)
    return long_reductions_pass(whole_softmax_rows=opt_level >= 3)


def _to_nhwc() -> Any:
    from .layout import to_nhwc_or_keep

    return to_nhwc_or_keep()


def _canonicalize() -> Any:
    from .canonicalize import Canonicalize

    return Canonicalize


def _fold_constant() -> Any:
    from .numpy_fold import FoldConstant

    return FoldConstant


def _sanitize_names() -> Any:
    from .names import sanitize_names_pass

    return sanitize_names_pass()


# first: what later passes and codegen name after the ONNX inputs must be C identifiers (names.py)
register_pass("forgekit.SanitizeNames", 0, _sanitize_names)
register_pass("DecomposeOpsForInference", 0, _relax("DecomposeOpsForInference"))
register_pass("FoldConstant", 1, _fold_constant)
register_pass("CanonicalizeBindings", 1, _relax("CanonicalizeBindings"))
register_pass("EliminateCommonSubexpr", 1, _relax("EliminateCommonSubexpr"))
register_pass("DeadCodeElimination", 1, _relax("DeadCodeElimination"))
register_pass("forgekit.FoldBatchNorm", 2, _fold_batch_norms)
register_pass("FoldConstant.2", 2, _fold_constant)
# ToMixedPrecision cannot type a call_tir ("Expected TensorType, but got R.Callable": TVM's ONNX Clip imports as
# call_tir(maximum/minimum), MobileNetV2's ReLU6 failed for CUDA fp16): the Relax ops they stand for first.
register_pass("forgekit.Canonicalize.precision", 0, _canonicalize, when=lambda precision, layout: precision == "float16")
# Before any pass that emits call_tir (FuseTransposeMatmul's NT_matmul failed the same way on attention), after
# batch-norm folding (on fp32 weights).  Convolutions and matmuls in fp16, accumulation in fp32: the error stays ~1e-3.
register_pass("ToMixedPrecision", 0, _relax("ToMixedPrecision", out_dtype="float32"),
              when=lambda precision, layout: precision == "float16")
register_pass("FoldConstant.precision", 0, _fold_constant, when=lambda precision, layout: precision == "float16")
register_pass("FuseTransposeMatmul", 3, _static_shapes_only("FuseTransposeMatmul"))
register_pass("CombineParallelMatmul", 3, _combine_parallel_matmul)
register_pass("FoldConstant.3", 3, _fold_constant)
register_pass("forgekit.ToNHWC", 0, _to_nhwc, when=lambda precision, layout: layout == "last")
register_pass("FoldConstant.layout", 0, _fold_constant, when=lambda precision, layout: layout == "last")
# every level and precision; last: ToMixedPrecision cannot type the call_tir it emits, ToNHWC moves the means
register_pass("forgekit.LongReductions", 0, _long_reductions, per_level=True)


def graph_passes(opt_level: int, *, precision: str = "float32", layout: str | None = None) -> list[Any]:
    """The Relax passes that run before lowering for ``opt_level`` and the options."""
    if opt_level not in OPT_LEVELS:
        raise UsageError(f"opt_level must be one of {sorted(OPT_LEVELS)}, got {opt_level!r}.")
    return [p.make(opt_level) if p.per_level else p.make()
            for p in GRAPH_PASSES if opt_level >= p.level and p.when(precision, layout)]
