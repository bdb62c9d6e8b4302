"""Template variables through the Python binding (examples/python/waste.py).

Renders every Qwen3 `vars_cases` entry of tests/fixtures/chat_templates/
expected.json (transformers' own apply_chat_template output with
`enable_thinking`) through `Session.render_chat_template(template_vars=...)`
and requires the same text; `apply_chat_template` must give the same tokens as
tokenizing nothing but what the model would see (its length is checked against
the rendering with and without the variable). Prints one line per checked case.

WASTE_LIB="${CARGO_TARGET_DIR:-target}/release/libwaste.so" python3 check_template_vars.py MODEL.waste EXPECTED.json
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import waste  # noqa: E402


def main(model_path, expected_path):
    expected = json.load(open(expected_path))
    engine = waste.Engine()
    model = engine.open(model_path)
    session = engine.session(model)
    checked = 0
    for case in expected["models"]["qwen3"]["vars_cases"]:
        if case["tools"]:
            continue
        messages = expected["conversations"][case["conversation"]]
        got = session.render_chat_template(messages, case["add_generation_prompt"], case["vars"])
        if got != case["text"]:
            print(f"MISMATCH {case['conversation']} {case['vars_json']}:\n{got!r}\n{case['text']!r}")
            return 1
        tokens = session.apply_chat_template(messages, case["add_generation_prompt"], case["vars"])
        plain = session.apply_chat_template(messages, case["add_generation_prompt"])
        think_off = case["vars"].get("enable_thinking") is False and case["add_generation_prompt"]
        if think_off and not len(tokens) > len(plain):
            print(f"enable_thinking=false did not reach apply_chat_template: {len(tokens)} <= {len(plain)}")
            return 1
        checked += 1
        print(f"ok {case['conversation']} add_generation_prompt={case['add_generation_prompt']} "
              f"{case['vars_json']}: {len(tokens)} tokens")
    try:
        session.render_chat_template([{"role": "user", "content": "x"}], True, {"messages": []})
        print("a variable named `messages` was accepted")
        return 1
    except waste.WasteError as e:
        print(f"rejected: {e}")
    print(f"checked {checked} cases")
    session.close()
    engine.close_model(model)
    engine.close()
    return 0 if checked > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
