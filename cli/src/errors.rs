//! Usage errors (exit status 2) as distinct from runtime errors (1).

/// A mistake in how the command was called: exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

pub fn is_usage_error(e: &anyhow::Error) -> bool {
    e.downcast_ref::<UsageError>().is_some()
        || matches!(
            e.downcast_ref::<waste_host::Error>(),
            Some(waste_host::Error::Arg(_) | waste_host::Error::Budget { .. })
        )
}

pub fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}
