#!/usr/bin/env python3
"""Images through `waste serve` with the official OpenAI and Anthropic clients:

    test_images.py BASE_URL API_KEY MODEL_ID FIXTURE_DIR

against a server on a container converted (f32) from tests/fixtures/tiny-kimi_k3-vision.
The fixture's reference (tests/gen_k3_vision_tower.py, reference.json `chat`) is the
pure-torch model's greedy answer to a user message holding image_a.png, then
image_b.png, then "Which one is taller?", rendered with the fixture's ChatML
template and the images' markup before the text. Checked:

  - OpenAI: `image_url` parts with base64 data URLs (before and after the text part:
    the images go first either way) answer with the reference's text; usage counts
    every image row as a prompt token; an http(s) URL is refused with 400 and not
    fetched; a data URL that is not an image is a 400 naming the part.
  - Anthropic: `image` blocks with base64 sources answer with the same text;
    count_tokens equals the run's input_tokens; a `url` source is refused.
  - Ollama: a message's `images` (the client base64-encodes the files) in
    /api/chat, and `images` beside the prompt in /api/generate, answer with
    the same text, prompt_eval_count counting every image row; images with
    `raw` are refused.

Exits 0 printing "all image checks passed", 1 with the failures listed otherwise.
"""
import base64
import json
import pathlib
import sys

import anthropic
import ollama
import openai

url, key, model, fixture = sys.argv[1:5]
fixture = pathlib.Path(fixture)
ref = json.loads((fixture / "reference.json").read_text())
chat = ref["chat"]
text = ref["cli"]["text"]
want = chat["greedy_text"]
n = len(chat["greedy_ids"])
expanded = len(chat["prompt_ids"]) + sum(
    ref["images"][k]["features_shape"][0] - 1 for k in ("a", "b"))
b64 = {k: base64.b64encode((fixture / f"image_{k}.png").read_bytes()).decode() for k in ("a", "b")}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


oa = openai.OpenAI(base_url=f"{url}/v1", api_key=key)
image_parts = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64[k]}"}} for k in ("a", "b")]
for name, parts in (("images first", image_parts + [{"type": "text", "text": text}]),
                    ("text first", [{"type": "text", "text": text}] + image_parts)):
    r = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": parts}],
                                   max_tokens=n, temperature=0)
    got = r.choices[0].message.content
    check(got == want, f"openai {name}: {got!r} != {want!r}")
    check(r.usage.prompt_tokens == expanded, f"openai {name}: prompt_tokens {r.usage.prompt_tokens} != {expanded}")

for bad_url, what in (("https://example.com/cat.png", "not fetched"), ("data:image/png;base64,aGVsbG8=", "image")):
    try:
        oa.chat.completions.create(model=model, max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": bad_url}}, {"type": "text", "text": "hi"}]}])
        failures.append(f"openai: {bad_url[:30]} was accepted")
    except openai.BadRequestError as e:
        check(what in str(e) and "messages[0].content[0].image_url.url" in str(e), f"openai {bad_url[:30]}: {e}")

an = anthropic.Anthropic(base_url=url, api_key=key)
blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64[k]}} for k in ("a", "b")]
msgs = [{"role": "user", "content": blocks + [{"type": "text", "text": text}]}]
r = an.messages.create(model=model, max_tokens=n, messages=msgs, extra_body={"temperature": 0})
got = "".join(b.text for b in r.content if b.type == "text")
check(got == want, f"anthropic: {got!r} != {want!r}")
count = an.messages.count_tokens(model=model, messages=msgs)
# input_tokens leave out what the prefix cache supplied (the text before an
# image may be held from an earlier request).
prompt = r.usage.input_tokens + (r.usage.cache_read_input_tokens or 0)
check(count.input_tokens == prompt == expanded,
      f"anthropic: count_tokens {count.input_tokens}, prompt {r.usage}, expected {expanded}")
try:
    an.messages.create(model=model, max_tokens=2, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
    failures.append("anthropic: a url source was accepted")
except anthropic.BadRequestError as e:
    check("not fetched" in str(e), f"anthropic url source: {e}")

ol = ollama.Client(host=url, headers={"Authorization": "Bearer " + key}, timeout=120)
files = [(fixture / f"image_{k}.png").read_bytes() for k in ("a", "b")]
options = {"temperature": 0, "num_predict": n}
r = ol.chat(model=model, messages=[{"role": "user", "content": text, "images": files}], options=options)
check(r.message.content == want, f"ollama chat: {r.message.content!r} != {want!r}")
check(r.prompt_eval_count == expanded, f"ollama chat: prompt_eval_count {r.prompt_eval_count} != {expanded}")
r = ol.generate(model=model, prompt=text, images=files, options=options)
check(r.response == want, f"ollama generate: {r.response!r} != {want!r}")
check(r.prompt_eval_count == expanded, f"ollama generate: prompt_eval_count {r.prompt_eval_count} != {expanded}")
try:
    ol.generate(model=model, prompt=text, images=files, raw=True, options=options)
    failures.append("ollama: images with raw were accepted")
except ollama.ResponseError as e:
    check(e.status_code == 400 and "raw must be false" in str(e), f"ollama raw with images: {e}")

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("all image checks passed")
