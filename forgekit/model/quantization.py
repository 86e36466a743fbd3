"""The quantization half of the façade: calibrate, quantize, report, split (stages in :mod:`forgekit.quantize`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import UsageError
from ..options import QuantizeOptions

if TYPE_CHECKING:
    from .facade import _State


class QuantizationMixin:
    """What :class:`forgekit.IRModule` offers for post-training quantization; it holds no state of its own."""

    _mod: Any
    _state: _State
    input_nodes: Any

    @property
    def calibration(self) -> Any:
        """The :class:`forgekit.quantize.calibrate.Calibration` of the last :meth:`calibrate` (None before)."""
        return self._state.calibration

    @property
    def float_mod(self) -> Any:
        """The Relax module as it was before :meth:`quantize` (None before)."""
        return self._state.float_mod

    @property
    def is_calibrated(self) -> bool:
        return self._state.calibration is not None

    @property
    def is_quantized(self) -> bool:
        return self._state.quantization is not None

    @property
    def quantization(self) -> dict[str, Any] | None:
        """The quantization parameters (dtypes, method, type, per-layer scales), None before :meth:`quantize`."""
        return self._state.quantization

    @property
    def quantization_report(self) -> dict[str, Any] | None:
        """Per-layer fp32-vs-quantized agreement from ``quantize(max_accuracy_drop=...)`` or
        :meth:`accuracy_report`."""
        return self._state.quantization_report

    def calibrate(self, calib_data: Any, reset: bool = True, use_cuda: bool = True) -> None:
        """Run the model on ``calib_data`` and record activation statistics for :meth:`quantize`.

        ``calib_data``: an iterable of samples (one array, a tuple of arrays in input order, or a dict
        by input name), a stacked array, or a ``.npy``/``.npz`` file or folder path.  ``reset=False`` adds
        to the statistics of an earlier call.  ``use_cuda`` runs on a CUDA GPU when there is one (CPU
        otherwise, silently).  See :mod:`forgekit.quantize`.
        """
        from ..quantize.calibrate import calibrate

        if self.is_quantized:
            raise UsageError("The model is already quantized: calibrate the float model before quantize().")
        previous = None if reset else self._state.calibration
        self._state.calibration = calibrate(self._mod, self.input_nodes, calib_data, previous=previous,
                                            use_cuda=use_cuda)
        if isinstance(calib_data, (str, bytes)) or hasattr(calib_data, "__fspath__"):
            self._state.inputs_read.append(str(calib_data))

    def quantize(self, activation_dtype: str = "int8", kernel_dtype: str | None = None, bias_dtype: str | None = None,
                 per_channel: bool = False, calib_method: str = "average", quant_type: str = "any", *,
                 percentile: float = 99.0, smoothing: float | None = 0.75,
                 max_accuracy_drop: float | None = None, quantize_depthwise: bool = False,
                 bias_correction: bool = True) -> None:
        """Post-training quantization to integer conv2d/conv1d/matmul (int32 accumulation), in place.

        ``activation_dtype``: ``int8`` (symmetric) or ``uint8`` (asymmetric, with a zero point; a padded
        conv's border reads the zero point, an exact 0.0).  Weights
        are symmetric int8, per output channel with ``per_channel``; ``bias_correction`` (static) removes the
        mean output error of weight rounding using the calibrated input means.  ``calib_method``:
        ``average``, ``entropy``, ``minmax`` or ``percentile`` (``percentile``=99).  ``quant_type``:
        ``static`` (needs :meth:`calibrate`), ``dynamic`` (activation ranges at run time) or ``any`` (static
        when calibrated).  ``smoothing`` (SmoothQuant's alpha, None to disable) balances outlier input
        channels of matmuls into their weights.  ``max_accuracy_drop`` (e.g. 0.01) keeps the most sensitive
        layers in fp32 until the output agreement on the calibration samples is within the budget; the
        per-layer report is then in :attr:`quantization_report`.  Depthwise convolutions stay fp32 (faster
        and more accurate on this compiler's kernels) unless ``quantize_depthwise``.
        """
        options = QuantizeOptions(activation_dtype=activation_dtype, kernel_dtype=kernel_dtype, bias_dtype=bias_dtype,
                                  per_channel=per_channel, calib_method=calib_method, quant_type=quant_type,
                                  percentile=percentile, smoothing=smoothing, max_accuracy_drop=max_accuracy_drop,
                                  quantize_depthwise=quantize_depthwise, bias_correction=bias_correction)
        self.quantize_with(options)

    def quantize_with(self, options: QuantizeOptions) -> None:
        """:meth:`quantize` with a :class:`~forgekit.options.QuantizeOptions` (what the CLI builds)."""
        from ..quantize import quantize

        if self.is_quantized:
            raise UsageError("The model is already quantized.")
        calibration = self._state.calibration
        if options.max_accuracy_drop is not None:
            from ..quantize.report import quantize_within_budget

            mod, info, report = quantize_within_budget(self._mod, calibration, options.max_accuracy_drop,
                                                       options.rewrite_options())
            self._state.quantization_report = report
        else:
            mod, info = quantize(self._mod, calibration, **options.rewrite_options())
        self._state.float_mod, self._mod, self._state.quantization = self._mod, mod, info

    def accuracy_report(self, samples: Sequence[list[np.ndarray]] | None = None) -> dict[str, Any]:
        """Per-layer cosine/SNR and output agreement of the quantized model against its float original (on
        the calibration samples unless ``samples`` are given)."""
        from ..quantize.report import accuracy_report

        if not self.is_quantized:
            raise UsageError("The model is not quantized: call ir.quantize() first.")
        return accuracy_report(self._state.float_mod, self._mod, self._state.quantization or {},
                               self._state.calibration, samples)

    def split_tensors(self, force: bool = False, min_elements: int | None = None) -> None:
        """Split large conv weight tensors in two along the output channels (Forge's ``split_tensors``).

        Weights of ``min_elements`` or more (default :data:`forgekit.quantize.split.MIN_ELEMENTS`) are split.
        Raises when calibration data exists (the op numbering would no longer match) unless ``force``,
        which drops the calibration.
        """
        from ..quantize import split

        if self._state.calibration is not None and not force:
            raise UsageError("split_tensors would invalidate the calibration data: call it before calibrate(), "
                             "or pass force=True to drop the calibration.")
        if self.is_quantized:
            raise UsageError("split_tensors must run before quantize().")
        self._mod = split.split_tensors(self._mod, split.MIN_ELEMENTS if min_elements is None else min_elements)
        self._state.calibration = None
        self._state.split = True
