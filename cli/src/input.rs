//! Where a command's text comes from: the argument, `--file`, or stdin.

use std::io::{IsTerminal, Read};
use std::path::Path;

use anyhow::{bail, Context, Result};
use waste_host::Session;

use crate::errors::usage;

/// The prompt from the argument, `--file`, or stdin (`-`, or no argument
/// with stdin not a terminal).
pub fn read_prompt(arg: Option<&str>, file: Option<&Path>) -> Result<String> {
    if let Some(path) = file {
        return read_text(path, MAX_PROMPT_FILE_BYTES, "the prompt");
    }
    match arg {
        Some("-") => read_stdin(),
        Some(text) => Ok(text.to_string()),
        None if !std::io::stdin().is_terminal() => read_stdin(),
        None => Err(usage("no prompt: give it as an argument, with --file, or on stdin")),
    }
}

fn read_stdin() -> Result<String> {
    let mut text = String::new();
    std::io::stdin().read_to_string(&mut text).context("reading the prompt from stdin")?;
    if text.is_empty() {
        return Err(usage("no prompt: stdin was empty (give the prompt as an argument, with --file, or on stdin)"));
    }
    Ok(text)
}

pub fn encode(session: &mut Session, text: &str, markup: bool) -> Result<Vec<u32>> {
    let tokens = if markup { session.tokenize_markup(text)? } else { session.tokenize(text)? };
    Ok(tokens)
}

/// The largest image file taken; its pixels are bounded again when decoded.
pub const MAX_IMAGE_FILE_BYTES: u64 = 256 << 20;

/// Attaches each image file to the session (through the model's vision
/// tower) and returns the markup tokens that stand for them, in order: the
/// images go before the text, as the release's own CLI puts them.
pub fn attach_images(session: &mut Session, paths: &[std::path::PathBuf]) -> Result<Vec<u32>> {
    let mut markup = String::new();
    for path in paths {
        let bytes = waste_host::read_file(path, MAX_IMAGE_FILE_BYTES)
            .with_context(|| format!("reading the image {}", path.display()))?;
        let image = session.attach_image(&bytes).with_context(|| format!("the image {}", path.display()))?;
        markup.push_str(&image.markup());
    }
    if markup.is_empty() {
        return Ok(Vec::new());
    }
    Ok(session.tokenize_markup(&markup)?)
}

/// The largest `--file` prompt: far past any context, well under RAM.
const MAX_PROMPT_FILE_BYTES: u64 = 64 << 20;

/// A text file the user named, bounded before it is read (a FIFO or
/// `/dev/zero` is refused, not read until memory runs out) and UTF-8.
pub fn read_text(path: &Path, limit: u64, what: &str) -> Result<String> {
    let bytes =
        waste_host::read_file(path, limit).with_context(|| format!("reading {what} from {}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| usage(format!("{}: {what} is not UTF-8", path.display())))
}

/// The largest chat template file taken (real ones are a few kB).
const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// A `--chat-template` file: bounded, UTF-8.
pub fn read_template(path: &Path) -> Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading the chat template {}", path.display()))?;
    if !meta.is_file() || meta.len() > MAX_TEMPLATE_BYTES {
        bail!(usage(format!(
            "--chat-template {}: expected a Jinja template file of at most {MAX_TEMPLATE_BYTES} bytes",
            path.display()
        )));
    }
    let bytes = std::fs::read(path).with_context(|| format!("reading the chat template {}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| usage(format!("--chat-template {}: not UTF-8", path.display())))
}
