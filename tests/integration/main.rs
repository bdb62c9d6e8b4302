//! The one integration-test binary: oracle comparisons against transformers'
//! reference outputs, and the `waste` binary's commands and error paths.

mod bible;
mod chat;
mod cli;
mod common;
mod kimi;
mod oracle;
mod plugins;
mod session;
mod streaming;
mod threads;
