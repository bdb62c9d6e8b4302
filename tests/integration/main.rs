//! The one integration-test binary: oracle comparisons against transformers'
//! reference outputs, and the `waste` binary's commands and error paths.

mod bible;
mod chat;
mod chat_cli;
mod cli;
mod ffi;
mod cli_more;
mod common;
mod deepseek;
mod kimi;
mod oracle;
mod plugins;
mod server;
mod session;
mod streaming;
mod threads;
