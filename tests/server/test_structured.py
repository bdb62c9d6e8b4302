#!/usr/bin/env python3
"""Constrained generation in `waste serve`, checked by what comes out:

    test_structured.py BASE_URL API_KEY MODEL_ID [CONTEXT [SEEDS]]

Run against a model with random weights (the Rust test: the tiny Qwen3-MoE
fixture, 512 positions, a 512-token byte-level vocabulary), so nothing but
the token mask keeps the output in shape. Hundreds of generations:

  * OpenAI `response_format` {"type": "json_schema", "json_schema": {"name",
    "schema", "strict"}} on /v1/chat/completions (strict true and false,
    sampled with several seeds, greedy, streamed) and on /v1/completions;
  * OpenAI {"type": "json_object"};
  * Ollama `format` (a schema, and "json") on /api/chat and /api/generate;
  * a `grammar` field on both OpenAI routes: a string is GBNF (llama.cpp's
    convention) unless it starts with `%llguidance`, then it is Lark
    (llguidance's marker, as llama.cpp's llguidance build reads it); an
    object {"syntax": "lark" | "gbnf" | "regex", "definition": TEXT} (the
    names of OpenAI's grammar-constrained custom tools) says which.

Every schema here is bounded: each string has maxLength, a pattern or an
enum, each array maxItems, each integer a range, no free-form keys. So with
compact JSON (no whitespace between tokens: the server must not let the
model pad JSON with unbounded whitespace) an answer has at most `bound`
bytes, and as every token but a special one (which the mask never allows)
is at least a byte, max_tokens = 2 * bound + 16 always lets the grammar finish: every answer must end with
finish_reason "stop" (done_reason "stop"), json.loads, and validate with
`jsonschema` against its schema. json_object / format "json" cannot be
bounded: an answer cut by max_tokens must still be a prefix of a JSON object.

Unsatisfiable or malformed schemas and grammars must be answered 400 with a
message, on the field that carried them (OpenAI's error `param`:
"response_format" or "grammar"; Ollama's {"error": "..."}).

CONTEXT (default 512) bounds max_tokens; SEEDS (default 3) is how many
sampled answers each schema gets per route. Exits 0 printing "all structured
checks passed" when every check passed, 1 with the failures listed otherwise.
"""
import http.client
import json
import re
import sys
import urllib.parse

import jsonschema

from json_prefix import json_prefix_ok

# ------------------------------------------------------------------ the cases

OBJ = "object"


def obj(props, required=None, **extra):
    """An object of exactly these properties (required: all, unless given)."""
    return {"type": OBJ, "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False, **extra}


def integer(lo, hi):
    return {"type": "integer", "minimum": lo, "maximum": hi}


SCHEMAS = [
    ("flat", obj({"id": integer(1, 9999), "ok": {"type": "boolean"}})),
    ("enum", obj({"color": {"enum": ["red", "green", "blue"]}, "shade": integer(0, 255)})),
    ("pattern", obj({"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"}})),
    ("nested", obj({"user": obj({"name": {"type": "string", "minLength": 1, "maxLength": 12},
                                 "age": integer(0, 120)}),
                    "active": {"type": "boolean"}})),
    ("array bounds", obj({"scores": {"type": "array", "items": integer(0, 100), "minItems": 2, "maxItems": 5}})),
    ("top-level array", {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 4}),
    ("optional", obj({"title": {"type": "string", "maxLength": 10}, "subtitle": {"type": "string", "maxLength": 10},
                      "pages": integer(1, 999)}, required=["title"])),
    ("anyOf", obj({"value": {"anyOf": [integer(0, 9), {"type": "string", "maxLength": 5}, {"type": "null"}]}})),
    ("const and type list", obj({"version": {"const": 2}, "kind": {"type": ["string", "null"], "maxLength": 6}})),
    ("array of objects", obj({"items": {"type": "array", "minItems": 1, "maxItems": 3, "items": obj({
        "sku": {"type": "string", "pattern": "^[a-z]{2}[0-9]{2}$"}, "qty": integer(1, 50)})}})),
    ("exclusive bounds", obj({"n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
                              "m": {"type": "integer", "minimum": -50, "maximum": -10}})),
    ("uuid", obj({"id": {"type": "string", "format": "uuid"}})),
    ("nested arrays", {"type": "array", "maxItems": 3, "items": {"type": "array", "items": {"type": "boolean"},
                                                                 "maxItems": 3}}),
    ("enum of values", obj({"v": {"enum": [1, "two", None, True, 2.5]}})),
    ("deep", obj({"a": obj({"b": obj({"c": {"type": "array", "items": integer(-5, 5), "maxItems": 2}})})})),
    ("$defs and $ref", {"$defs": {"pt": obj({"x": integer(0, 99), "y": integer(0, 99)})},
                        **obj({"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}})}),
    ("string lengths", obj({"word": {"type": "string", "minLength": 2, "maxLength": 4},
                            "tag": {"type": "string", "pattern": "^#[a-z0-9]{1,6}$"}})),
    ("oneOf", {"oneOf": [obj({"kind": {"const": "circle"}, "r": integer(1, 9)}),
                         obj({"kind": {"const": "square"}, "side": integer(1, 9)})]}),
    ("allOf", obj({"n": {"allOf": [integer(0, 50), {"type": "integer", "minimum": 10}]}})),
    ("map with maxProperties", {"type": "object", "patternProperties": {"^[a-z]{1,3}$": {"type": "boolean"}},
                                "additionalProperties": False, "maxProperties": 3}),
    ("booleans and nulls", obj({"a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": ["boolean", "null"]}})),
    ("enum strings with escapes", obj({"s": {"enum": ["a\"b", "c\\d", "e\nf", "caf\u00e9"]}})),
]

# Longest match of each pattern used above, in characters.
PATTERN_MAX = {"^[A-Z]{3}-[0-9]{4}$": 8, "^[a-z]{2}[0-9]{2}$": 4, "^#[a-z0-9]{1,6}$": 7, "^[a-z]{1,3}$": 3,
               "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$": 10, "^[a-z]{1,6}$": 6,
               "^[A-Z][a-z]{1,7}$": 8, "^[a-z]{2,5}$": 5}
FORMAT_MAX = {"uuid": 36}


def dumps(v):
    return json.dumps(v, separators=(",", ":"))


def bound(schema, defs=None):
    """Most bytes of a compact JSON value of `schema` (the subset above)."""
    defs = schema.get("$defs", defs or {})
    if "$ref" in schema:
        return bound(defs[schema["$ref"].split("/")[-1]], defs)
    if "const" in schema:
        return len(dumps(schema["const"]).encode())
    if "enum" in schema:
        # Either escaping: \u00e9 or the UTF-8 bytes.
        return max(max(len(dumps(v)), len(json.dumps(v, ensure_ascii=False).encode())) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return max(bound(s, defs) for s in schema[key])
    if "allOf" in schema:
        return min(b for b in (bound(s, defs) for s in schema["allOf"]) if b is not None)
    types = schema.get("type")
    if isinstance(types, list):
        return max(bound(dict(schema, type=t), defs) for t in types)
    if types == "boolean":
        return 5
    if types == "null":
        return 4
    if types == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum"))
        hi = schema.get("maximum", schema.get("exclusiveMaximum"))
        return max(len(str(lo)), len(str(hi)))
    if types == "string":
        # The patterns and formats here match ASCII only (no escapes); any
        # other character is at most a 6-byte \uXXXX escape.
        if "pattern" in schema:
            return 2 + PATTERN_MAX[schema["pattern"]]
        if "format" in schema:
            return 2 + FORMAT_MAX[schema["format"]]
        return 2 + 6 * schema["maxLength"]
    if types == "array":
        n = schema["maxItems"]
        return 2 + n * bound(schema["items"], defs) + max(0, n - 1)
    if types == OBJ:
        if "patternProperties" in schema:
            (pattern, value), = schema["patternProperties"].items()
            n = schema["maxProperties"]
            return 2 + n * (2 + PATTERN_MAX[pattern] + 1 + bound(value, defs)) + max(0, n - 1)
        props = schema["properties"]
        inner = sum(len(dumps(k)) + 1 + bound(v, defs) for k, v in props.items())
        return 2 + inner + max(0, len(props) - 1)
    raise ValueError(f"no bound for {schema}")


# Grammars: (name, syntax, definition, the JSON schema every output of the
# grammar also satisfies).
GRAMMARS = [
    ("lark ops", "lark", r'''
start: "{\"op\":" op ",\"args\":[" num ("," num){0,3} "]}"
op: "\"add\"" | "\"mul\""
num: /0|[1-9][0-9]{0,2}/
''', obj({"op": {"enum": ["add", "mul"]}, "args": {"type": "array", "items": integer(0, 999),
                                                    "minItems": 1, "maxItems": 4}})),
    ("lark dates", "lark", r'''
start: "[" DATE ("," DATE){0,2} "]"
DATE: /"20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"/
''', {"type": "array", "minItems": 1, "maxItems": 3,
      "items": {"type": "string", "pattern": "^20[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])$"}}),
    ("lark with inline %json", "lark", r'''
start: "{\"tag\":" TAG ",\"data\":" data "}"
TAG: /"[a-z]{1,6}"/
data: %json {"x-guidance": {"whitespace_flexible": false}, "type": "object",
             "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
             "required": ["n"], "additionalProperties": false}
''', obj({"tag": {"type": "string", "pattern": "^[a-z]{1,6}$"}, "data": obj({"n": integer(0, 9)})})),
    ("gbnf answer", "gbnf", r'''
root   ::= "{" ws "\"answer\":" ws answer ws "}"
answer ::= "\"yes\"" | "\"no\"" | "\"maybe\""
ws     ::= [ ]?
''', obj({"answer": {"enum": ["yes", "no", "maybe"]}})),
    ("gbnf integers", "gbnf", r'''
root ::= "[" item ("," item){0,4} "]"
item ::= "-"? [1-9] [0-9]{0,2} | "0"
''', {"type": "array", "minItems": 1, "maxItems": 5, "items": integer(-999, 999)}),
    ("gbnf person", "gbnf", r'''
root ::= "{\"name\":\"" name "\",\"tags\":[" tags? "]}"
name ::= [A-Z] [a-z]{1,7}
tags ::= tag ("," tag){0,2}
tag  ::= "\"" [a-z]{2,5} "\""
''', obj({"name": {"type": "string", "pattern": "^[A-Z][a-z]{1,7}$"},
          "tags": {"type": "array", "maxItems": 3, "items": {"type": "string", "pattern": "^[a-z]{2,5}$"}}})),
    ("regex booleans", "regex", r'\[(true|false)(,(true|false)){0,3}\]',
     {"type": "array", "minItems": 1, "maxItems": 4, "items": {"type": "boolean"}}),
]
GRAMMAR_MAX_BYTES = {"lark ops": 40, "lark dates": 40, "lark with inline %json": 32, "gbnf answer": 22,
                     "gbnf integers": 26, "gbnf person": 60, "regex booleans": 26}

BAD_SCHEMAS = [
    ("minimum above maximum", {"type": "integer", "minimum": 5, "maximum": 1}),
    ("minLength above maxLength", {"type": "string", "minLength": 5, "maxLength": 2}),
    ("minItems above maxItems", {"type": "array", "minItems": 3, "maxItems": 1}),
    ("unknown type", {"type": "strin"}),
    ("look-around pattern", {"type": "string", "pattern": "(?=a)b"}),
    ("malformed pattern", {"type": "string", "pattern": "[a-"}),
    ("dangling $ref", {"$ref": "#/$defs/missing"}),
    ("required property not allowed", {"type": "object", "properties": {"a": {"type": "integer"}},
                                       "required": ["a", "b"], "additionalProperties": False}),
    ("empty enum", {"enum": []}),
    ("empty integer range", {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}),
]
BAD_RESPONSE_FORMATS = [
    {"type": "json_schema"},
    {"type": "json_schema", "json_schema": {"name": "x"}},
    {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}},
    {"type": "json_schema", "json_schema": "x"},
    {"type": "xml"},
    "json",
]
BAD_GRAMMARS = [
    ("lark unknown rule", "%llguidance {}\nstart: foo\n"),
    ("lark syntax", "%llguidance {}\nstart: (\"a\"\n"),
    ("lark without start", "%llguidance {}\nfoo: \"a\"\n"),
    ("gbnf unterminated", 'root ::= "a'),
    ("gbnf undefined rule", "root ::= missing"),
    ("gbnf without root", 'item ::= "a"'),
    ("object lark syntax", {"syntax": "lark", "definition": "start: ("}),
    ("object regex unbalanced", {"syntax": "regex", "definition": "(ab"}),
    ("object regex look-around", {"syntax": "regex", "definition": "(?=a)b"}),
    ("object unknown syntax", {"syntax": "ebnf2", "definition": "start: \"a\""}),
    ("object definition not text", {"syntax": "lark", "definition": 5}),
    ("not text or object", 5),
]

# ---------------------------------------------------------------- the checks

failures = []
counts = {"generations": 0, "stopped": 0, "cut": 0}


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


class Server:
    def __init__(self, base, key, model):
        self.url, self.key, self.model = urllib.parse.urlparse(base), key, model

    def post(self, path, body, stream=False):
        """(status, JSON body or, streamed, the list of events/lines)."""
        conn = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=300)
        conn.request("POST", path, body=json.dumps(body).encode(),
                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + self.key})
        r = conn.getresponse()
        try:
            if r.status != 200 or not stream:
                data = r.read()
                try:
                    return r.status, json.loads(data)
                except ValueError:
                    return r.status, {"unparsed": data[:300].decode(errors="replace")}
            items = []
            for line in r:
                line = line.decode().strip()
                if path.startswith("/api/"):
                    if line:
                        items.append(json.loads(line))
                elif line.startswith("data: ") and line != "data: [DONE]":
                    items.append(json.loads(line[6:]))
            return 200, items
        finally:
            conn.close()


def valid(text, schema, what, finish, limit):
    """One answer that had room to finish: it finished, parses, validates."""
    counts["generations"] += 1
    if finish != "stop":
        counts["cut"] += 1
        check(False, f"{what}: finish {finish!r} within {limit} tokens: {text[:120]!r}")
        return
    counts["stopped"] += 1
    try:
        value = json.loads(text)
    except ValueError as exc:
        check(False, f"{what}: not JSON ({exc}): {text[:200]!r}")
        return
    try:
        jsonschema.validate(value, schema, format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError as exc:
        check(False, f"{what}: {text[:200]!r} breaks the schema: {exc.message}")


class Run:
    def __init__(self, server, context, seeds):
        self.s, self.context, self.seeds = server, context, seeds
        self.msgs = [{"role": "user", "content": "JSON:"}]

    def budget(self, nbytes):
        want = 2 * nbytes + 16
        room = self.context - 48
        return want if want <= room else None

    def chat(self, extra, limit, temperature, seed):
        s, d = self.s.post("/v1/chat/completions", dict(
            model=self.s.model, messages=self.msgs, max_tokens=limit, temperature=temperature, seed=seed, **extra))
        if s != 200:
            return s, d, None, None
        c = d["choices"][0]
        return s, d, c["message"].get("content") or "", c["finish_reason"]

    def chat_stream(self, extra, limit, seed):
        s, events = self.s.post("/v1/chat/completions", dict(
            model=self.s.model, messages=self.msgs, max_tokens=limit, temperature=0.8, seed=seed, stream=True,
            **extra), stream=True)
        if s != 200:
            return s, events, None, None
        text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
        finish = [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0]["finish_reason"]]
        return s, events, text, finish[-1] if finish else None

    def completion(self, extra, limit, seed):
        s, d = self.s.post("/v1/completions", dict(
            model=self.s.model, prompt="{", max_tokens=limit, temperature=0.8, seed=seed, **extra))
        if s != 200:
            return s, d, None, None
        c = d["choices"][0]
        return s, d, c["text"], c["finish_reason"]

    def ollama(self, path, fmt, limit, seed):
        body = dict(model=self.s.model, stream=False, format=fmt,
                    options={"temperature": 0.8, "seed": seed, "num_predict": limit})
        if path == "/api/chat":
            body["messages"] = self.msgs
        else:
            body["prompt"] = "JSON:"
        s, d = self.s.post(path, body)
        if s != 200:
            return s, d, None, None
        text = d["message"]["content"] if path == "/api/chat" else d["response"]
        return s, d, text, d.get("done_reason")

    def one(self, what, schema, limit, call):
        s, d, text, finish = call()
        if s != 200:
            check(False, f"{what}: status {s} {json.dumps(d)[:200]}")
            return
        valid(text, schema, what, finish, limit)

    def schemas(self):
        for name, schema in SCHEMAS:
            limit = self.budget(bound(schema))
            if limit is None:
                print(f"SKIP schema {name}: bound {bound(schema)} bytes does not fit {self.context} positions")
                continue
            strict = {"response_format": {"type": "json_schema",
                                          "json_schema": {"name": "case", "schema": schema, "strict": True}}}
            loose = {"response_format": {"type": "json_schema", "json_schema": {"name": "case", "schema": schema}}}
            for seed in range(self.seeds):
                self.one(f"{name} strict seed {seed}", schema, limit, lambda: self.chat(strict, limit, 0.9, seed))
                self.one(f"{name} ollama chat seed {seed}", schema, limit,
                         lambda: self.ollama("/api/chat", schema, limit, seed))
            self.one(f"{name} not strict", schema, limit, lambda: self.chat(loose, limit, 0.9, 100))
            self.one(f"{name} greedy", schema, limit, lambda: self.chat(strict, limit, 0, 0))
            self.one(f"{name} streamed", schema, limit, lambda: self.chat_stream(strict, limit, 101))
            self.one(f"{name} completions", schema, limit, lambda: self.completion(strict, limit, 102))
            self.one(f"{name} ollama generate", schema, limit, lambda: self.ollama("/api/generate", schema, limit, 103))
            # The same request twice: the same answer.
            a = self.chat(strict, limit, 0.9, 7)
            b = self.chat(strict, limit, 0.9, 7)
            check(a[2] == b[2], f"{name}: the same seed gave {a[2]!r} and {b[2]!r}")

    def json_object(self):
        limit = self.context - 48
        for seed in range(self.seeds + 2):
            for what, call in (
                ("json_object", lambda: self.chat({"response_format": {"type": "json_object"}}, limit, 0.9, seed)),
                ("ollama format json", lambda: self.ollama("/api/chat", "json", limit, seed)),
            ):
                s, d, text, finish = call()
                counts["generations"] += 1
                if s != 200:
                    check(False, f"{what} seed {seed}: status {s} {json.dumps(d)[:200]}")
                elif finish == "stop":
                    counts["stopped"] += 1
                    try:
                        check(isinstance(json.loads(text), dict), f"{what} seed {seed}: not an object {text[:200]!r}")
                    except ValueError:
                        check(False, f"{what} seed {seed}: not JSON {text[:200]!r}")
                else:
                    counts["cut"] += 1
                    check(finish == "length" and json_prefix_ok(text),
                          f"{what} seed {seed}: cut ({finish}) but not a JSON object prefix: {text[:200]!r}")

    def grammars(self):
        for name, syntax, definition, schema in GRAMMARS:
            limit = self.budget(GRAMMAR_MAX_BYTES[name])
            forms = [{"grammar": {"syntax": syntax, "definition": definition}}]
            if syntax == "gbnf":
                forms.append({"grammar": definition})
            elif syntax == "lark":
                forms.append({"grammar": "%llguidance {}\n" + definition})
            for k, form in enumerate(forms):
                for seed in range(self.seeds):
                    self.one(f"grammar {name} form {k} seed {seed}", schema, limit,
                             lambda: self.chat(form, limit, 0.9, seed))
                self.one(f"grammar {name} form {k} greedy", schema, limit, lambda: self.chat(form, limit, 0, 0))
                self.one(f"grammar {name} form {k} completions", schema, limit, lambda: self.completion(form, limit, 5))
                self.one(f"grammar {name} form {k} streamed", schema, limit, lambda: self.chat_stream(form, limit, 6))

    def errors(self):
        def bad(path, body, param, what):
            s, d = self.s.post(path, body)
            check(s == 400, f"{what}: status {s}, want 400: {json.dumps(d)[:200]}")
            if path.startswith("/api/"):
                check(isinstance(d.get("error"), str) and len(d["error"]) > 10, f"{what}: error {d}")
                return
            e = d.get("error") if isinstance(d.get("error"), dict) else {}
            check(isinstance(e.get("message"), str) and len(e["message"]) > 10 and e.get("param") == param,
                  f"{what}: error {d}")

        base = dict(model=self.s.model, messages=self.msgs, max_tokens=8)
        for name, schema in BAD_SCHEMAS:
            rf = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema, "strict": True}}
            bad("/v1/chat/completions", dict(base, response_format=rf), "response_format", f"schema {name}")
            bad("/v1/completions", dict(model=self.s.model, prompt="{", max_tokens=8, response_format=rf),
                "response_format", f"completions schema {name}")
            bad("/api/chat", dict(model=self.s.model, messages=self.msgs, format=schema, stream=False), None,
                f"ollama format {name}")
        for rf in BAD_RESPONSE_FORMATS:
            bad("/v1/chat/completions", dict(base, response_format=rf), "response_format", f"response_format {rf}")
        for name, grammar in BAD_GRAMMARS:
            bad("/v1/chat/completions", dict(base, grammar=grammar), "grammar", f"grammar {name}")
            bad("/v1/completions", dict(model=self.s.model, prompt="x", max_tokens=8, grammar=grammar), "grammar",
                f"completions grammar {name}")
        # One constraint per request.
        both = dict(base, grammar={"syntax": "regex", "definition": "a+"},
                    response_format={"type": "json_object"})
        bad("/v1/chat/completions", both, "grammar", "grammar with response_format")
        # A request whose constraint is fine still gets the other errors first.
        s, d = self.s.post("/v1/chat/completions", dict(base, response_format={"type": "text"}))
        check(s == 200, f"response_format text: {s} {json.dumps(d)[:200]}")


def self_check():
    """The cases agree with themselves: each schema is a valid JSON schema,
    has a bound, and the grammars' schemas too."""
    for name, schema in SCHEMAS + [(g[0], g[3]) for g in GRAMMARS]:
        jsonschema.Draft202012Validator.check_schema(schema)
        bound(schema)
    for name, schema in BAD_SCHEMAS:
        assert isinstance(schema, dict), name


def main():
    base, key, model = sys.argv[1:4]
    context = int(sys.argv[4]) if len(sys.argv) > 4 else 512
    seeds = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    self_check()
    run = Run(Server(base, key, model), context, seeds)
    for test in (run.errors, run.schemas, run.grammars, run.json_object):
        try:
            test()
            print("ok", test.__name__, flush=True)
        except Exception as exc:  # noqa: BLE001 - a crash is a failure with its cause
            check(False, f"{test.__name__} raised {exc!r}")
    print(f"structured: {counts['generations']} generations, {counts['stopped']} finished, {counts['cut']} cut",
          flush=True)
    if failures:
        print(f"{len(failures)} failure(s)")
        sys.exit(1)
    print("all structured checks passed")


if __name__ == "__main__":
    main()
