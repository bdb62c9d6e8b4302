//! The one integration-test binary: oracle comparisons against transformers'
//! reference outputs, and the `waste` binary's commands and error paths.

mod cli;
mod common;
mod oracle;
