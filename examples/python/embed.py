"""Embedding WASTE from Python: plan, open, stream with progress, save/load,
then one chat turn through the model's template with top log-probabilities.

WASTE_LIB="${CARGO_TARGET_DIR:-target}/release/libwaste.so" python3 embed.py MODEL.waste STATE_FILE
(WASTE_LIB names the C library built by `cargo build --release -p waste-ffi`.)
"""

import json
import sys

import waste


def main(model_path, state_path):
    engine = waste.Engine()
    print(f"waste {waste.version()}")
    plan = engine.plan(model_path)
    print(f"plan: floor {plan.floor}, recommended {plan.recommended} bytes")
    model = engine.open(model_path, budget=plan.recommended)
    session = engine.session(model)
    seen = {"tokens": 0, "reused": 0, "prefetched": 0, "missed": 0, "bytes": 0, "text": b""}

    def on_token(ev):
        seen["tokens"] += 1
        seen["reused"] += ev.experts_reused
        seen["prefetched"] += ev.experts_prefetched
        seen["missed"] += ev.experts_missed
        seen["bytes"] += ev.bytes_read
        seen["text"] += ev.text[:ev.text_len]
        print(f"[{seen['tokens']} tokens, experts reused {seen['reused']}, prefetched {seen['prefetched']}, "
              f"read {seen['missed']}, "
              f"{seen['bytes']} bytes read, {ev.ms_io:.2f} of {ev.ms_total:.2f} ms in I/O]", file=sys.stderr)
        return True

    done = session.generate(session.tokenize("And God said"), on_token, max_tokens=16)
    print(seen["text"].decode())
    print(f"generated {done.n_tokens} tokens")
    saved = session.position()
    session.save_state(state_path)
    session.reset()
    session.load_state(state_path)
    loaded = session.position()
    print(f"state: saved at {saved}, loaded at {loaded}")
    # A chat turn: the model's own template, a greedy reply with the three
    # most likely alternatives of each token.
    session.reset()
    messages = [{"role": "user", "content": "And God said"}]
    rendered = session.render_chat_template(messages)
    chat = session.apply_chat_template(messages)
    print(f"chat prompt: {len(rendered.encode())} bytes, {len(chat)} tokens")
    reply = []
    session.generate(chat, lambda ev: reply.append((ev.token, ev.alternatives())) or True,
                     max_tokens=4, top_logprobs=3)
    first, alternatives = reply[0]
    print(f"first reply token {first}; alternatives:"
          + "".join(f" {t} ({lp:.4f})" for t, lp in alternatives))
    # Structured output: every token is one the schema allows, so the
    # answer is JSON that validates, whatever the model knows of JSON.
    session.reset()
    schema = {"type": "object", "properties": {"book": {"enum": ["Genesis", "Exodus"]},
                                               "chapter": {"type": "integer", "minimum": 1, "maximum": 50}},
              "required": ["book", "chapter"], "additionalProperties": False}
    answer = []
    session.generate(session.tokenize("The book and chapter: "),
                     lambda ev: answer.append(ev.text[:ev.text_len]) or True,
                     max_tokens=40, temperature=0.8, seed=1, constraint=("json_schema", json.dumps(schema)))
    print("json: " + b"".join(answer).decode())
    session.close()
    engine.close_model(model)
    engine.close()
    return 0 if saved == loaded and seen["tokens"] == done.n_tokens else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
