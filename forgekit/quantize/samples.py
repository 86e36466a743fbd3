"""Calibration data: user samples -> lists of input arrays checked against the model's inputs.

Accepted per sample: one array (single-input models), a tuple/list of arrays (input order) or a dict
``{input name: array}``.  An array missing only the batch axis gets one.  On the CLI a path is a ``.npy``
file (samples stacked on the first axis, one input), an ``.npz`` file (one stacked array per input name,
or ``arr_0``... for a single input) or a folder of such files (each one sample or stack).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..errors import InputError, UsageError


def _fits(shape: tuple[int, ...], expected: Sequence[int | str]) -> bool:
    return len(shape) == len(expected) and all(isinstance(e, str) or int(e) == s for s, e in zip(shape, expected))


def _check(name: str, array: Any, shape: Sequence[int | str], dtype: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim == len(shape) - 1 and _fits((1, *array.shape), shape):
        array = array[None]
    if not _fits(array.shape, shape):
        want = "x".join(str(d) for d in shape)
        raise InputError(f"Calibration sample for input '{name}' has shape {'x'.join(map(str, array.shape))}; "
                         f"the model expects {want}.")
    if str(array.dtype) != dtype:
        raise InputError(f"Calibration sample for input '{name}' has dtype {array.dtype}; the model expects {dtype} "
                         f"(convert with .astype('{dtype}')).")
    return np.asarray(array, order="C")  # np.ascontiguousarray makes a 0-d array 1-d


def normalize(sample: Any, names: Sequence[str], shapes: Sequence[Sequence[int | str]],
              dtypes: Sequence[str]) -> list[np.ndarray]:
    """One calibration sample as the list of model inputs (shape and dtype checked)."""
    if isinstance(sample, dict):
        missing = [n for n in names if n not in sample]
        if missing:
            raise InputError(f"Calibration sample lacks input(s) {', '.join(missing)} (it has "
                             f"{', '.join(map(str, sample))}).")
        values = [sample[n] for n in names]
    elif isinstance(sample, (tuple, list)):
        values = list(sample)
    else:
        values = [sample]
    if len(values) != len(names):
        raise InputError(f"Calibration sample has {len(values)} array(s); the model has {len(names)} input(s) "
                         f"({', '.join(names)}).")
    return [_check(n, v, s, d) for n, v, s, d in zip(names, values, shapes, dtypes)]


def _split_stack(array: np.ndarray, shape: Sequence[int | str]) -> list[np.ndarray]:
    """A stacked array: one sample per leading entry (each keeps or gets its batch axis).

    With a symbolic batch dimension a ``[32, 3, 224, 224]`` array also fits the input as one batch of 32,
    but calibration counts samples: it is 32 samples of batch 1 (as for a batch-1 model)."""
    symbolic_batch = bool(shape) and isinstance(shape[0], str)
    if array.ndim == len(shape) and (symbolic_batch or not _fits(array.shape, shape)):
        return [a[None] for a in array]  # [S, C, H, W]: one sample of batch 1 per entry
    if array.ndim == len(shape) + 1:
        return list(array)
    return [array]


def _from_file(path: Path, names: Sequence[str], shapes: Sequence[Sequence[int | str]]) -> list[Any]:
    try:
        loaded = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise UsageError(f"Cannot read calibration data '{path}': {exc}.") from None
    if isinstance(loaded, np.ndarray):
        return _split_stack(loaded, shapes[0]) if len(names) == 1 else [tuple(loaded)]
    with loaded:
        keys = list(loaded.keys())
        if all(n in keys for n in names):
            stacks = [_split_stack(loaded[n], s) for n, s in zip(names, shapes)]
            return [dict(zip(names, parts)) for parts in zip(*stacks)]
        if len(names) == 1:
            return [a for k in keys for a in _split_stack(loaded[k], shapes[0])]
        raise InputError(f"Calibration file '{path}' has arrays {', '.join(keys)}; name them after the model inputs "
                         f"({', '.join(names)}).")


def from_path(path: str | Path, names: Sequence[str], shapes: Sequence[Sequence[int | str]]) -> list[Any]:
    """Load calibration samples from a ``.npy``/``.npz`` file or a folder of them."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"Calibration data '{path}' does not exist: pass a .npy/.npz file or a folder of them.")
    files = sorted(f for f in p.iterdir() if f.suffix in (".npy", ".npz")) if p.is_dir() else [p]
    if not files:
        raise UsageError(f"Calibration folder '{path}' has no .npy or .npz files.")
    samples = [s for f in files for s in _from_file(f, names, shapes)]
    if not samples:
        raise UsageError(f"Calibration data '{path}' holds no samples.")
    return samples


def iterate(data: Any, names: Sequence[str], shapes: Sequence[Sequence[int | str]],
            dtypes: Sequence[str]) -> Iterator[list[np.ndarray]]:
    """Yield every sample of ``data`` (an iterable, a stacked array or a path) as checked input lists."""
    if isinstance(data, (str, Path)):
        data = from_path(data, names, shapes)
    elif isinstance(data, np.ndarray):
        data = _split_stack(data, shapes[0]) if len(names) == 1 else [data]
    elif isinstance(data, dict):
        data = [data]
    if not isinstance(data, Iterable):
        raise UsageError(f"Calibration data must be an iterable of samples, an array or a path, not {type(data).__name__}.")
    for sample in data:
        yield normalize(sample, names, shapes, dtypes)
