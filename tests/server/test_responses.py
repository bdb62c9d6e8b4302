#!/usr/bin/env python3
"""OpenAI's Responses API (`/v1/responses`) through the official `openai` client:

    test_responses.py BASE KEY basic MODEL
    test_responses.py BASE KEY tools MODEL CASE

basic (bible-moe): an answer equals the chat completion of the same
conversation (greedy; `instructions` as the system message; usage equal to the
chat usage), whether `input` is a string or items; the SDK's `responses.stream`
helper accepts the event stream (`response.created` first, sequence numbers in
order, the text deltas joined equal to the whole answer, which it rebuilds);
an answer cut at `max_output_tokens` is `incomplete`; `previous_response_id`
and item references are 400s naming their field.

tools (a scripted tool server, CASE of tool_call_expected.json): the model's
call comes back as a `function_call` item with the arguments transformers'
template shows, its reasoning as a `reasoning` item, whole and streamed; the
call's output sent back as `function_call_output` renders the prompt
transformers renders (its token count).

Exits 0 printing "all responses checks passed", 1 with the failures listed.
"""
import json
import pathlib
import sys

import openai

BASE, KEY, MODE, MODEL = sys.argv[1:5]
client = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=120)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL", what, flush=True)


def streamed(**kw):
    """The stream's events (checked in order) and the response it ends with."""
    events = []
    with client.responses.stream(**kw) as stream:
        for event in stream:
            events.append(event)
        # The helper rebuilds a completed response; an incomplete one (cut
        # at max_output_tokens) is its last event's, as with OpenAI's own.
        final = stream.get_final_response() if events[-1].type == "response.completed" else events[-1].response
    check(events and events[0].type == "response.created", f"first event {events[:1]}")
    numbers = [e.sequence_number for e in events]
    check(numbers == list(range(len(events))), f"sequence numbers {numbers}")
    check(events[-1].type in ("response.completed", "response.incomplete"), f"last event {events[-1].type}")
    return events, final


def basic():
    chat = client.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Answer."}, {"role": "user", "content": "In the beginning"}])
    want = chat.choices[0].message.content
    r = client.responses.create(model=MODEL, instructions="Answer.", input="In the beginning",
                                max_output_tokens=8, temperature=0)
    check(r.output_text == want, f"answer {r.output_text!r} != chat {want!r}")
    check(r.usage.input_tokens == chat.usage.prompt_tokens and r.usage.output_tokens == chat.usage.completion_tokens,
          f"usage {r.usage} != chat {chat.usage}")
    check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, f"total {r.usage}")
    cut = chat.choices[0].finish_reason == "length"
    check(r.status == ("incomplete" if cut else "completed"), f"status {r.status} for {chat.choices[0].finish_reason}")
    if cut:
        check(r.incomplete_details is not None and r.incomplete_details.reason == "max_output_tokens",
              f"incomplete_details {r.incomplete_details}")
    check([o.type for o in r.output] == ["message"] and r.output[0].role == "assistant", f"output {r.output}")
    items = client.responses.create(model=MODEL, max_output_tokens=8, temperature=0, input=[
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Answer."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "In the beginning"}]}])
    check(items.output_text == want, f"items answer {items.output_text!r} != {want!r}")

    events, final = streamed(model=MODEL, instructions="Answer.", input="In the beginning", max_output_tokens=8,
                             temperature=0)
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    check(deltas == want, f"stream deltas {deltas!r} != {want!r}")
    check(final.output_text == want, f"stream final {final.output_text!r}")
    check(final.usage is not None and final.usage.output_tokens == r.usage.output_tokens, f"stream usage {final.usage}")
    kinds = [e.type for e in events]
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        check(kind in kinds, f"stream has no {kind}: {kinds}")

    # text.format: the answer is held to the schema by the token mask.
    schema = {"type": "object", "properties": {"verse": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["verse"], "additionalProperties": False}
    shaped = client.responses.create(model=MODEL, input="Which verse?", max_output_tokens=40, temperature=1.0,
                                     text={"format": {"type": "json_schema", "name": "verse", "schema": schema,
                                                      "strict": True}})
    try:
        verse = json.loads(shaped.output_text)
        check(isinstance(verse.get("verse"), int) and 1 <= verse["verse"] <= 9 and len(verse) == 1,
              f"text.format: {verse}")
    except ValueError:
        check(False, f"text.format: not JSON {shaped.output_text!r}")

    short = client.responses.create(model=MODEL, input="In the beginning", max_output_tokens=2, temperature=0)
    check(short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens",
          f"cut short: {short.status} {short.incomplete_details}")
    check(short.usage.output_tokens == 2, f"cut short usage {short.usage}")

    for kw, param in (({"previous_response_id": "resp_1", "input": "hi"}, "previous_response_id"),
                      ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]")):
        try:
            client.responses.create(model=MODEL, **kw)
            check(False, f"{param}: accepted")
        except openai.BadRequestError as e:
            check(e.body is not None and e.body.get("param") == param, f"{param}: {e.body}")


def tools(case):
    E = json.loads((pathlib.Path(__file__).parent / "tool_call_expected.json").read_text())["cases"][case]
    fns = [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
            "parameters": t["function"]["parameters"]} for t in E["tools"]]
    ask = [{"role": m["role"], "content": m["content"]} for m in E["ask"]]
    kw = dict(model=MODEL, input=ask, tools=fns, temperature=0, max_output_tokens=len(E["answer_ids"]) + 16)
    r = client.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    check(len(calls) == 1, f"output {r.output}")
    check(not [o for o in r.output if o.type == "message"], f"the call was left as text: {r.output}")
    if calls:
        check(calls[0].name == "get_weather" and calls[0].arguments == E["arguments"] and calls[0].call_id,
              f"call {calls[0]}")
    if E["reasoning"]:
        reasoning = [o for o in r.output if o.type == "reasoning"]
        text = "".join(c.text for o in reasoning for c in (o.content or []))
        check(text == E["reasoning"], f"reasoning {text!r}, want {E['reasoning']!r}")
        check(r.usage.output_tokens_details.reasoning_tokens > 0 or case == "gpt_oss", f"usage {r.usage}")
    check(r.status == "completed", f"status {r.status}")

    events, final = streamed(**kw)
    got = [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in final.output]
    want = [(o.type, getattr(o, "name", None), getattr(o, "arguments", None)) for o in r.output]
    check(got == want, f"stream output {got} != {want}")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    check(args == E["arguments"], f"stream argument deltas {args!r}")

    if calls:
        c = calls[0]
        back = ask + [{"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments},
                      {"type": "function_call_output", "call_id": c.call_id, "output": E["tool_result"]}]
        r2 = client.responses.create(model=MODEL, input=back, tools=fns, temperature=0, max_output_tokens=4)
        check(r2.usage.input_tokens == E["round_trip_prompt_tokens"],
              f"round trip: {r2.usage.input_tokens} prompt tokens, transformers {E['round_trip_prompt_tokens']}")
        # The reasoning item sent back is taken (rendered as the template
        # renders earlier reasoning).
        with_reasoning = ask + [o.model_dump(exclude_none=True) for o in r.output] + back[-1:]
        r3 = client.responses.create(model=MODEL, input=with_reasoning, tools=fns, temperature=0, max_output_tokens=4)
        check(r3.usage.input_tokens >= r2.usage.input_tokens, f"with reasoning: {r3.usage}")


for test in ((basic,) if MODE == "basic" else (lambda: tools(sys.argv[5]),)):
    try:
        test()
    except Exception as exc:  # noqa: BLE001 - a crash is a failure with its cause
        check(False, f"raised {exc!r}")
if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("all responses checks passed")
