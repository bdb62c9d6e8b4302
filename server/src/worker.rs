//! The engine thread: one OS thread owns the model's sessions and runs
//! requests one at a time in arrival order. Generation happens here rather
//! than in a tokio task because wasmtime-wasi's synchronous host functions
//! block on a runtime of their own and must not run inside one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use tokio::sync::mpsc::UnboundedSender;
use waste_host::{Completion, Engine, Model, Session, TokenEvent};

use crate::error::{ApiError, Error, Result};
use crate::request::Prompt;

/// The text of one token and of its alternatives, for log-probabilities.
pub struct TokenTexts {
    pub token: String,
    pub top: Vec<(String, f32)>,
}

pub enum Event {
    /// The prompt is ready and generation starts.
    Started,
    Token(TokenEvent, Option<TokenTexts>),
    Done {
        completion: Completion,
        prompt_tokens: usize,
        texts: Vec<TokenTexts>,
    },
    Failed(ApiError),
}

pub struct Job {
    pub prompt: Prompt,
    pub params: waste_host::GenerateParams,
    pub want_texts: bool,
    pub events: UnboundedSender<Event>,
}

pub struct Worker {
    jobs: Mutex<mpsc::Sender<Job>>,
    /// Requests queued or running.
    pending: Arc<AtomicUsize>,
    limit: usize,
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
        TokenTexts {
            token: self.text(token),
            top: top.iter().map(|&(id, lp)| (self.text(id), lp)).collect(),
        }
    }
}

impl Worker {
    /// Starts the engine thread; returns once its sessions exist.
    pub fn start(engine: Engine, model: Arc<Model>, limit: usize) -> Result<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let pending = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&pending);
        std::thread::Builder::new()
            .name("waste-engine".into())
            .spawn(move || {
                let sessions = engine
                    .session(Arc::clone(&model))
                    .and_then(|s| Ok((s, engine.session(Arc::clone(&model))?)));
                let (mut session, vocab) = match sessions {
                    Ok(s) => {
                        let _ = ready_tx.send(Ok(()));
                        s
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                let vocab = Arc::new(Mutex::new(Vocab {
                    session: vocab,
                    cache: HashMap::new(),
                }));
                for job in rx {
                    // A client gone while queued costs nothing.
                    if !job.events.is_closed() {
                        run_job(&mut session, &vocab, &model, job);
                    }
                    counter.fetch_sub(1, Ordering::SeqCst);
                }
            })?;
        ready_rx
            .recv()
            .map_err(|_| Error::Worker("the engine thread ended while starting".into()))??;
        Ok(Worker {
            jobs: Mutex::new(tx),
            pending,
            limit,
        })
    }

    /// Queues a job, or answers 503 past the queue limit.
    pub fn submit(&self, job: Job) -> std::result::Result<(), ApiError> {
        if self.pending.fetch_add(1, Ordering::SeqCst) >= self.limit {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::overloaded(self.limit));
        }
        let sent = self
            .jobs
            .lock()
            .map_err(|_| ApiError::internal("the job queue's lock is poisoned"))?
            .send(job);
        if sent.is_err() {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::internal("the engine thread has stopped"));
        }
        Ok(())
    }
}

fn host_error(e: waste_host::Error) -> ApiError {
    match e {
        waste_host::Error::Arg(m) => ApiError::bad_request(m, None),
        other => ApiError::internal(other.to_string()),
    }
}

fn prompt_tokens(
    session: &mut Session,
    prompt: &Prompt,
) -> std::result::Result<Vec<u32>, ApiError> {
    match prompt {
        Prompt::Chat { messages, tools } => {
            if session.model().chat_template().is_none() {
                return Err(ApiError::bad_request(
                    "this model has no chat template; use /v1/completions",
                    None,
                ));
            }
            session
                .apply_chat_template(messages, tools.as_deref(), true)
                .map_err(host_error)
        }
        Prompt::Text(text) => {
            let mut tokens: Vec<u32> = session.model().info().bos_token.into_iter().collect();
            tokens.extend(session.tokenize(text).map_err(host_error)?);
            Ok(tokens)
        }
    }
}

fn run_job(session: &mut Session, vocab: &Arc<Mutex<Vocab>>, model: &Arc<Model>, job: Job) {
    session.reset();
    let tokens = match prompt_tokens(session, &job.prompt) {
        Ok(t) if t.is_empty() => Err(ApiError::bad_request(
            "the prompt encodes to no tokens",
            Some("prompt"),
        )),
        Ok(t) if t.len() >= model.context() => Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(
                format!(
                    "the prompt is {} tokens; this model's context is {} tokens",
                    t.len(),
                    model.context()
                ),
                Some("messages"),
            )
        }),
        other => other,
    };
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => {
            let _ = job.events.send(Event::Failed(e));
            return;
        }
    };
    let prompt_tokens = tokens.len();
    if job.events.send(Event::Started).is_err() {
        return;
    }
    let tx = job.events.clone();
    let want = job.want_texts;
    let words = Arc::clone(vocab);
    // Returning false (the receiver is gone: the client disconnected) stops
    // the generation before the next token.
    let result = session.generate(&tokens, &job.params, move |ev| {
        let texts = if want {
            words
                .lock()
                .ok()
                .map(|mut v| v.texts(ev.token, &ev.top_logprobs))
        } else {
            None
        };
        tx.send(Event::Token(ev.clone(), texts)).is_ok()
    });
    let event = match result {
        Ok(completion) => {
            let texts = match (want, vocab.lock()) {
                (true, Ok(mut v)) => completion
                    .tokens
                    .iter()
                    .zip(&completion.top_logprobs)
                    .map(|(&t, top)| v.texts(t, top))
                    .collect(),
                _ => Vec::new(),
            };
            Event::Done {
                completion,
                prompt_tokens,
                texts,
            }
        }
        Err(e) => Event::Failed(host_error(e)),
    };
    let _ = job.events.send(event);
}
