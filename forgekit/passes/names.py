"""Names are never code: the identifiers a build derives from ONNX names are C identifiers.

TVM names a kernel's parameters after the Relax variables they come from, and a Relax function's parameters
and symbolic dimensions after the ONNX inputs and ``dim_param`` s.  LLVM takes any name, but generated C and
CUDA source does not: the ONNX model zoo's ResNet-50 (input ``gpu_0/data_0``) failed in nvcc with
``kernels.cu(91): error: expected a ")"`` (``float* __restrict__ gpu_0/data_0_ptr``), and exporters write
``input.1``, ``serving_default_x:0``, ``images/0``, ``batch size``, ``seq-len``.  This pass renames, before
lowering, every Relax function's parameters and the symbolic dimensions they define to collision-free C
identifiers (:func:`c_identifiers`); the artifact's metadata keeps the ONNX names (it is written from the
model description, never from the IR), and executables are called positionally.

Why not TVM's own: no pass in ``relax.transform`` renames variables, and codegen (``CodeGenC::AllocVarID``)
only makes names unique, it does not make them valid.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import tvm
from tvm import relax

#: the function attribute that keeps the parameters' names as they were (the ONNX input names)
ORIGINAL_NAMES = "forgekit.param_names"

#: C, C++ and CUDA keywords and the CUDA built-in variables and types a generated kernel may use: a parameter
#: named like one is renamed (``int`` -> ``int_``)
RESERVED = frozenset("""
alignas alignof and asm auto bool break case catch char char16_t char32_t char8_t class const constexpr const_cast
continue decltype default delete do double dynamic_cast else enum explicit export extern false float for friend goto
if inline int long mutable namespace new noexcept not nullptr operator or private protected public register
reinterpret_cast restrict return short signed sizeof static static_assert static_cast struct switch template this
thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while xor
_Bool _Complex _Imaginary threadIdx blockIdx blockDim gridDim warpSize half half2 nv_bfloat16 int8_t int16_t
int32_t int64_t uint8_t uint16_t uint32_t uint64_t size_t main
""".split())


def c_identifier(name: str) -> str:
    """``name`` as a C identifier: every other character (``/ : . -``, spaces, non-ASCII) becomes ``_``, a leading
    digit (or an empty name) gets a ``_`` before it, a reserved word a ``_`` after it."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not out or out[0].isdigit():
        out = "_" + out
    return out + "_" if out in RESERVED else out


def c_identifiers(names: Iterable[str], taken: Iterable[str] = ()) -> list[str]:
    """:func:`c_identifier` of each name, made unique (``x``, ``x_1``, ...) among themselves and ``taken``;
    a name that is already a valid, unreserved identifier keeps its spelling unless an earlier one took it."""
    used = set(taken)
    out = []
    for name in names:
        base = c_identifier(name)
        candidate, n = base, 0
        while candidate in used:
            n += 1
            candidate = f"{base}_{n}"
        used.add(candidate)
        out.append(candidate)
    return out


def _symbols(params: list[Any]) -> list[Any]:
    """The symbolic dimensions (tirx Vars) of ``params``' shapes, in order of appearance."""
    seen: list[Any] = []
    for param in params:
        shape = getattr(getattr(param, "ty", None), "shape", None)
        for dim in getattr(shape, "values", None) or []:
            if isinstance(dim, tvm.tirx.Var) and not any(dim.same_as(s) for s in seen):
                seen.append(dim)
    return seen


def sanitize_function(func: Any) -> Any:
    """``func`` with its parameters and the symbolic dimensions they define named as C identifiers."""
    symbols = _symbols(list(func.params))
    new_symbols = c_identifiers([s.name for s in symbols])
    renamed = {s: tvm.tirx.Var(n, s.ty) for s, n in zip(symbols, new_symbols) if n != s.name}
    if renamed:
        func = func.bind_symbolic_vars(renamed)
    names = c_identifiers([p.name for p in func.params], taken=new_symbols)
    if all(p.name == n for p, n in zip(func.params, names)):
        return func
    params = [relax.Var(n, p.ty) for p, n in zip(func.params, names)]
    bound = func.bind_params(dict(zip(func.params, params)))
    new = relax.Function(params, bound.body, bound.ret_ty, bound.is_pure, bound.attrs, bound.span)
    # what messages raised inside the model name the inputs by (forgekit/passes/index_checks.py)
    return new.with_attr(ORIGINAL_NAMES, [p.name for p in func.params])


def sanitize_names(mod: tvm.IRModule) -> tvm.IRModule:
    """:func:`sanitize_function` on every Relax function of ``mod``."""
    out = None
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            new = sanitize_function(func)
            if new is not func:
                out = out or mod.clone()
                out[gv] = new
    return out or mod


def sanitize_names_pass() -> Any:
    """:func:`sanitize_names` as a module pass (graph passes, every level and target)."""

    @tvm.transform.module_pass(opt_level=0, name="forgekit.SanitizeNames")
    def _pass(mod: Any, _ctx: Any) -> Any:
        return sanitize_names(mod)

    return _pass
