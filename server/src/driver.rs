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

    /// A token of an answer that is not streamed, as it comes (the
    /// Responses API counts reasoning tokens from them).
    fn token(&mut self, _prompt: PromptFacts, _token: &TokenEvent) {}

    /// The whole answer of a request that did not stream, as JSON text.
    fn answer(self, answer: Answer) -> String;

    /// The whole answer of a request for several choices (OpenAI's `n`),
    /// one answer each, in order. Only a dialect whose parser asks for
    /// more than one choice is given more than one; the others answer the
    /// first.
    fn answers(self, mut answers: Vec<Answer>) -> String {
        self.answer(answers.swap_remove(0))
    }

    /// A stream's next choice begins (after `finish` ended the one
    /// before): its opening frames.
    fn next_choice(&mut self, _prompt: PromptFacts, _out: &mut String) {}

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
    /// Answers asked for (OpenAI's `n`), each generated from the same
    /// prompt with the seed after the one before: the prompt is evaluated
    /// once and the prefix cache resumes it for the others.
    pub choices: u32,
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
        Generation { prompt, params, want_texts: false, constraint_field: None, stream, warning, choices: 1, dialect }
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

/// The jobs of a request's choices, submitted one after the other.
pub(crate) struct Choices {
    prompt: Prompt,
    params: GenerateParams,
    want_texts: bool,
    constraint_field: Option<&'static str>,
    next: u32,
    total: u32,
}

impl Choices {
    fn new<D>(g: &mut Generation<D>) -> Choices {
        Choices {
            prompt: std::mem::replace(&mut g.prompt, Prompt::Text(String::new())),
            params: g.params.clone(),
            want_texts: g.want_texts,
            constraint_field: g.constraint_field,
            next: 0,
            total: g.choices.max(1),
        }
    }

    /// Queues the next choice's job and waits for its prompt to be taken
    /// (so a prompt the engine refuses is an error of its own); None when
    /// every choice has been.
    async fn submit_next(&mut self, state: &AppState) -> Result<Option<(PromptFacts, Receiver)>, ApiError> {
        if self.next == self.total {
            return Ok(None);
        }
        let last = self.next + 1 == self.total;
        let prompt =
            if last { std::mem::replace(&mut self.prompt, Prompt::Text(String::new())) } else { self.prompt.clone() };
        let params =
            GenerateParams { seed: self.params.seed.wrapping_add(u64::from(self.next)), ..self.params.clone() };
        self.next += 1;
        let (tx, mut rx) = unbounded_channel();
        state.worker.submit(Job {
            prompt,
            params,
            want_texts: self.want_texts,
            count_only: false,
            constraint_field: self.constraint_field,
            events: tx,
        })?;
        match rx.recv().await {
            Some(Event::Started(prompt)) => Ok(Some((prompt, rx))),
            Some(Event::Failed(e)) => Err(e),
            _ => Err(engine_dropped()),
        }
    }
}

type Receiver = UnboundedReceiver<Event>;

async fn drive<D: Dialect>(
    state: Shared,
    headers: HeaderMap,
    body: Body,
    path: &'static str,
    received: Instant,
    parse: impl FnOnce(&AppState, &[u8]) -> Result<Parsed<D>, ApiError>,
) -> Result<Response, ApiError> {
    let bytes = read_body(&state, &headers, body).await?;
    let mut g = match parse(&state, &bytes)? {
        Parsed::Generate(g) => *g,
        Parsed::Answered(response) => return Ok(response),
    };
    let mut choices = Choices::new(&mut g);
    // Waiting for the prompt lets its errors be HTTP errors, streaming or not.
    let (prompt, rx) = choices.submit_next(&state).await?.ok_or_else(engine_dropped)?;
    let clock = Clock::start(received);
    let mut response = if g.stream {
        let log = RequestLog::streamed(&state, &headers, path);
        let more = (choices.next < choices.total).then(|| (state.clone(), choices));
        streamed_response(Body::from_stream(frames(rx, g.dialect, prompt, clock, log, more)), D::STREAM)
    } else {
        let mut answers = vec![collect(rx, clock, &mut g.dialect, prompt).await?];
        while let Some((prompt, rx)) = choices.submit_next(&state).await? {
            answers.push(collect(rx, clock, &mut g.dialect, prompt).await?);
        }
        let tokens = Tokens {
            prompt: answers[0].prompt.tokens,
            completion: answers.iter().map(|a| a.completion.tokens.len()).sum(),
        };
        let json = if answers.len() == 1 { g.dialect.answer(answers.remove(0)) } else { g.dialect.answers(answers) };
        let mut response = ([(header::CONTENT_TYPE, "application/json")], json).into_response();
        response.extensions_mut().insert(tokens);
        response
    };
    add_warning(&mut response, g.warning);
    Ok(response)
}

/// One choice's whole answer, once the engine thread is done with it;
/// `dialect` sees each token as it comes.
async fn collect<D: Dialect>(
    mut rx: Receiver,
    mut clock: Clock,
    dialect: &mut D,
    prompt: PromptFacts,
) -> Result<Answer, ApiError> {
    loop {
        match rx.recv().await {
            Some(Event::Token(token, _)) => {
                clock.first_token.get_or_insert_with(Instant::now);
                dialect.token(prompt, &token);
            }
            Some(Event::Done { completion, prompt, texts, raw }) => {
                return Ok(Answer { completion, prompt, texts, raw, clock });
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
    rx: Receiver,
    /// The choices still to generate after this one's, and the state that
    /// submits them.
    more: Option<(Shared, Choices)>,
    /// Completion tokens of the choices already finished.
    completed: usize,
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
    rx: Receiver,
    dialect: D,
    prompt: PromptFacts,
    clock: Clock,
    log: RequestLog,
    more: Option<(Shared, Choices)>,
) -> impl Stream<Item = Result<String, Infallible>> {
    let st = Streaming {
        rx,
        more,
        completed: 0,
        dialect,
        prompt,
        clock,
        text: String::new(),
        opened: false,
        done: false,
        log,
    };
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
                st.completed += completion.tokens.len();
                let answer = Answer { completion, prompt, texts, raw, clock: st.clock };
                st.dialect.finish(&answer, &st.text, &mut out);
                let next = match &mut st.more {
                    Some((state, choices)) => choices.submit_next(state).await,
                    None => Ok(None),
                };
                match next {
                    Ok(Some((prompt, rx))) => {
                        st.rx = rx;
                        st.text.clear();
                        st.dialect.next_choice(prompt, &mut out);
                        return Some((Ok(out), st));
                    }
                    Ok(None) => {
                        st.done = true;
                        st.log.finish(200, Some((st.prompt.tokens, st.completed)));
                        return Some((Ok(out), st));
                    }
                    Err(e) => return Some(failed(st, &e, out)),
                }
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
