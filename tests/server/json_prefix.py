"""Shared by the contract tests of constrained decoding (test_structured.py,
test_ollama.py): whether a JSON text cut short could still be completed."""

import re


def json_prefix_ok(s, top_object=True):
    """Whether `s` can still be completed to valid JSON (an object when
    top_object): what a constrained generation cut by its token limit must be."""
    stack, state, i, n = [], "value", 0, len(s)
    lit, num = "", ""
    number = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
    while i < n:
        c = s[i]
        if state == "string" or state == "key":
            if c == "\\":
                if i + 1 >= n:
                    return True
                e = s[i + 1]
                if e == "u":
                    hexes = s[i + 2: i + 6]
                    if not re.fullmatch(r"[0-9a-fA-F]*", hexes):
                        return False
                    i += 2 + len(hexes)
                    continue
                if e not in "\"\\/bfnrt":
                    return False
                i += 2
                continue
            if c == '"':
                state = "colon" if state == "key" else "after"
            elif ord(c) < 0x20:
                return False
            i += 1
            continue
        if state == "literal":
            if not lit or c != lit[0]:
                return False
            lit = lit[1:]
            i += 1
            if not lit:
                state = "after"
            continue
        if state == "number":
            if c in "0123456789+-.eE":
                num += c
                i += 1
                continue
            if not number.fullmatch(num):
                return False
            state = "after"
            continue
        if c in " \t\n\r":
            i += 1
            continue
        if state in ("value", "value_or_close"):
            if state == "value_or_close" and c == "]":
                stack.pop()
                state = "after"
            elif top_object and not stack and c != "{":
                return False
            elif c == "{":
                stack.append("{")
                state = "key_or_close"
            elif c == "[":
                stack.append("[")
                state = "value_or_close"
            elif c == '"':
                state = "string"
            elif c in "-0123456789":
                state, num = "number", c
            elif c in "tfn":
                state, lit = "literal", {"t": "rue", "f": "alse", "n": "ull"}[c]
            else:
                return False
            i += 1
            continue
        if state in ("key_or_close", "key_only"):
            if state == "key_or_close" and c == "}":
                stack.pop()
                state = "after"
            elif c == '"':
                state = "key"
            else:
                return False
            i += 1
            continue
        if state == "colon":
            if c != ":":
                return False
            state = "value"
            i += 1
            continue
        if state == "after":
            if not stack:
                return False  # text after the top-level value
            if c == ",":
                state = "key_only" if stack[-1] == "{" else "value"
            elif (c == "}" and stack[-1] == "{") or (c == "]" and stack[-1] == "["):
                stack.pop()
            else:
                return False
            i += 1
            continue
        return False
    if state == "number":
        return any(number.fullmatch(num + tail) for tail in ("", "0", ".0", "0.0"))
    return True
