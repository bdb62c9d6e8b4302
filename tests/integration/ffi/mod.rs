//! The C ABI: the shipped C and Python examples built and run, and the
//! entry points beyond open/generate checked against the Rust API.

mod constraint;
mod details;
mod examples;
mod harness;
mod open_convert;
mod sampler;
