#!/usr/bin/env python3
"""Image files and what Pillow decodes them to, as Kimi K3's processor takes them.

The processor (../shared/design/K3-VISION.md §2.1 step 1) opens an image with PIL and keeps an
RGB image as it is, converts one with an alpha band or a `transparency` entry to RGBA, and
anything else to RGB; EXIF orientation is not applied (PIL's `open` does not). This script
writes small files of each kind with Pillow and the bytes Pillow decodes them to, for
tests/integration/k3_vision.rs to hold host/engine/src/vision/decode.rs to: lossless formats
(PNG in RGB, RGBA, L, LA, palette with and without transparency; GIF; lossless WebP) bit for
bit, JPEG to the decoder difference it measures (Pillow decodes with libjpeg-turbo, the
engine with zune-jpeg).

How to run (by hand, never by CI; offline, a second): python3 tests/gen_k3_vision_decode.py

Needs Pillow and numpy. Writes tests/fixtures/k3_vision_decode/: `<name>.<ext>`,
`<name>.pixels` (row-major RGB or RGBA bytes) and expected.json.
"""

import io
import json
import os

import numpy as np
import PIL
from PIL import Image

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "fixtures", "k3_vision_decode")


def pattern(w, h, seed):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), rng.integers(0, 256, (h, w))], -1)
    return rgb.astype(np.uint8)


def processor_mode(im):
    """The release processor's rule."""
    if im.mode == "RGB":
        return im
    if "A" in im.getbands() or "transparency" in im.info:
        return im.convert("RGBA")
    return im.convert("RGB")


def cases():
    w, h = 37, 23
    rgb = pattern(w, h, 1)
    alpha = (np.mgrid[0:h, 0:w][1] * 255 // (w - 1)).astype(np.uint8)
    rgba = np.concatenate([rgb, alpha[..., None]], -1)
    gray = rgb[..., 0]
    yield "png_rgb", "png", Image.fromarray(rgb, "RGB"), {}
    yield "png_rgba", "png", Image.fromarray(rgba, "RGBA"), {}
    yield "png_l", "png", Image.fromarray(gray, "L"), {}
    yield "png_la", "png", Image.fromarray(np.stack([gray, alpha], -1), "LA"), {}
    pal = Image.fromarray(rgb, "RGB").quantize(16)
    yield "png_p", "png", pal, {}
    yield "png_p_transparent", "png", pal, {"transparency": 3}
    yield "gif", "gif", pal, {}
    yield "gif_transparent", "gif", pal, {"transparency": 5}
    yield "webp_lossless_rgb", "webp", Image.fromarray(rgb, "RGB"), {"lossless": True}
    yield "webp_lossless_rgba", "webp", Image.fromarray(rgba, "RGBA"), {"lossless": True}
    yield "jpeg_420", "jpeg", Image.fromarray(rgb, "RGB"), {"quality": 90, "subsampling": 2}
    yield "jpeg_444", "jpeg", Image.fromarray(rgb, "RGB"), {"quality": 90, "subsampling": 0}
    yield "jpeg_gray", "jpeg", Image.fromarray(gray, "L"), {"quality": 90}


def main():
    os.makedirs(OUT, exist_ok=True)
    out = []
    for name, fmt, im, opts in cases():
        buf = io.BytesIO()
        im.save(buf, format=fmt.upper() if fmt != "jpeg" else "JPEG", **opts)
        data = buf.getvalue()
        with open(os.path.join(OUT, f"{name}.{fmt}"), "wb") as f:
            f.write(data)
        dec = processor_mode(Image.open(io.BytesIO(data)))
        arr = np.asarray(dec)
        with open(os.path.join(OUT, f"{name}.pixels"), "wb") as f:
            f.write(np.ascontiguousarray(arr).tobytes())
        out.append({"name": name, "file": f"{name}.{fmt}", "mode": dec.mode, "width": dec.width,
                    "height": dec.height, "exact": fmt != "jpeg"})
        print(name, fmt, dec.mode, dec.size, len(data), "bytes")
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"generator": "tests/gen_k3_vision_decode.py", "versions": {"Pillow": PIL.__version__},
                   "cases": out}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
