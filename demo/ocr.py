"""forgekit's demo: read the text of ``demo/text.png`` with PP-OCRv4, compiled for any CPU of this machine's
architecture (forgekit's default, portable target; this CPU loads the best level of it).

The two pretrained models (a DB text detector and a CTC text recognizer) ship in the
``rapidocr-onnxruntime`` wheel; forgekit compiles each into an artifact, runs them on the image and prints
the text it read, each model's latency next to onnxruntime's on the same inputs, and where the artifacts
are.  ``./dev.sh demo`` installs what it needs and runs it; by hand::

    python demo/ocr.py [--image demo/text.png] [--out compile_output/demo] [--runs 20]

Pre- and post-processing are the models' own (PaddleOCR's): inputs scaled to [-1, 1], the detector's
probability map thresholded at 0.3 into text boxes, each box resized to 48 pixels high for the recognizer,
and its per-column classes decoded greedily (CTC) with the dictionary stored in the model.
"""

from __future__ import annotations

import argparse
import importlib.util
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REC_HEIGHT, REC_WIDTH = 48, 320


def read_png(path: Path) -> np.ndarray:
    """An 8-bit RGB/RGBA/grey PNG as an ``H x W x 3`` uint8 array (zlib and numpy only: no imaging library)."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{path} is not a PNG file")
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
    width, height, depth, color, _, _, interlace = header  # type: ignore[misc]
    channels = {0: 1, 2: 3, 6: 4}.get(color)
    if depth != 8 or channels is None or interlace:
        raise SystemExit(f"{path}: only 8-bit, non-interlaced grey/RGB/RGBA PNGs are supported")
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), np.int32)
    for y in range(height):  # undo each scanline's filter (PNG spec, section 9)
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        up = out[y - 1] if y else np.zeros_like(line)
        if kind == 0:
            out[y] = line
        elif kind == 2:
            out[y] = (line + up) & 255
        else:
            row = np.zeros_like(line)
            for x in range(line.size):
                left = row[x - channels] if x >= channels else 0
                corner = up[x - channels] if x >= channels else 0
                if kind == 1:
                    row[x] = (line[x] + left) & 255
                elif kind == 3:
                    row[x] = (line[x] + (left + up[x]) // 2) & 255
                else:  # Paeth
                    p = left + up[x] - corner
                    pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - corner)
                    pred = left if pa <= pb and pa <= pc else (up[x] if pb <= pc else corner)
                    row[x] = (line[x] + pred) & 255
            out[y] = row
    image = out.astype(np.uint8).reshape(height, width, channels)
    return np.repeat(image, 3, axis=2) if channels == 1 else image[:, :, :3]


def models() -> tuple[Path, Path]:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the demo's models come from the rapidocr-onnxruntime wheel: "
                         "pip install --no-deps rapidocr-onnxruntime==1.4.4 (./dev.sh demo does)")
    folder = Path(list(spec.submodule_search_locations)[0]) / "models"
    return folder / "ch_PP-OCRv4_det_infer.onnx", folder / "ch_PP-OCRv4_rec_infer.onnx"


def to_input(image: np.ndarray) -> np.ndarray:
    """HWC uint8 -> NCHW float32 in [-1, 1] (both PP-OCR models use mean 0.5, std 0.5)."""
    return ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].copy()


def text_boxes(prob: np.ndarray, threshold: float = 0.3) -> list[tuple[int, int, int, int]]:
    """(top, bottom, left, right) of each text line in the detector's probability map: rows where text is
    found form lines; each line's columns, with gaps under a line height bridged, its extent.  DB's
    boxes are shrunk text kernels: they are grown back by the unclip ratio (1.6) like PaddleOCR does."""
    mask = prob > threshold
    rows = np.flatnonzero(mask.any(axis=1))
    boxes = []
    if not rows.size:
        return boxes
    bands = np.split(rows, np.flatnonzero(np.diff(rows) > 1) + 1)
    for band in bands:
        top, bottom = int(band[0]), int(band[-1]) + 1
        cols = np.flatnonzero(mask[top:bottom].any(axis=0))
        left, right = int(cols[0]), int(cols[-1]) + 1
        height, width = bottom - top, right - left
        grow = int(round(height * width * 1.6 / (2 * (height + width))))  # DB's unclip distance
        boxes.append((max(0, top - grow), min(prob.shape[0], bottom + grow), max(0, left - grow),
                      min(prob.shape[1], right + grow)))
    return boxes


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of an HWC image (numpy only)."""
    ys = np.linspace(0, image.shape[0] - 1, height)
    xs = np.linspace(0, image.shape[1] - 1, width)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, image.shape[0] - 1), np.minimum(x0 + 1, image.shape[1] - 1)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    img = image.astype(np.float32)
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.uint8)


def line_input(image: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    """A text line as the recognizer's 1x3x48x320 input: 48 pixels high, padded (white) to 320 wide."""
    top, bottom, left, right = box
    crop = image[top:bottom, left:right]
    width = min(REC_WIDTH, max(1, int(round(crop.shape[1] * REC_HEIGHT / crop.shape[0]))))
    canvas = np.full((REC_HEIGHT, REC_WIDTH, 3), 255, np.uint8)
    canvas[:, :width] = resize(crop, REC_HEIGHT, width)
    return to_input(canvas)


def ctc_decode(probs: np.ndarray, characters: list[str]) -> str:
    """Greedy CTC: best class per column, repeats merged, blanks (class 0) dropped; the last class is a space."""
    best = probs.argmax(axis=-1).reshape(-1)
    out, previous = [], 0
    for index in best:
        if index != previous and index != 0:
            out.append(characters[index - 1] if index <= len(characters) else " ")
        previous = index
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", type=Path, default=HERE / "text.png")
    parser.add_argument("--out", type=Path, default=Path("compile_output") / "demo")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)

    import onnx
    import onnxruntime as ort

    import forgekit
    from forgekit.runtime import Engine

    image = read_png(args.image)
    height, width = (-(-image.shape[0] // 32) * 32, -(-image.shape[1] // 32) * 32)  # the detector wants /32
    padded = np.full((height, width, 3), 255, np.uint8)
    padded[:image.shape[0], :image.shape[1]] = image
    det_path, rec_path = models()
    characters = dict((p.key, p.value) for p in onnx.load(str(rec_path)).metadata_props)["character"].splitlines()

    artifacts = {}
    for name, path, shape in (("det", det_path, [1, 3, height, width]), ("rec", rec_path, [1, 3, REC_HEIGHT, REC_WIDTH])):
        start = time.perf_counter()
        result = forgekit.from_onnx(path, {"x": shape}).compile(output_path=args.out / name, force_overwrite=True)
        artifacts[name] = result.path
        build = result.metadata["build"]
        where = f"{build['target_name']} ({', '.join(build['levels'])})" if build["levels"] else build["target_name"]
        print(f"compiled {path.name} ({'x'.join(map(str, shape))}) for {where} in {time.perf_counter() - start:.1f} s")

    det, rec = Engine(artifacts["det"]), Engine(artifacts["rec"])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    det_ort = ort.InferenceSession(str(det_path), options, providers=["CPUExecutionProvider"])
    rec_ort = ort.InferenceSession(str(rec_path), options, providers=["CPUExecutionProvider"])

    x_det = to_input(padded)
    boxes = text_boxes(det.infer(x_det)[0][0, 0][:image.shape[0], :image.shape[1]])
    lines = [line_input(image, box) for box in boxes]
    texts = [ctc_decode(rec.infer(x)[0], characters) for x in lines]
    # the whole pipeline again with onnxruntime: its own boxes, its own recognition
    boxes_ort = text_boxes(det_ort.run(None, {"x": x_det})[0][0, 0][:image.shape[0], :image.shape[1]])
    texts_ort = [ctc_decode(rec_ort.run(None, {"x": line_input(image, box)})[0], characters) for box in boxes_ort]

    print(f"\ntext read from {args.image} ({len(boxes)} line(s) found):")
    for text, box in zip(texts, boxes):
        print(f"  {text!r}  (rows {box[0]}-{box[1]}, columns {box[2]}-{box[3]})")
    same = "the same text" if texts == texts_ort else f"different text: {texts_ort}"
    print(f"onnxruntime reads {same}")

    # Timed as `forgekit bench` does: a fresh worker process running both runtimes in alternating blocks
    # with the same threads; timed here, in-process, onnxruntime's spinning threads (left over from
    # reading the text) took cores from forgekit's pool and the ratio depended on the order of the calls.
    from forgekit.evaluate.bench import benchmark_artifact

    level = f", forgekit level {det.level}" if det.level else ""
    print(f"\nlatency, median of {args.runs} runs, {ort.get_device()} (this machine{level}; forgekit bench):")
    for name, key, path in (("detector", "det", det_path), ("recognizer", "rec", rec_path)):
        timing = benchmark_artifact(artifacts[key], path, runs=args.runs, memory=False)
        ours, theirs = timing.forgekit.median_ms, timing.onnxruntime.median_ms
        verdict = f"{theirs / ours:.2f}x faster" if ours <= theirs else f"{ours / theirs:.2f}x slower"
        print(f"  {name:10s}  forgekit {ours:7.2f} ms   onnxruntime {theirs:7.2f} ms   (forgekit {verdict})")
    print(f"\nartifacts: {artifacts['det']}  {artifacts['rec']}")
    print("run one again: forgekit run", artifacts["rec"], "--random")
    return 0 if texts and all(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
