"""Kimi K3 image input from Python: each image through the model's vision
tower, then one chat turn holding them (their markup in the message's
"media", before its text), answered greedily.

WASTE_LIB="${CARGO_TARGET_DIR:-target}/release/libwaste.so" python3 image.py MODEL.waste N QUESTION IMAGE...
"""

import sys

import waste


def main(model_path, n, question, images):
    engine = waste.Engine()
    session = engine.session(engine.open(model_path))
    media = []
    for path in images:
        image = session.attach_image(path)
        print(f"image {path}: {image['width']}x{image['height']}, {image['tokens']} positions")
        media.append(image["markup"])
    prompt = session.apply_chat_template([{"role": "user", "content": question, "media": media}])
    ids = []

    def on_token(ev):
        ids.append(ev.token)
        return True

    session.generate(prompt, on_token, max_tokens=n, temperature=0.0)
    print("tokens: " + " ".join(map(str, ids)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:])
