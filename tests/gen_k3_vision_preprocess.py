#!/usr/bin/env python3
"""Reference outputs of Kimi K3's image preprocessing, by Pillow and numpy.

The release's processor (../shared/design/K3-VISION.md §2.1, `KimiK3VisionProcessor`)
turns an image into `pixel_values` [patches, 3, 14, 14] f32 and a grid:

  1. the resize plan: s = min(1, sqrt(in_patch_limit / (max(1, w // p) * max(1, h // p))),
     side / w, side / h) with side = patch_limit_on_one_side * p; new = min(max(1, trunc(w*s)),
     side); then padding to a multiple of p * merge_kernel_size;
  2. PIL `Image.resize((new_w, new_h), BICUBIC)` (an RGBA image through Pillow's own
     premultiplied RGBa round trip);
  3. an RGBA image composited onto the chessboard after the resize:
     trunc_u8(a * rgb + (1 - a) * bg), a = A / 255 in f32, squares of 8, gray 180 where
     floor(x/8) + floor(y/8) is odd, white 255 elsewhere;
  4. zero padding at the bottom and right, before normalisation;
  5. (v / 255 in f32 - mean) / std in f64 (numpy's promotion against the float64 mean and
     std arrays), cast to f32;
  6. patches in raster order, each channel-major (c, y, x).

The engine's twin is host/engine/src/vision/preprocess.rs; tests/integration/k3_vision.rs
holds it to these files bit for bit. The corpus is synthetic (gradients, noise, hard edges,
alpha ramps and holes) so it needs no image files; small `in_patch_limit` and side limits
make the downscaling paths run on small images, which is the same code as the release's
65536 / 512 at other numbers.

How to run (by hand, never by CI; offline, a second):

    python3 tests/gen_k3_vision_preprocess.py

Needs Pillow and numpy. Writes tests/fixtures/k3_vision_preprocess/: for each case
`<name>.in` (the source pixels, row-major RGB or RGBA bytes), `<name>.resized` (the RGB
bytes after resize and compositing, before padding; for the `resizes`, PIL's resize alone,
RGBA kept) and `expected.json` (per case the
source size and mode, the limits, the planned size, padding and grid, and the hash of
the little-endian f32 `pixel_values` as FNV-1a 64, with a few values spelled out).
"""

import hashlib
import json
import math
import os

import numpy as np
import PIL
from PIL import Image

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "fixtures", "k3_vision_preprocess")
PATCH, MERGE = 14, 2
MEAN = np.array([0.5, 0.5, 0.5])
STD = np.array([0.5, 0.5, 0.5])
SQUARE, WHITE, GRAY = 8, 255, 180

# (name, width, height, mode, in_patch_limit, patch_limit_on_one_side)
CASES = [
    ("tiny_rgb", 1, 1, "RGB", 65536, 512),
    ("odd_rgb", 13, 7, "RGB", 65536, 512),
    ("one_patch_rgb", 14, 14, "RGB", 65536, 512),
    ("merge_rgb", 28, 28, "RGB", 65536, 512),
    ("wide_rgb", 100, 37, "RGB", 65536, 512),
    ("square_rgb", 354, 354, "RGB", 65536, 512),
    ("down_rgb", 211, 97, "RGB", 16, 512),          # patch budget: 15 x 6 patches > 16
    ("down_tall_rgb", 61, 250, "RGB", 24, 512),
    ("side_rgb", 300, 40, "RGB", 65536, 8),         # one side past 8 patches
    ("shrink_hard_rgb", 257, 263, "RGB", 4, 512),   # strong downscale: wide bicubic support
    ("alpha_rgba", 97, 61, "RGBA", 65536, 512),
    ("alpha_down_rgba", 180, 120, "RGBA", 20, 512),
    ("alpha_holes_rgba", 45, 45, "RGBA", 6, 512),
    ("opaque_rgba", 40, 30, "RGBA", 65536, 512),
]

# Resizes to explicit sizes, both sides of the boundary where Pillow 13 swaps the order of
# its two passes (the height shrinking by more than twice the width's pixels), and upscales:
# (name, width, height, mode, new width, new height).
RESIZES = [
    ("order_h", 40, 60, "RGB", 30, 40),
    ("order_v", 40, 61, "RGB", 30, 40),
    ("order_wide", 61, 40, "RGB", 40, 30),
    ("up_w", 30, 30, "RGB", 40, 20),
    ("up_h_rgba", 30, 30, "RGBA", 20, 40),
    ("up_both_rgba", 50, 100, "RGBA", 60, 20),
    ("tiny_up", 17, 5, "RGB", 3, 9),
]


def source(name, w, h, mode):
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little"))
    y, x = np.mgrid[0:h, 0:w]
    r = (255 * x / max(w - 1, 1)).astype(np.int64)
    g = (255 * y / max(h - 1, 1)).astype(np.int64)
    b = ((x // 5 + y // 3) % 2) * 255                      # hard edges: ringing of the bicubic lobes
    noise = rng.integers(0, 256, size=(h, w))
    rgb = np.stack([r, (g + noise) // 2, np.where(noise < 40, 255 - b, b)], axis=-1)
    if mode == "RGB":
        return rgb.clip(0, 255).astype(np.uint8)
    if name.startswith("opaque"):
        a = np.full((h, w), 255)
    else:
        a = (255 * (x + y) / max(w + h - 2, 1)).astype(np.int64)
        a = np.where(rng.integers(0, 10, size=(h, w)) == 0, 0, a)   # holes
        a = np.where((x // 9) % 3 == 0, 255, a)                      # opaque stripes
    return np.concatenate([rgb, a[..., None]], axis=-1).clip(0, 255).astype(np.uint8)


def plan(w, h, limit, side_patches):
    side = side_patches * PATCH
    s = min(1.0, math.sqrt(limit / (max(1, w // PATCH) * max(1, h // PATCH))), side / w, side / h)
    nw, nh = min(max(1, int(w * s)), side), min(max(1, int(h * s)), side)
    unit = PATCH * MERGE
    return nw, nh, (unit - nw % unit) % unit, (unit - nh % unit) % unit


def chessboard(w, h):
    y, x = np.mgrid[0:h, 0:w]
    return np.where((x // SQUARE + y // SQUARE) % 2 == 1, GRAY, WHITE).astype(np.uint8)


def preprocess(pixels, mode, limit, side_patches):
    h, w = pixels.shape[:2]
    nw, nh, pw, ph = plan(w, h, limit, side_patches)
    im = Image.fromarray(pixels, mode)
    im = im.resize((nw, nh), Image.Resampling.BICUBIC)
    arr = np.asarray(im)
    if mode == "RGBA":
        a = arr[..., 3:4].astype(np.float32) / np.float32(255)
        bg = chessboard(nw, nh)[..., None].astype(np.float32)
        arr = (a * arr[..., :3].astype(np.float32) + (np.float32(1) - a) * bg).astype(np.uint8)
    resized = np.ascontiguousarray(arr[..., :3])
    padded = np.zeros((nh + ph, nw + pw, 3), dtype=np.uint8)
    padded[:nh, :nw] = resized
    x = padded.astype(np.float32) / np.float32(255)
    x = ((x.astype(np.float64) - MEAN) / STD).astype(np.float32)
    gh, gw = (nh + ph) // PATCH, (nw + pw) // PATCH
    pv = x.reshape(gh, PATCH, gw, PATCH, 3).transpose(0, 2, 4, 1, 3).reshape(gh * gw, 3, PATCH, PATCH)
    return resized, np.ascontiguousarray(pv), (nw, nh, pw, ph, gh, gw)


def fnv1a64(data):
    """The engine's file identity (host/engine/src/files.rs `Fnv`): FNV-1a, 64 bit."""
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for name, w, h, mode, limit, side in CASES:
        pixels = source(name, w, h, mode)
        resized, pv, (nw, nh, pw, ph, gh, gw) = preprocess(pixels, mode, limit, side)
        with open(os.path.join(OUT, f"{name}.in"), "wb") as f:
            f.write(pixels.tobytes())
        with open(os.path.join(OUT, f"{name}.resized"), "wb") as f:
            f.write(resized.tobytes())
        flat = pv.astype("<f4").reshape(-1)
        cases.append({
            "name": name, "width": w, "height": h, "mode": mode,
            "in_patch_limit": limit, "patch_limit_on_one_side": side,
            "resized": [nw, nh], "pad": [pw, ph], "grid": [gh, gw],
            "pixel_values_fnv1a64": fnv1a64(flat.tobytes()),
            "pixel_values_first": [float(v) for v in flat[:8]],
            "pixel_values_len": int(flat.size),
        })
        print(f"{name}: {w}x{h} {mode} -> {nw}x{nh} + pad {pw},{ph} -> grid {gh}x{gw}")
    resizes = []
    for name, w, h, mode, nw, nh in RESIZES:
        pixels = source(name, w, h, mode)
        out = np.asarray(Image.fromarray(pixels, mode).resize((nw, nh), Image.Resampling.BICUBIC))
        with open(os.path.join(OUT, f"{name}.in"), "wb") as f:
            f.write(pixels.tobytes())
        with open(os.path.join(OUT, f"{name}.resized"), "wb") as f:
            f.write(np.ascontiguousarray(out).tobytes())
        resizes.append({"name": name, "width": w, "height": h, "mode": mode, "resized": [nw, nh]})
    doc = {
        "generator": "tests/gen_k3_vision_preprocess.py",
        "versions": {"Pillow": PIL.__version__, "numpy": np.__version__},
        "patch_size": PATCH, "merge_kernel_size": MERGE, "image_mean": MEAN.tolist(), "image_std": STD.tolist(),
        "chessboard": {"square": SQUARE, "white": WHITE, "gray": GRAY, "on_top_left": True},
        "cases": cases,
        "resizes": resizes,
    }
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT}")


if __name__ == "__main__":
    main()
