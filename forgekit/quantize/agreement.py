"""How well a quantized model's outputs agree with its float original's (the accuracy budget's measure).

* ``[N, classes]`` scores: top-1 agreement.
* Everything else: the worst sample's cosine (:func:`worst`), and for outputs with channels (rank >= 3, axis 1
  longer than one) also the worst sample's mean cosine of the channels taken one by one; an output's
  agreement is the lower of the two.

Why the worst sample: a mean over the samples lets one badly served input hide behind the others.  NudeNet
320n int8 on 6 calibration photos: judged by the mean, a budget of 0.01 kept one conv in fp32 and left the worst
photo's class scores at cosine 0.879; judged by the worst photo it keeps the two convs after the stem, and
that photo is at 0.975.  The report keeps the means (``cosine``, ``channel_cosine``) beside the worst (``worst_cosine``,
``worst_channel_cosine``); the agreement is the lower of the worst two.

Why per channel: an output whose channels differ in scale by orders of magnitude is judged by its largest
channels alone under a whole-tensor cosine.  A YOLOv8 detector's ``[N, 4 + classes, anchors]`` puts box
coordinates in pixels (hundreds) next to sigmoid class scores (below one): NudeNet 320n int8 (4 held-out
photos) had a whole-output cosine of 0.9996-0.9999 while the class scores alone were at 0.93-0.97, and a
budget measured on the whole cosine kept no layer in fp32.  The channel mean sees every channel as much as
any other (class scores, a segmenter's class maps, a transformer's tokens).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two tensors (1.0 for two equal all-zero ones)."""
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    den = np.linalg.norm(a) * np.linalg.norm(b)
    return float(a @ b / den) if den > 0 else float(np.array_equal(a, b))


def channel_cosine(a: np.ndarray, b: np.ndarray) -> float | None:
    """Mean over the channels (axis 1) of each channel's cosine; None for outputs without channels."""
    if a.ndim < 3 or a.shape[1] < 2:
        return None
    x = np.moveaxis(a.astype(np.float64), 1, 0).reshape(a.shape[1], -1)
    y = np.moveaxis(b.astype(np.float64), 1, 0).reshape(b.shape[1], -1)
    nx, ny = np.linalg.norm(x, axis=1), np.linalg.norm(y, axis=1)
    den = nx * ny
    dot = np.einsum("ij,ij->i", x, y)
    per = np.where(den > 0, dot / np.where(den > 0, den, 1.0), (nx == 0) & (ny == 0))
    return float(per.mean())


def is_classifier(outputs: Sequence[np.ndarray]) -> bool:
    """``[N, classes]`` scores, except L2-normalized rows: those are embeddings, compared by cosine."""
    first = outputs[0]
    if first.ndim != 2 or first.shape[1] < 2:
        return False
    norms = np.linalg.norm(first.astype(np.float64), axis=1)
    return not np.allclose(norms, 1.0, atol=1e-3)


#: the share of the samples the agreement may ignore at its worst end, once there are more than
#: 1 / WORST_SHARE of them: one degenerate calibration image (all black: outputs of noise only) among hundreds
#: should not decide, while with a handful the worst is the one judged
WORST_SHARE = 0.05


def worst(values: Sequence[float]) -> float:
    """The worst value that counts: the lowest, or with more than 1 / WORST_SHARE samples the lowest once the
    worst WORST_SHARE of them are set aside."""
    ordered = sorted(values)
    return float(ordered[int((len(ordered) - 1) * WORST_SHARE)])


def output_entries(ref: Sequence[Sequence[np.ndarray]], got: Sequence[Sequence[np.ndarray]]) -> list[dict[str, Any]]:
    """Per output (``ref[sample][output]``): its mean and worst cosine over the samples, the mean and worst
    channel cosine where it has channels, top-1 agreement where it is classifier-shaped, and ``agreement``, the
    one judged (top-1 agreement, or the worst sample's lower cosine)."""
    entries = []
    for k in range(len(ref[0])):
        a, b = [r[k] for r in ref], [g[k] for g in got]
        cosines = [cosine(x, y) for x, y in zip(a, b)]
        entry: dict[str, Any] = {"index": k, "cosine": round(float(np.mean(cosines)), 6),
                                 "worst_cosine": round(worst(cosines), 6)}
        channels = [channel_cosine(x, y) for x, y in zip(a, b)]
        if all(c is not None for c in channels):
            entry["channel_cosine"] = round(float(np.mean(channels)), 6)
            entry["worst_channel_cosine"] = round(worst(channels), 6)  # type: ignore[arg-type]
        if is_classifier(a):
            entry["top1_agreement"] = round(float(np.mean([np.mean(x.argmax(-1) == y.argmax(-1))
                                                           for x, y in zip(a, b)])), 6)
            entry["agreement"] = entry["top1_agreement"]
        else:
            entry["agreement"] = min(entry["worst_cosine"], entry.get("worst_channel_cosine", 1.0))
        entries.append(entry)
    return entries


def agreement(entries: Sequence[dict[str, Any]]) -> float:
    """The model's agreement: its worst output's."""
    return min(e["agreement"] for e in entries)
