//! The answer shapes of a generation that ended in tool calls, non-streamed
//! and streamed, built from engine events as the engine thread sends them.
//! (The shipped test models write no tool calls, so the end-to-end tests
//! cover the request side; these cover the answer side.)

use std::time::Instant;

use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use waste_host::{Completion, StopReason, TokenEvent};

use super::*;
use crate::driver::{frames, Clock};
use crate::state::RequestLog;
use crate::worker::{Event, PromptFacts};

const CALL: &str =
    "Let me look.\n<tool_call>\n{\"name\": \"verse\", \"arguments\": {\"book\": \"Genesis\"}}\n</tool_call>";

/// A prompt of 7 tokens, 3 of them resumed from the prefix cache.
const PROMPT: PromptFacts = PromptFacts { tokens: 7, cached: 3, opens_reasoning: false };

fn reply(chat: bool, tools: bool) -> Reply {
    reply_thinking(chat, tools, false)
}

/// A reply whose template writes reasoning in `<think>` blocks when
/// `thinks`.
fn reply_thinking(chat: bool, tools: bool, thinks: bool) -> Reply {
    Reply {
        chat,
        id: "chatcmpl-test".into(),
        created: 1,
        model: "m".into(),
        system_fingerprint: "fp_test".into(),
        logprobs: false,
        reading: Reading::new(tools.then_some("[]"), false, thinks),
        include_usage: true,
        live: Live::default(),
        opens_reasoning: false,
        index: 0,
        choices: 1,
        completed: 0,
    }
}

/// The whole answer of one choice.
fn whole(r: &Reply, c: Completion, raw: &str, prompt: PromptFacts, texts: &[TokenTexts]) -> String {
    let answer =
        Answer { completion: c, prompt, texts: texts.to_vec(), raw: raw.into(), clock: Clock::start(Instant::now()) };
    full_answer(r, &[answer])
}

fn completion(text: &str, tokens: usize, stop_reason: StopReason) -> Completion {
    Completion {
        tokens: (0..tokens as u32).collect(),
        text: text.into(),
        stop_reason,
        logprobs: vec![0.0; tokens],
        top_logprobs: vec![Vec::new(); tokens],
    }
}

fn event(text: &str) -> TokenEvent {
    TokenEvent { token: 0, text: text.into(), logprob: 0.0, top_logprobs: Vec::new(), stats: Default::default() }
}

/// The chunks of the SSE stream the driver sends for `events`.
fn chunks(reply: Reply, events: UnboundedReceiver<Event>) -> impl futures_util::Stream<Item = String> {
    frames(events, reply, PROMPT, Clock::start(Instant::now()), RequestLog::none(), None)
        .map(|c| c.unwrap_or_else(|e| match e {}))
}

/// Runs the SSE stream over `pieces` (one token each) and the completion;
/// returns the parsed `data:` payloads, `[DONE]` as the string "[DONE]".
async fn stream(reply: Reply, pieces: &[&str], done: Completion) -> Vec<Value> {
    let (tx, rx) = unbounded_channel();
    for p in pieces {
        tx.send(Event::Token(event(p), None)).unwrap();
    }
    let raw = done.text.clone();
    tx.send(Event::Done { completion: done, prompt: PROMPT, texts: Vec::new(), raw }).unwrap();
    let text: String = chunks(reply, rx).collect::<Vec<_>>().await.concat();
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let payload = e.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data event: {e:?}"));
            serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.into()))
        })
        .collect()
}

/// The chunks' finish reasons that are set.
fn finishes(chunks: &[Value]) -> Vec<&Value> {
    chunks.iter().filter_map(|c| c["choices"].get(0).map(|ch| &ch["finish_reason"])).filter(|f| !f.is_null()).collect()
}

#[test]
fn tool_call_answer_has_tool_calls_and_finish_reason_tool_calls() {
    let v: Value =
        serde_json::from_str(&whole(&reply(true, true), completion(CALL, 20, StopReason::Eos), CALL, PROMPT, &[]))
            .unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Let me look.");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "verse");
    let args: Value = serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["book"], "Genesis");
    assert_eq!(v["usage"]["completion_tokens"], 20);
    assert_eq!(v["usage"]["total_tokens"], 27);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
}

#[test]
fn tool_call_text_without_tools_in_the_request_stays_text() {
    let v: Value =
        serde_json::from_str(&whole(&reply(true, false), completion(CALL, 20, StopReason::Eos), CALL, PROMPT, &[]))
            .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["message"]["content"], CALL);
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
}

#[tokio::test]
async fn streamed_tool_call_is_one_tool_calls_delta_then_finish_then_usage() {
    let pieces = [
        "Let me look.\n",
        "<tool_call>\n",
        "{\"name\": \"verse\", ",
        "\"arguments\": {\"book\": \"Genesis\"}}\n</tool_call>",
    ];
    assert_eq!(pieces.concat(), CALL);
    let events = stream(reply(true, true), &pieces, completion(CALL, 4, StopReason::Eos)).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = &events[..events.len() - 1];
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    // With tools, text is held back until the end: no raw tag is streamed.
    let content: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(content, "Let me look.");
    let calls: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"].get("tool_calls")).collect();
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0][0]["index"], 0);
    assert_eq!(calls[0][0]["function"]["name"], "verse");
    assert_eq!(finishes(chunks), ["tool_calls"]);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    assert_eq!(usage["usage"]["prompt_tokens"], 7);
    assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 3);
    // Every chunk but the usage chunk says `usage: null`, as OpenAI's do.
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["usage"].is_null()));
}

#[tokio::test]
async fn streamed_text_with_tools_but_no_call_is_sent_whole_at_the_end() {
    let events =
        stream(reply(true, true), &["In the ", "beginning"], completion("In the beginning", 2, StopReason::Length))
            .await;
    let chunks = &events[..events.len() - 1];
    let content: String =
        chunks.iter().filter_map(|c| c["choices"].get(0)?["delta"]["content"].as_str().map(str::to_string)).collect();
    assert_eq!(content, "In the beginning");
    assert_eq!(finishes(chunks), ["length"]);
}

/// Regression (the legacy completions listed each token's alternatives in
/// alphabetical order, serde_json's map order): most likely first, as the
/// engine reports them, whole and streamed; every answer carries
/// `system_fingerprint`.
#[tokio::test]
async fn legacy_completion_top_logprobs_are_most_likely_first() {
    let texts =
        vec![TokenTexts { token: "z".into(), top: vec![("z".into(), -0.1), ("a".into(), -2.5), ("m".into(), -3.0)] }];
    let mut r = reply(false, false);
    r.logprobs = true;
    let text = whole(&r, completion("z", 1, StopReason::Length), "z", PROMPT, &texts);
    let (z, a, m) = (text.find("\"z\":").unwrap(), text.find("\"a\":").unwrap(), text.find("\"m\":").unwrap());
    assert!(z < a && a < m, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["system_fingerprint"], "fp_test");
    assert_eq!(v["choices"][0]["logprobs"]["tokens"][0], "z");

    let (tx, rx) = unbounded_channel();
    tx.send(Event::Token(event("z"), Some(TokenTexts { token: "z".into(), top: texts[0].top.clone() }))).unwrap();
    tx.send(Event::Done {
        completion: completion("z", 1, StopReason::Length),
        prompt: PROMPT,
        texts: Vec::new(),
        raw: "z".into(),
    })
    .unwrap();
    let mut r = reply(false, false);
    r.logprobs = true;
    let chunk = Box::pin(chunks(r, rx)).next().await.unwrap();
    assert!(chunk.find("\"z\":").unwrap() < chunk.find("\"a\":").unwrap(), "{chunk}");
    assert!(chunk.contains("\"system_fingerprint\":\"fp_test\""), "{chunk}");
}

/// Reasoning in a `<think>` block streams as `reasoning_content` deltas as
/// it comes (a marker cut across tokens included) and the content after
/// it as `content`; the whole answer says the same.
#[tokio::test]
async fn think_block_streams_as_reasoning_then_content() {
    let text = "<think>\nFirst the waters.\n</think>\n\nLight.";
    let pieces = ["<th", "ink>\nFirst ", "the waters.\n</th", "ink>\n\n", "Light."];
    assert_eq!(pieces.concat(), text);
    let events = stream(reply_thinking(true, false, true), &pieces, completion(text, 5, StopReason::Eos)).await;
    let field = |name: &str| -> String {
        events.iter().filter_map(|c| c["choices"].get(0)?["delta"][name].as_str().map(str::to_string)).collect()
    };
    assert_eq!(field("reasoning_content"), "First the waters.");
    assert_eq!(field("content"), "Light.");
    let whole: Value = serde_json::from_str(&whole(
        &reply_thinking(true, false, true),
        completion(text, 5, StopReason::Eos),
        text,
        PROMPT,
        &[],
    ))
    .unwrap();
    assert_eq!(whole["choices"][0]["message"]["reasoning_content"], "First the waters.");
    assert_eq!(whole["choices"][0]["message"]["content"], "Light.");
}
