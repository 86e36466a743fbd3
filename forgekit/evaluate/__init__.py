"""Judging an artifact against onnxruntime: correctness (:mod:`.verify`, :mod:`.compare`) and speed
(:mod:`.bench`), with one onnxruntime reference (:mod:`.reference`)."""
