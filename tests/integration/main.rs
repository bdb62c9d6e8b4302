//! The one integration-test binary: oracle comparisons against transformers'
//! reference outputs, and the `waste` binary's commands and error paths.

mod bible;
mod chat;
mod chat_cli;
mod cli;
mod cli_more;
mod common;
mod convert_release;
mod deepseek;
mod deepseek_v4;
mod dsa;
mod families;
mod faults;
mod ffi;
mod first_hour;
mod gguf;
mod integrity;
mod jco;
mod k3;
mod kimi;
mod layering;
mod native_guest;
mod open_progress;
mod oracle;
mod plan_k3;
mod platforms;
mod plugins;
mod prefill;
mod reliability;
mod scale_out;
mod server;
mod session;
mod streaming;
mod structured;
mod synth_like;
mod threads;
