//! The engine thread: one OS thread owns the model's sessions and runs
//! requests one at a time in arrival order. Generation happens here rather
//! than in a tokio task because wasmtime-wasi's synchronous host functions
//! block on a runtime of their own and must not run inside one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use tokio::sync::mpsc::UnboundedSender;
use waste_host::plugin::SamplerPlugin;
use waste_host::{Completion, Engine, Model, Session, Snapshot, StopReason, TokenEvent};

use crate::error::{ApiError, Error, Result};
use crate::neutral::Prompt;
use crate::prefix_cache::{DiskCache, DiskOptions, DiskTally, PrefixCache, Source};

/// The text of one token and of its alternatives, for log-probabilities.
#[derive(Clone)]
pub struct TokenTexts {
    pub token: String,
    pub top: Vec<(String, f32)>,
}

/// What the answer reports and needs to know of its prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptFacts {
    /// Tokens of the prompt, an image's rows included.
    pub tokens: usize,
    /// Of them, those resumed from a state the prefix cache held instead of
    /// evaluated (OpenAI's `cached_tokens`, Anthropic's
    /// `cache_read_input_tokens`).
    pub cached: usize,
    /// The rendered prompt ends inside a `<think>` block its template
    /// opened (`tools::think::prompt_opens_block`): the answer starts with
    /// reasoning.
    pub opens_reasoning: bool,
}

pub enum Event {
    /// The prompt is ready and generation starts.
    Started(PromptFacts),
    Token(TokenEvent, Option<TokenTexts>),
    Done {
        completion: Completion,
        prompt: PromptFacts,
        texts: Vec<TokenTexts>,
        /// The answer's tokens decoded with their special tokens (harmony's
        /// channels are special tokens the text leaves out).
        raw: String,
    },
    Failed(ApiError),
    /// The prompt's tokens, for a `count_only` job.
    Counted(usize),
}

pub struct Job {
    pub prompt: Prompt,
    pub params: waste_host::GenerateParams,
    pub want_texts: bool,
    /// Only count the prompt's tokens (Anthropic's count_tokens): answered
    /// with [`Event::Counted`], nothing generated.
    pub count_only: bool,
    /// The request field that asked for `params.constraint`, which a 400
    /// about it names (OpenAI's `param`).
    pub constraint_field: Option<&'static str>,
    pub events: UnboundedSender<Event>,
}

/// A short use of the engine thread's session that generates nothing
/// (tokenizing, rendering a template: llama-server's `/tokenize`,
/// `/apply-template`), queued with the generations because the session is
/// theirs; answered with one value.
pub struct Call {
    pub run: Box<CallFn>,
    pub answer: tokio::sync::oneshot::Sender<CallResult>,
}

pub type CallResult = std::result::Result<serde_json::Value, ApiError>;
pub type CallFn = dyn FnOnce(&mut Session) -> CallResult + Send;

enum Work {
    /// Boxed: a job is large beside a call, and moves once.
    Job(Box<Job>),
    Call(Call),
}

pub struct Worker {
    jobs: Mutex<mpsc::Sender<Work>>,
    /// Requests queued or running.
    pending: Arc<AtomicUsize>,
    limit: usize,
    counters: Arc<Counters>,
}

/// What the engine thread has done since start, for `GET /stats`: enough
/// to see from outside that a client that went away stopped its generation.
#[derive(Default)]
pub struct Counters {
    pub completed: AtomicU64,
    /// Generations stopped because their client went away mid-stream.
    pub cancelled: AtomicU64,
    /// Requests whose client went away before they left the queue.
    pub dropped_queued: AtomicU64,
    pub failed: AtomicU64,
    /// Requests answered 503 at the queue limit.
    pub rejected: AtomicU64,
    pub tokens_generated: AtomicU64,
    /// Of all cancelled generations, the most tokens computed after the
    /// client was found gone (the token whose delivery failed included).
    pub max_tokens_after_disconnect: AtomicU64,
    pub last_cancelled: Mutex<Option<Cancelled>>,
    /// Prefix cache: requests that resumed a held state, and those that
    /// found none to resume.
    pub prefix_hits: AtomicU64,
    pub prefix_misses: AtomicU64,
    /// Prompt tokens resumed from held states instead of evaluated.
    pub prefix_tokens_reused: AtomicU64,
    /// Prompt tokens evaluated.
    pub prompt_tokens_evaluated: AtomicU64,
    /// Conversation states held, and how many may be.
    pub prefix_held: AtomicUsize,
    pub prefix_capacity: AtomicUsize,
    /// The prompt cache on disk (`--prompt-cache-dir`), as of the last
    /// request.
    pub disk: Mutex<Option<DiskReport>>,
}

/// The disk side of the prefix cache, for `/stats`.
#[derive(Debug, Clone, Copy)]
pub struct DiskReport {
    pub files: usize,
    pub bytes: u64,
    pub max_bytes: u64,
    pub tally: DiskTally,
}

/// Publishes the disk side's figures to `/stats`.
fn report_disk(counters: &Counters, prefixes: &PrefixCache) {
    if let (Some(d), Ok(mut r)) = (&prefixes.disk, counters.disk.lock()) {
        *r = Some(DiskReport { files: d.files(), bytes: d.bytes(), max_bytes: d.max_bytes(), tally: d.tally });
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Cancelled {
    /// Tokens the engine computed.
    pub generated: u64,
    /// Tokens handed to the HTTP side before the client was found gone.
    pub delivered: u64,
    pub max_tokens: u32,
}

/// Token texts by id, from a session of its own: the generating session is
/// borrowed by `generate` while the per-token callback runs.
struct Vocab {
    session: Session,
    cache: HashMap<u32, String>,
}

impl Vocab {
    fn text(&mut self, id: u32) -> String {
        if let Some(t) = self.cache.get(&id) {
            return t.clone();
        }
        let t = self.session.detokenize(&[id]).unwrap_or_default();
        self.cache.insert(id, t.clone());
        t
    }

    fn texts(&mut self, token: u32, top: &[(u32, f32)]) -> TokenTexts {
        TokenTexts { token: self.text(token), top: top.iter().map(|&(id, lp)| (self.text(id), lp)).collect() }
    }
}

impl Worker {
    /// Starts the engine thread; returns once its sessions exist. The
    /// generating session draws through `sampler` when one is given.
    pub fn start(
        engine: Engine,
        model: Arc<Model>,
        limit: usize,
        sampler: Option<SamplerPlugin>,
        chat_template: Option<String>,
        disk: Option<DiskOptions>,
    ) -> Result<Worker> {
        let (tx, rx) = mpsc::channel::<Work>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let pending = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&pending);
        let counters = Arc::new(Counters::default());
        let cache_sessions = model.extra_states();
        counters.prefix_capacity.store(cache_sessions, Ordering::Relaxed);
        let tally = Arc::clone(&counters);
        std::thread::Builder::new().name("waste-engine".into()).spawn(move || {
            let sessions =
                engine.session(Arc::clone(&model)).and_then(|s| Ok((s, engine.session(Arc::clone(&model))?)));
            let (mut session, vocab) = match sessions {
                Ok(mut s) => {
                    s.0.set_sampler(sampler);
                    if let Err(e) = s.0.set_chat_template(chat_template) {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            let vocab = Arc::new(Mutex::new(Vocab { session: vocab, cache: HashMap::new() }));
            let disk = match disk {
                None => None,
                Some(d) => {
                    let dir = d.dir.clone();
                    match DiskCache::open(d, &model) {
                        Ok(disk) => Some(disk),
                        Err(source) => {
                            let _ = ready_tx.send(Err(Error::PromptCache { dir, source }));
                            return;
                        }
                    }
                }
            };
            let mut prefixes = PrefixCache::new(cache_sessions, disk);
            report_disk(&tally, &prefixes);
            let _ = ready_tx.send(Ok(()));
            loop {
                // A state being written to disk is taken into the cache
                // once its write ends, also while no request comes.
                let work = if prefixes.writing() {
                    match rx.recv_timeout(std::time::Duration::from_millis(50)) {
                        Ok(work) => work,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            if prefixes.reap(false) {
                                report_disk(&tally, &prefixes);
                            }
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                } else {
                    match rx.recv() {
                        Ok(work) => work,
                        Err(_) => break,
                    }
                };
                match work {
                    // A client gone while queued costs nothing.
                    Work::Job(job) if job.events.is_closed() => {
                        tally.dropped_queued.fetch_add(1, Ordering::Relaxed);
                    }
                    Work::Job(job) => {
                        run_job(&mut session, &vocab, &model, &tally, &mut prefixes, *job);
                        tally.prefix_held.store(prefixes.held.len(), Ordering::Relaxed);
                        report_disk(&tally, &prefixes);
                    }
                    Work::Call(call) if call.answer.is_closed() => {
                        tally.dropped_queued.fetch_add(1, Ordering::Relaxed);
                    }
                    Work::Call(call) => {
                        let _ = call.answer.send((call.run)(&mut session));
                    }
                }
                counter.fetch_sub(1, Ordering::SeqCst);
            }
            // The server is going: a write under way is finished, not cut.
            prefixes.reap(true);
        })?;
        ready_rx.recv().map_err(|_| Error::Worker("the engine thread ended while starting".into()))??;
        Ok(Worker { jobs: Mutex::new(tx), pending, limit, counters })
    }

    /// Requests queued or running now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::SeqCst)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Queues a job, or answers 503 past the queue limit.
    pub fn submit(&self, job: Job) -> std::result::Result<(), ApiError> {
        self.queue(Work::Job(Box::new(job)))
    }

    /// Runs `run` on the engine thread's session in queue order (503 past
    /// the queue limit, like a generation) and returns what it answered.
    pub async fn call(&self, run: impl FnOnce(&mut Session) -> CallResult + Send + 'static) -> CallResult {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.queue(Work::Call(Call { run: Box::new(run), answer }))?;
        answered.await.map_err(|_| crate::neutral::engine_dropped())?
    }

    fn queue(&self, work: Work) -> std::result::Result<(), ApiError> {
        if self.pending.fetch_add(1, Ordering::SeqCst) >= self.limit {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::overloaded(self.limit));
        }
        let sent = self.jobs.lock().map_err(|_| ApiError::internal("the job queue's lock is poisoned"))?.send(work);
        if sent.is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::internal("the engine thread has stopped"));
        }
        Ok(())
    }
}

/// An image the model cannot take (no tower, a malformed or oversized
/// file) is the request's fault.
fn image_error(e: waste_host::Error) -> ApiError {
    match e {
        waste_host::Error::Arg(m) | waste_host::Error::Unsupported(m) => ApiError::bad_request(m, Some("messages")),
        other => host_error(other),
    }
}

pub(crate) fn host_error(e: waste_host::Error) -> ApiError {
    match e {
        waste_host::Error::Arg(m) => ApiError::bad_request(m, None),
        full @ waste_host::Error::ContextFull { .. } => {
            ApiError { code: Some("context_length_exceeded"), ..ApiError::bad_request(full.to_string(), None) }
        }
        other => ApiError::internal(other.to_string()),
    }
}

fn prompt_tokens(session: &mut Session, prompt: &Prompt) -> std::result::Result<Vec<u32>, ApiError> {
    match prompt {
        Prompt::Chat { messages, tools, template_vars, .. } => {
            // `--chat-template` serves a model that carries none.
            match session.chat_template(tools.is_some()) {
                Ok(Some(_)) => {}
                Ok(None) => {
                    return Err(ApiError::bad_request("this model has no chat template; use /v1/completions", None))
                }
                Err(why) => return Err(ApiError::bad_request(format!("chat template: {why}"), Some("messages"))),
            }
            // A template that rejects the conversation (raise_exception,
            // a field it cannot read) is the request's fault, not the
            // server's: the template is fixed, the messages are not.
            session.apply_chat_template_with_vars(messages, tools.as_deref(), true, template_vars.as_deref()).map_err(
                |e| match e {
                    e @ waste_host::Error::ChatTemplate(_) => ApiError::bad_request(e.to_string(), Some("messages")),
                    other => host_error(other),
                },
            )
        }
        Prompt::Text(text) => {
            let mut tokens: Vec<u32> = session.model().info().bos_token.into_iter().collect();
            tokens.extend(session.tokenize(text).map_err(host_error)?);
            Ok(tokens)
        }
    }
}

/// Whether a chat prompt, rendered, leaves its answer inside a reasoning
/// block the template opened. Read from the rendered text: the marker may
/// be a special token, which decoding the prompt's tokens leaves out.
/// Rendered only for a template that writes `</think>` at all: the others
/// cannot open a block, and a second rendering of a long conversation is not
/// free.
fn opens_reasoning(session: &mut Session, prompt: &Prompt) -> bool {
    let Prompt::Chat { messages, tools, template_vars, .. } = prompt else { return false };
    let thinks =
        session.chat_template(tools.is_some()).is_ok_and(|t| t.is_some_and(crate::tools::think::template_thinks));
    if !thinks {
        return false;
    }
    session
        .render_chat_template_with_vars(messages, tools.as_deref(), true, template_vars.as_deref())
        .is_ok_and(|text| crate::tools::think::prompt_opens_block(&text))
}

fn run_job(
    session: &mut Session,
    vocab: &Arc<Mutex<Vocab>>,
    model: &Arc<Model>,
    counters: &Counters,
    prefixes: &mut PrefixCache,
    mut job: Job,
) {
    session.reset();
    let files: &[Vec<u8>] = match &job.prompt {
        Prompt::Chat { images, .. } => &images.files,
        Prompt::Text(_) => &[],
    };
    if job.count_only {
        // An image takes its rows' positions, known from its size alone.
        let extra =
            files.iter().map(|f| model.image_tokens(f).map(|n| n.saturating_sub(1))).sum::<waste_host::Result<usize>>();
        let _ = job.events.send(match (prompt_tokens(session, &job.prompt), extra) {
            (Ok(t), Ok(extra)) => Event::Counted(t.len() + extra),
            (Err(e), _) => Event::Failed(e),
            (_, Err(e)) => Event::Failed(image_error(e)),
        });
        return;
    }
    // The images run through the tower first: the context must hold their
    // rows too.
    let images = match files.iter().map(|f| session.encode_image(f)).collect::<waste_host::Result<Vec<_>>>() {
        Ok(i) => i,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(image_error(e)));
            return;
        }
    };
    let image_rows: usize = images.iter().map(|i| i.tokens().saturating_sub(1)).sum();
    let tokens = match prompt_tokens(session, &job.prompt) {
        Ok(t) if t.is_empty() => Err(ApiError::bad_request("the prompt encodes to no tokens", Some("prompt"))),
        Ok(t) if t.len() + image_rows >= model.context() => Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(
                format!(
                    "the prompt is {} tokens; this model's context is {} tokens",
                    t.len() + image_rows,
                    model.context()
                ),
                // The field that carried the prompt.
                Some(match job.prompt {
                    Prompt::Chat { .. } => "messages",
                    Prompt::Text(_) => "prompt",
                }),
            )
        }),
        other => other,
    };
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(e));
            return;
        }
    };
    // A bad parameter, or a malformed or unsatisfiable grammar (checked
    // apart, to name its field), is a 400 before the answer starts,
    // streaming or not.
    let unconstrained = waste_host::GenerateParams { constraint: None, ..job.params.clone() };
    let checked = session.check_params(&unconstrained).map_err(host_error).and_then(|()| match job.params.constraint {
        None => Ok(()),
        Some(_) => match session.check_params(&job.params) {
            // A forced tool call in a template whose call syntax the probe
            // cannot read: the call is left to the model, as without a
            // constraint.
            Err(waste_host::Error::Unsupported(_))
                if matches!(job.params.constraint, Some(waste_host::Constraint::ToolCall { .. })) =>
            {
                job.params.constraint = None;
                Ok(())
            }
            Err(waste_host::Error::Arg(m)) => Err(ApiError::bad_request(m, job.constraint_field)),
            Err(e) => Err(host_error(e)),
            Ok(()) => Ok(()),
        },
    });
    if let Err(e) = checked {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        let _ = job.events.send(Event::Failed(e));
        return;
    }
    // Where the prompt resumes is known before anything is evaluated, so
    // the answer's first frame can state the cached tokens.
    let taken = match resume(session, counters, prefixes, &tokens) {
        Ok(taken) => taken,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(host_error(e)));
            return;
        }
    };
    report_disk(counters, prefixes);
    let cached = taken.as_ref().map_or(0, |(_, keep, _)| *keep);
    let opens_reasoning = opens_reasoning(session, &job.prompt);
    let prompt = PromptFacts { tokens: tokens.len() + image_rows, cached, opens_reasoning };
    if job.events.send(Event::Started(prompt)).is_err() {
        counters.dropped_queued.fetch_add(1, Ordering::Relaxed);
        // The held state taken out to resume goes back as it was: a
        // client that left costs the cache nothing.
        if let Some((held, _, source)) = taken {
            prefixes.put_back(held, source);
        }
        return;
    }
    // Resumed from: its memory is the session's now (the budget counts
    // one held state fewer from here).
    drop(taken);
    let (start, boundary) = match evaluate_to_boundary(session, model, counters, prefixes, &tokens, cached, &images) {
        Ok(r) => r,
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(Event::Failed(host_error(e)));
            return;
        }
    };
    let tx = job.events.clone();
    let want = job.want_texts;
    let words = Arc::clone(vocab);
    let delivered = Arc::new(AtomicU64::new(0));
    let sent = Arc::clone(&delivered);
    // Returning false (the receiver is gone: the client disconnected) stops
    // the generation before the next token.
    let result = session.generate(&tokens[start..], &job.params, move |ev| {
        let texts = if want { words.lock().ok().map(|mut v| v.texts(ev.token, &ev.top_logprobs)) } else { None };
        let ok = tx.send(Event::Token(ev.clone(), texts)).is_ok();
        if ok {
            sent.fetch_add(1, Ordering::Relaxed);
        }
        ok
    });
    let event = match result {
        Ok(completion) => {
            let generated = completion.tokens.len() as u64;
            counters.tokens_generated.fetch_add(generated, Ordering::Relaxed);
            if completion.stop_reason == StopReason::Cancelled {
                let delivered = delivered.load(Ordering::Relaxed);
                counters.cancelled.fetch_add(1, Ordering::Relaxed);
                counters.max_tokens_after_disconnect.fetch_max(generated.saturating_sub(delivered), Ordering::Relaxed);
                if let Ok(mut last) = counters.last_cancelled.lock() {
                    *last = Some(Cancelled { generated, delivered, max_tokens: job.params.max_tokens });
                }
            } else {
                counters.completed.fetch_add(1, Ordering::Relaxed);
            }
            let texts = match (want, vocab.lock()) {
                (true, Ok(mut v)) => {
                    completion.tokens.iter().zip(&completion.top_logprobs).map(|(&t, top)| v.texts(t, top)).collect()
                }
                _ => Vec::new(),
            };
            let raw = session.detokenize(&completion.tokens).unwrap_or_default();
            // Attention caches keep the answer too (a prefix can be cut
            // back to); a recurrent state is kept where the prompt ended.
            let held = if model.rewindable_state() { None } else { boundary };
            prefixes.keep(|| held.unwrap_or_else(|| session.snapshot()));
            Event::Done { completion, prompt, texts, raw }
        }
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            Event::Failed(host_error(e))
        }
    };
    let _ = job.events.send(event);
    prefixes.persist();
}

/// Puts the session where `tokens` should continue from: a held or saved
/// state that saves part of the prompt, or an empty one. Returns the state
/// it took out of the cache, how many of the prompt's tokens it covered and
/// where it came from.
fn resume(
    session: &mut Session,
    counters: &Counters,
    prefixes: &mut PrefixCache,
    tokens: &[u32],
) -> waste_host::Result<Option<(Arc<Snapshot>, usize, Source)>> {
    let model = Arc::clone(session.model());
    match prefixes.take_best(tokens, &model) {
        Some((held, keep, source)) => {
            session.resume(&held, keep)?;
            counters.prefix_hits.fetch_add(1, Ordering::Relaxed);
            counters.prefix_tokens_reused.fetch_add(keep as u64, Ordering::Relaxed);
            Ok(Some((held, keep, source)))
        }
        None => {
            session.reset();
            counters.prefix_misses.fetch_add(1, Ordering::Relaxed);
            Ok(None)
        }
    }
}

/// Attaches the prompt's images and, for a model whose state cannot be cut
/// back, evaluates the prompt from `start` up to its last token and
/// snapshots there (the next turn's prompt extends this one's up to
/// there). Returns where the prompt's remaining tokens start, and that
/// snapshot.
fn evaluate_to_boundary(
    session: &mut Session,
    model: &Model,
    counters: &Counters,
    prefixes: &mut PrefixCache,
    tokens: &[u32],
    mut start: usize,
    images: &[waste_host::Image],
) -> waste_host::Result<(usize, Option<Snapshot>)> {
    // A held state never covers an image (`Snapshot::usable_prefix`): every
    // image of the prompt lies in what is evaluated from here, the boundary
    // evaluation below included, so they are attached before it.
    for image in images {
        session.attach(image);
    }
    counters.prompt_tokens_evaluated.fetch_add((tokens.len() - start) as u64, Ordering::Relaxed);
    let mut boundary = None;
    if !model.rewindable_state() && prefixes.capacity > 0 && tokens.len() - start > 1 {
        let last = tokens.len() - 1;
        session.eval(&tokens[start..last], false)?;
        prefixes.make_room();
        boundary = Some(session.snapshot());
        start = last;
    }
    Ok((start, boundary))
}
