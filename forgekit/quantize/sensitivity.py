"""What each quantized layer costs the outputs, measured: the ranking of the accuracy budget.

The budget (``max_accuracy_drop``) keeps layers in fp32 until the outputs agree with the float model.  It used
to keep them in the order of their input's quantization noise (:func:`.report.local_snr`), which says how
much a layer's *input* loses, not how much the *outputs* do: a noisy input into a branch that barely
reaches the outputs went first (``tests/unit/test_quantize_sensitivity.py``).  Which layers cost the outputs
most depends on the model: on NudeNet 320n (YOLOv8n, 64 convs, 6 calibration photos) two stem convs cost
0.016 and 0.007 of the output agreement alone and no other more than 0.002; keeping those two in fp32
moved the class scores on 3 held-out photos of people from cosine 0.988-0.994 to 0.995-0.998.

So each layer is measured alone, in int8 with every other in fp32, by its drop in output agreement on the
calibration samples, and the costliest go to fp32 first.  Building a model per layer (64 builds for
NudeNet) would take an hour; :func:`.rewrite.gated_rewrite` builds every planned op both ways into one
model and picks per op at run time, so the ranking and the search over how many layers to keep cost
runs, not builds.  (onnxruntime's ``qdq_loss_debug`` and NNCF's accuracy-aware search measure the same
thing on their own graphs; neither runs forgekit's kernels, whose int8 arithmetic this measures.)
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from . import graph
from .agreement import agreement, output_entries
from .calibrate import build_runner, flatten_outputs


class Mixer:
    """One build of ``float_mod`` with every op of ``plans`` computable in int8 or fp32, per run."""

    def __init__(self, float_mod: Any, plans: dict[int, Any], samples: Sequence[list[np.ndarray]]) -> None:
        from .rewrite import gated_rewrite

        self.ops = len(graph.describe(float_mod["main"]))
        self.planned = sorted(plans)
        self.samples = list(samples)
        self._run, _ = build_runner(gated_rewrite(float_mod, plans, self.ops), use_cuda=False)
        self.reference = self.outputs(())

    def outputs(self, int8: Iterable[int]) -> list[list[np.ndarray]]:
        """The model's outputs on every sample with the ops ``int8`` in int8 and the rest in fp32."""
        gates = np.zeros(self.ops, np.float32)
        gates[list(int8)] = 1.0
        results = []
        for inputs in self.samples:
            results.append(flatten_outputs(self._run([*inputs, gates])))
        return results

    def drop(self, int8: Iterable[int]) -> float:
        """``1 - agreement`` of the outputs with ``int8`` quantized against the float ones (rounded as the
        report rounds it)."""
        return round(1.0 - agreement(output_entries(self.reference, self.outputs(int8))), 6)

    def solo_drops(self) -> dict[int, float]:
        """Each planned op's drop with it alone in int8."""
        return {i: self.drop((i,)) for i in self.planned}
