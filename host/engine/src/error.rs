//! The one error type of the engine. Every fallible public function returns
//! it; nothing in the library prints or exits.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system I/O error on a named file.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    /// A file exists but its content is wrong: malformed JSON, a truncated
    /// tensor, a foreign container, a shape that disagrees with the config.
    #[error("{}: {msg}", path.display())]
    Format { path: PathBuf, msg: String },

    /// A valid input this engine does not implement (an unknown model_type,
    /// a tensor dtype we do not read, ...).
    #[error("unsupported: {0}")]
    Unsupported(String),

    /// A caller passed a value outside its allowed range.
    #[error("invalid argument: {0}")]
    Arg(String),

    /// A RAM budget under the model's floor: what open needs at the least
    /// (`waste plan` shows the parts). `detail` names the parts.
    #[error("invalid argument: a budget of {} is under this model's floor of {} ({detail}); run `waste plan MODEL` for the sizes", crate::size::fmt_bytes_apart(*budget, *floor).0, crate::size::fmt_bytes_apart(*budget, *floor).1)]
    Budget { budget: u64, floor: u64, detail: String },

    /// The model's chat template refused the conversation (it raised, or it
    /// is malformed), or the model has none.
    #[error("chat template: {0}")]
    ChatTemplate(String),

    /// The control component trapped or failed (raised by the host crate,
    /// which runs it; the engine itself never does).
    #[error("control component: {0}")]
    Guest(String),

    /// A forward pass of `tokens` tokens at `position` would run past the
    /// state's `context`: the caller asked for more than the context holds
    /// (a front end answers it as the request's fault, not the engine's).
    #[error("context full: {tokens} tokens at position {position} exceed the context of {context}")]
    ContextFull { tokens: usize, position: usize, context: usize },

    /// An inconsistency found while running a model (a failed expert read, a
    /// state poisoned by an earlier failure, ...).
    #[error("{0}")]
    Runtime(String),
}

impl From<crate::pool::PoolError> for Error {
    fn from(e: crate::pool::PoolError) -> Self {
        use crate::pool::PoolError;
        match e {
            PoolError::Arg(m) => Error::Arg(m),
            PoolError::Unsupported(m) => Error::Unsupported(m),
            PoolError::Runtime(m) => Error::Runtime(m),
        }
    }
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub fn format(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Format { path: path.into(), msg: msg.into() }
    }
}
