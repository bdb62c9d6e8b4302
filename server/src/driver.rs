//! The one request driver every API dialect goes through: the body read
//! within its limits, the dialect's parse, a job for the engine thread, the
//! wait for `Started` (so a prompt the engine refuses is an HTTP error,
//! streaming or not), then either the stream, each event framed by the
//! dialect, or the whole answer shaped by it; the model-warning header on
//! either. A dialect is then only its request parser and the shapes of its
//! answers, frames and errors ([`Dialect`]); a new API is one more folder
//! and its routes.

use std::convert::Infallible;
use std::time::Instant;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use waste_host::{Completion, GenerateParams, TokenEvent};

use crate::error::ApiError;
use crate::neutral::{engine_dropped, Prompt};
use crate::state::{add_warning, read_body, streamed_response, AppState, RequestLog, Shared, Tokens};
use crate::worker::{Event, Job, PromptFacts, TokenTexts};

/// One API's side of a generation, built by its parser: it carries what
/// the answers repeat (ids, names, the reading of the answer) and any
/// state its stream keeps between frames.
pub(crate) trait Dialect: Send + Sized + 'static {
    /// The content type of a streamed answer (SSE, NDJSON).
    const STREAM: &'static str;

    /// Frames that open a stream, written before its first event; true:
    /// send them at once, false: with the first frames after them.
    fn open(&mut self, _prompt: PromptFacts, _out: &mut String) -> bool {
        false
    }

    /// A streamed token's frames; `text` is the answer so far, this token's
    /// text included. Writing nothing sends nothing yet (a held-back answer,
    /// a token without text).
    fn frame(&mut self, token: &TokenEvent, texts: Option<&TokenTexts>, text: &str, out: &mut String);

    /// The frames that end a stream; `text` is the answer's text as the
    /// tokens streamed it.
    fn finish(&mut self, answer: &Answer, text: &str, out: &mut String);

    /// A failure after the stream began: its status is already sent, so
    /// the error goes as frames.
    fn error_frame(&mut self, e: &ApiError, out: &mut String);

    /// The whole answer of a request that did not stream, as JSON text.
    fn answer(self, answer: Answer) -> String;

    /// An error answered before anything was sent, in the dialect's shape.
    fn error_response(e: ApiError) -> Response;
}

/// A request as a dialect parsed it.
pub(crate) enum Parsed<D> {
    /// Boxed: a generation is large beside an answer, and moves once.
    Generate(Box<Generation<D>>),
    /// Answered without the engine (a request that only loads the model).
    Answered(Response),
}

impl<D> From<Generation<D>> for Parsed<D> {
    fn from(g: Generation<D>) -> Self {
        Parsed::Generate(Box::new(g))
    }
}

/// What to generate and how to answer.
pub(crate) struct Generation<D> {
    pub prompt: Prompt,
    pub params: GenerateParams,
    /// Each token's text and alternatives, for log-probabilities.
    pub want_texts: bool,
    /// The request field that asked for `params.constraint`, which a 400
    /// about it names.
    pub constraint_field: Option<&'static str>,
    pub stream: bool,
    /// The `x-waste-warning` of a request that named another model.
    pub warning: Option<String>,
    pub dialect: D,
}

impl<D> Generation<D> {
    /// A generation that wants no token texts and whose constraint names
    /// no field (what a dialect without log-probabilities or field-naming
    /// errors asks for).
    pub(crate) fn new(
        prompt: Prompt,
        params: GenerateParams,
        stream: bool,
        warning: Option<String>,
        dialect: D,
    ) -> Self {
        Generation { prompt, params, want_texts: false, constraint_field: None, stream, warning, dialect }
    }
}

/// A finished generation, for the dialect to shape.
pub(crate) struct Answer {
    pub completion: Completion,
    pub prompt: PromptFacts,
    /// Each token's text and alternatives, when the job asked for them.
    pub texts: Vec<TokenTexts>,
    /// The answer's tokens decoded with their special tokens (harmony's
    /// channels are special tokens the text leaves out).
    pub raw: String,
    pub clock: Clock,
}

/// When a request arrived, its generation started and its first token
/// came: the statistics some dialects report (Ollama's durations).
#[derive(Clone, Copy)]
pub(crate) struct Clock {
    pub received: Instant,
    pub started: Instant,
    pub first_token: Option<Instant>,
}

impl Clock {
    /// The clock of a request received at `received` whose generation
    /// starts now.
    pub(crate) fn start(received: Instant) -> Clock {
        Clock { received, started: Instant::now(), first_token: None }
    }
}

/// Answers a generation request of dialect `D`: `parse` turns the body into
/// a [`Generation`]; `path` names the route in a stream's log line (its
/// handler has returned by the time the line is written).
pub(crate) async fn serve<D: Dialect>(
    state: Shared,
    headers: HeaderMap,
    body: Body,
    path: &'static str,
    parse: impl FnOnce(&AppState, &[u8]) -> Result<Parsed<D>, ApiError>,
) -> Response {
    let received = Instant::now();
    drive(state, headers, body, path, received, parse).await.unwrap_or_else(D::error_response)
}

async fn drive<D: Dialect>(
    state: Shared,
    headers: HeaderMap,
    body: Body,
    path: &'static str,
    received: Instant,
    parse: impl FnOnce(&AppState, &[u8]) -> Result<Parsed<D>, ApiError>,
) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let g = match parse(&state, &bytes)? {
        Parsed::Generate(g) => *g,
        Parsed::Answered(response) => return Ok(response),
    };
    let (tx, mut rx) = unbounded_channel();
    state.worker.submit(Job {
        prompt: g.prompt,
        params: g.params,
        want_texts: g.want_texts,
        count_only: false,
        constraint_field: g.constraint_field,
        events: tx,
    })?;
    // Waiting for the prompt lets its errors be HTTP errors, streaming or not.
    let prompt = match rx.recv().await {
        Some(Event::Started(prompt)) => prompt,
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(engine_dropped()),
    };
    let clock = Clock::start(received);
    let mut response = if g.stream {
        let log = RequestLog::streamed(&state, &headers, path);
        streamed_response(Body::from_stream(frames(rx, g.dialect, prompt, clock, log)), D::STREAM)
    } else {
        collect(rx, g.dialect, clock).await?
    };
    add_warning(&mut response, g.warning);
    Ok(response)
}

/// The whole answer, once the engine thread is done.
async fn collect<D: Dialect>(
    mut rx: UnboundedReceiver<Event>,
    dialect: D,
    mut clock: Clock,
) -> Result<Response, ApiError> {
    loop {
        match rx.recv().await {
            Some(Event::Token(..)) => {
                clock.first_token.get_or_insert_with(Instant::now);
            }
            Some(Event::Done { completion, prompt, texts, raw }) => {
                let tokens = Tokens { prompt: prompt.tokens, completion: completion.tokens.len() };
                let json = dialect.answer(Answer { completion, prompt, texts, raw, clock });
                let mut response = ([(header::CONTENT_TYPE, "application/json")], json).into_response();
                response.extensions_mut().insert(tokens);
                return Ok(response);
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(Event::Started(_) | Event::Counted(_)) => {}
            None => return Err(engine_dropped()),
        }
    }
}

/// Counts a prompt's tokens and generates nothing (Anthropic's
/// count_tokens), through the same queue as generations.
pub(crate) async fn count(state: &AppState, prompt: Prompt, params: GenerateParams) -> Result<usize, ApiError> {
    let (tx, mut rx) = unbounded_channel();
    state.worker.submit(Job {
        prompt,
        params,
        want_texts: false,
        count_only: true,
        constraint_field: None,
        events: tx,
    })?;
    match rx.recv().await {
        Some(Event::Counted(n)) => Ok(n),
        Some(Event::Failed(e)) => Err(e),
        _ => Err(engine_dropped()),
    }
}

/// A stream between two of its chunks.
struct Streaming<D> {
    rx: UnboundedReceiver<Event>,
    dialect: D,
    prompt: PromptFacts,
    clock: Clock,
    /// The answer's text so far.
    text: String,
    opened: bool,
    done: bool,
    /// Written when the stream ends, with its token counts.
    log: RequestLog,
}

/// A generation's stream: each chunk is the frames `dialect` wrote for the
/// events up to one that gave frames.
pub(crate) fn frames<D: Dialect>(
    rx: UnboundedReceiver<Event>,
    dialect: D,
    prompt: PromptFacts,
    clock: Clock,
    log: RequestLog,
) -> impl Stream<Item = Result<String, Infallible>> {
    let st = Streaming { rx, dialect, prompt, clock, text: String::new(), opened: false, done: false, log };
    futures_util::stream::unfold(st, next_chunk)
}

async fn next_chunk<D: Dialect>(mut st: Streaming<D>) -> Option<(Result<String, Infallible>, Streaming<D>)> {
    if st.done {
        return None;
    }
    let mut out = String::new();
    if !st.opened {
        st.opened = true;
        if st.dialect.open(st.prompt, &mut out) {
            return Some((Ok(out), st));
        }
    }
    loop {
        match st.rx.recv().await {
            Some(Event::Token(ev, texts)) => {
                st.clock.first_token.get_or_insert_with(Instant::now);
                st.text.push_str(&ev.text);
                let before = out.len();
                st.dialect.frame(&ev, texts.as_ref(), &st.text, &mut out);
                if out.len() > before {
                    return Some((Ok(out), st));
                }
            }
            Some(Event::Done { completion, prompt, texts, raw }) => {
                let counts = (prompt.tokens, completion.tokens.len());
                let answer = Answer { completion, prompt, texts, raw, clock: st.clock };
                st.dialect.finish(&answer, &st.text, &mut out);
                st.done = true;
                st.log.finish(200, Some(counts));
                return Some((Ok(out), st));
            }
            Some(Event::Failed(e)) => return Some(failed(st, &e, out)),
            Some(Event::Started(_) | Event::Counted(_)) => {}
            None => return Some(failed(st, &engine_dropped(), out)),
        }
    }
}

/// The last chunk of a stream that failed.
fn failed<D: Dialect>(
    mut st: Streaming<D>,
    e: &ApiError,
    mut out: String,
) -> (Result<String, Infallible>, Streaming<D>) {
    st.dialect.error_frame(e, &mut out);
    st.done = true;
    st.log.finish(e.status.as_u16(), None);
    (Ok(out), st)
}
