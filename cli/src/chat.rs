//! `waste chat`: a REPL over one session. Every turn renders the whole
//! conversation through the model's chat template and evaluates only what
//! the session does not already hold, so the state carries across turns.
//!
//! Ctrl-C during a generation cancels it and returns to the prompt: the
//! SIGINT handler lives here, in the CLI, and only sets a flag that the
//! per-token callback reads (the library installs no handlers).

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::json;
use waste_host::{ChatMessage, GenerateParams, Image, Session};

use crate::chat_images;
use crate::errors::usage;
use crate::open::ModelArgs;
use crate::output;
use crate::output::outln;
use crate::render::Renderer;
use crate::sampling::SamplingArgs;

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A system message that opens the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Tokens to generate at most per reply.
    #[arg(short = 'n', long = "tokens", visible_alias = "n-predict", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// Sampling and stopping; each turn uses the seed plus its turn number.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Render the conversation with this Jinja template instead of the
    /// model's own (llama.cpp's `--chat-template-file`).
    #[arg(long, value_name = "FILE", visible_alias = "chat-template-file")]
    pub chat_template: Option<PathBuf>,
    /// When the conversation outgrows the context, stop with an error
    /// instead of dropping its oldest turns (the system message always stays).
    #[arg(long)]
    pub no_context_shift: bool,
    /// Say on stderr what the session uses (the seed, the context).
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// A further chat template variable, NAME=JSON (repeatable), e.g.
    /// `--template-var enable_thinking=false` for Qwen3.
    #[arg(long = "template-var", value_name = "NAME=JSON")]
    pub template_vars: Vec<String>,
}

/// `--template-var NAME=JSON` flags as one JSON object text (None when there
/// are none); a malformed flag is a usage error.
pub fn template_vars(flags: &[String]) -> Result<Option<String>> {
    if flags.is_empty() {
        return Ok(None);
    }
    let mut map = serde_json::Map::new();
    for flag in flags {
        let Some((name, json)) = flag.split_once('=').filter(|(n, _)| !n.is_empty()) else {
            bail!(usage(format!("--template-var {flag:?}: expected NAME=JSON")));
        };
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| {
            usage(format!("--template-var {flag:?}: the value is not JSON ({e}); quote strings: {name}='\"text\"'"))
        })?;
        if map.insert(name.to_string(), value).is_some() {
            bail!(usage(format!("--template-var {name}: given twice")));
        }
    }
    let text = serde_json::Value::Object(map).to_string();
    waste_host::check_template_vars(&text).map_err(|e| usage(format!("--template-var: {e}")))?;
    Ok(Some(text))
}

const HELP: &str = "\
\"\"\"           start or end a message of several lines
/reset        forget the conversation (the system message stays)
/stats        position, context, turns and expert-cache counters
/image FILE   an image for your next message (models with a vision tower: Kimi K3)
/save FILE    save the conversation (state, tokens, messages, template variables) to FILE
/load FILE    restore a conversation saved with /save, template variables included
/help         this list
/bye, /quit, /exit  leave (so do Ctrl-D and end of input)
Ctrl-C cancels the reply being generated.";

struct Chat {
    session: Session,
    system: Option<String>,
    messages: Vec<ChatMessage>,
    /// Each message's images, in step with `messages`.
    images: Vec<Vec<Image>>,
    /// Images given with /image for the next user message.
    next_images: Vec<Image>,
    template_vars: Option<String>,
    params: GenerateParams,
    turns: u64,
    /// Prompt tokens evaluated by the last turn, and whether the session had
    /// to be replayed from the start (the template's rendering of earlier
    /// turns differed from the tokens the session holds).
    last_prompt: usize,
    replays: u64,
    cancel: Arc<AtomicBool>,
    /// Drop the oldest turns when the conversation outgrows the context.
    context_shift: bool,
    /// A message of several lines being typed (between `"""` lines).
    pending: Option<String>,
}

pub fn chat(a: ChatArgs) -> Result<()> {
    let (seed, random_seed) = crate::sampling::seed(a.sampling.seed);
    let params = a.sampling.params(a.max_tokens, seed)?;
    let template_vars = template_vars(&a.template_vars)?;
    let template = match &a.chat_template {
        Some(path) => Some(crate::input::read_template(path)?),
        None => None,
    };
    let (_engine, mut session) = crate::open::open(&a.model)?;
    if let Some(t) = template {
        session.set_chat_template(Some(t)).with_context(|| {
            format!(
                "using the chat template {}",
                a.chat_template.as_ref().map_or(String::new(), |p| p.display().to_string())
            )
        })?;
    } else if !session.model().info().has_chat_template {
        bail!(
            "{} has no chat template: `waste chat` needs one (give one with --chat-template FILE, or use `waste run` for plain completion)",
            a.model.model.display()
        );
    }
    if a.verbose {
        eprintln!(
            "seed {seed}{}; context {} tokens (--ctx; the model allows {}); context shift {}",
            if random_seed { " (random: --seed repeats it)" } else { "" },
            session.model().context(),
            session.model().info().max_position_embeddings,
            if a.no_context_shift { "off" } else { "on" }
        );
    }
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    let mut chat = Chat {
        session,
        system: a.system,
        messages: Vec::new(),
        images: Vec::new(),
        next_images: Vec::new(),
        template_vars,
        params,
        turns: 0,
        last_prompt: 0,
        replays: 0,
        cancel,
        context_shift: !a.no_context_shift,
        pending: None,
    };
    chat.messages = chat.opening();
    chat.images = vec![Vec::new(); chat.messages.len()];
    if std::io::stdin().is_terminal() {
        repl_tty(&mut chat)
    } else {
        repl_lines(&mut chat)
    }
}

/// Line editing and in-memory history.
fn repl_tty(chat: &mut Chat) -> Result<()> {
    use rustyline::error::ReadlineError;
    let mut editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
    eprintln!("waste chat: /help lists the commands; Ctrl-D leaves");
    loop {
        let prompt = if chat.pending.is_some() { "... " } else { "> " };
        match editor.readline(prompt) {
            Ok(line) => {
                if !line.trim().is_empty() {
                    let _ = editor.add_history_entry(line.as_str());
                }
                if !chat.line(&line) {
                    return Ok(());
                }
            }
            // Ctrl-C at the prompt clears the line, as in a shell.
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => return Ok(()),
            Err(e) => return Err(e).context("reading a line"),
        }
    }
}

/// Plain line reading for a piped stdin: no prompt, no editing.
fn repl_lines(chat: &mut Chat) -> Result<()> {
    let mut stdin = std::io::stdin().lock();
    let mut bytes = Vec::new();
    for n in 1.. {
        bytes.clear();
        if stdin.read_until(b'\n', &mut bytes).context("reading stdin")? == 0 {
            break;
        }
        let Ok(text) = std::str::from_utf8(&bytes) else {
            // One bad line of a piped file is reported, not the end of the chat.
            eprintln!("line {n} of the input is not UTF-8; skipped");
            continue;
        };
        if !chat.line(text.trim_end_matches(['\n', '\r'])) {
            break;
        }
    }
    Ok(())
}

impl Chat {
    fn opening(&self) -> Vec<ChatMessage> {
        self.system.iter().map(|s| ChatMessage::new("system", s.clone())).collect()
    }

    /// One input line; false to leave. Errors of a turn or a command are
    /// reported and the REPL goes on. A line starting with `"""` opens a
    /// message of several lines, closed by a line ending with `"""` (as in
    /// `ollama run`).
    fn line(&mut self, line: &str) -> bool {
        let text = line.trim_end_matches(['\r', '\n']);
        const FENCE: &str = "\"\"\"";
        if let Some(mut buf) = self.pending.take() {
            match text.strip_suffix(FENCE) {
                Some(last) => {
                    buf.push_str(last);
                    return self.message(buf.trim_end_matches('\n'));
                }
                None => {
                    buf.push_str(text);
                    buf.push('\n');
                    self.pending = Some(buf);
                    return true;
                }
            }
        }
        if let Some(first) = text.trim_start().strip_prefix(FENCE) {
            match first.strip_suffix(FENCE) {
                Some(one_line) => return self.message(one_line),
                None => {
                    self.pending = Some(if first.is_empty() { String::new() } else { format!("{first}\n") });
                    return true;
                }
            }
        }
        if text.trim().is_empty() {
            return true;
        }
        let result = match text.trim_start().strip_prefix('/') {
            Some(cmd) => {
                let (name, arg) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
                match name {
                    "quit" | "exit" | "bye" => return false,
                    _ => self.command(name, arg.trim()),
                }
            }
            None => self.turn(text),
        };
        if let Err(e) = result {
            output::error_line(&e);
        }
        true
    }

    /// A whole message (from a `"""` block): a turn, never a command.
    fn message(&mut self, text: &str) -> bool {
        if !text.trim().is_empty() {
            if let Err(e) = self.turn(text) {
                output::error_line(&e);
            }
        }
        true
    }

    fn command(&mut self, name: &str, arg: &str) -> Result<()> {
        let need_file = |what: &str| -> Result<PathBuf> {
            if arg.is_empty() {
                bail!(usage(format!("/{what} needs a file: /{what} FILE")));
            }
            Ok(PathBuf::from(arg))
        };
        match name {
            "help" => outln!("{HELP}"),
            "reset" => {
                self.session.reset();
                self.messages = self.opening();
                self.images = vec![Vec::new(); self.messages.len()];
                self.next_images.clear();
                outln!("conversation reset");
            }
            "stats" => self.stats(),
            "image" => {
                let path = need_file("image")?;
                let bytes = waste_host::read_file(&path, crate::input::MAX_IMAGE_FILE_BYTES)
                    .with_context(|| format!("reading the image {}", path.display()))?;
                let image =
                    self.session.encode_image(&bytes).with_context(|| format!("the image {}", path.display()))?;
                outln!(
                    "image {}x{}: {} positions, with your next message",
                    image.width(),
                    image.height(),
                    image.tokens()
                );
                self.next_images.push(image);
            }
            "save" => {
                let path = need_file("save")?;
                self.save(&path)?;
                outln!("saved {} tokens to {}", self.session.tokens().len(), path.display());
            }
            "load" => {
                let path = need_file("load")?;
                self.load(&path)?;
                outln!(
                    "loaded {} tokens, {} messages from {}{}",
                    self.session.tokens().len(),
                    self.messages.len(),
                    path.display(),
                    match &self.template_vars {
                        Some(vars) => format!(" (template variables {vars})"),
                        None => String::new(),
                    }
                );
            }
            other => bail!(usage(format!("unknown command /{other}; /help lists the commands"))),
        }
        Ok(())
    }

    fn stats(&self) {
        let model = self.session.model();
        let s = model.store_stats();
        outln!(
            "turns {} | position {} / {} context | last prompt {} tokens evaluated | replays {} | experts {} | {:.1} MB read",
            self.turns,
            self.session.position(),
            model.context(),
            self.last_prompt,
            self.replays,
            s.picks,
            s.bytes_read as f64 / 1e6
        );
    }

    /// The session's own file, plus the messages and template variables
    /// beside it: the template renders both, so a restored conversation needs
    /// them to go on rendering the history the session already holds.
    fn save(&self, path: &Path) -> Result<()> {
        if self.images.iter().any(|i| !i.is_empty()) {
            bail!("saving a conversation that holds images is not supported yet (its images are not saved); /reset starts over");
        }
        self.session.save_state(path).with_context(|| format!("saving the session to {}", path.display()))?;
        let messages: Vec<_> = self.messages.iter().map(|m| json!({"role": m.role, "content": m.content})).collect();
        let vars = match &self.template_vars {
            Some(text) => serde_json::from_str(text).context("the template variables are not JSON")?,
            None => serde_json::Value::Null,
        };
        let side = messages_path(path);
        std::fs::write(&side, json!({"messages": messages, "template_vars": vars}).to_string())
            .with_context(|| format!("writing {}", side.display()))
    }

    fn load(&mut self, path: &Path) -> Result<()> {
        let side = messages_path(path);
        let text =
            crate::input::read_text(&side, 64 << 20, "the saved messages (written by /save next to the session file)")?;
        let value: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", side.display()))?;
        let list = value["messages"].as_array().with_context(|| format!("{}: no messages list", side.display()))?;
        let mut messages = Vec::new();
        for m in list {
            let (Some(role), Some(content)) = (m["role"].as_str(), m["content"].as_str()) else {
                bail!("{}: a message lacks its role or content", side.display());
            };
            messages.push(ChatMessage::new(role, content));
        }
        // Files written before template variables were saved have no key:
        // those conversations were rendered without any.
        let template_vars = match &value["template_vars"] {
            serde_json::Value::Null => None,
            vars @ serde_json::Value::Object(_) => {
                let text = vars.to_string();
                waste_host::check_template_vars(&text).with_context(|| format!("{}: template_vars", side.display()))?;
                Some(text)
            }
            _ => bail!("{}: template_vars is not a JSON object", side.display()),
        };
        // The session file is checked against the model before anything
        // changes: a failed load leaves the conversation as it was.
        self.session.load_state(path).with_context(|| format!("loading the session from {}", path.display()))?;
        self.images = vec![Vec::new(); messages.len()];
        self.messages = messages;
        self.template_vars = template_vars;
        Ok(())
    }

    fn turn(&mut self, text: &str) -> Result<()> {
        let images = std::mem::take(&mut self.next_images);
        let mut message = ChatMessage::new("user", text);
        message.media = images.iter().map(Image::markup).collect();
        self.messages.push(message);
        self.images.push(images);
        let result = self.reply();
        if result.is_err() {
            self.messages.pop();
            // The images stay for the next message.
            self.next_images = self.images.pop().unwrap_or_default();
        }
        result
    }

    fn render(&mut self) -> Result<Vec<u32>> {
        Ok(self.session.apply_chat_template_with_vars(&self.messages, None, true, self.template_vars.as_deref())?)
    }

    /// The prompt of this turn, fitted to the context: with room for a reply
    /// of `max_tokens` (at most half the context), after dropping the oldest
    /// whole turns when context shift is on (llama.cpp's context shift,
    /// Ollama's truncation; the system messages stay), else the reason in
    /// plain words with the way out.
    fn fitted_prompt(&mut self) -> Result<Vec<u32>> {
        let context = self.session.model().context();
        let room = (self.params.max_tokens as usize).min(context / 2).max(1);
        let mut full = self.render()?;
        let system = self.messages.iter().take_while(|m| m.role == "system").count();
        let mut dropped = 0;
        while full.len() + room > context && self.context_shift && self.messages.len() > system + 1 {
            // A whole turn: the oldest message and what follows it up to
            // the next user message (never the one being answered).
            let next_user = self.messages[system + 1..].iter().position(|m| m.role == "user");
            let end = next_user.map_or(self.messages.len() - 1, |i| system + 1 + i);
            dropped += end - system;
            self.messages.drain(system..end);
            self.images.drain(system..end);
            full = self.render()?;
        }
        if dropped > 0 {
            eprintln!(
                "[the conversation outgrew the context of {context} tokens: dropped its {dropped} oldest messages{}; \
                 /reset starts over, --ctx N gives more context]",
                if system > 0 { " (the system message stays)" } else { "" }
            );
        }
        if full.len() + room > context {
            let max = self.session.model().info().max_position_embeddings;
            let what = if self.messages.len() <= system + 1 { "this message" } else { "the conversation" };
            bail!(
                "context full: {what} is {} tokens and the reply needs room too, but the context holds {context} \
                 tokens; /reset starts a new conversation, or restart with --ctx N (this model allows up to {max}){}",
                full.len(),
                if self.context_shift { "" } else { "; without --no-context-shift the oldest turns are dropped" }
            );
        }
        Ok(full)
    }

    fn reply(&mut self) -> Result<()> {
        let full = self.fitted_prompt()?;
        let held = self.session.tokens();
        let placeholder = self.session.model().vision().map(|v| v.placeholder);
        let images: Vec<Image> = self.images.iter().flatten().cloned().collect();
        let refs: Vec<&Image> = images.iter().collect();
        // Whatever an earlier failed turn left queued is not this prompt's.
        self.session.detach_images();
        let prompt = match chat_images::cover(&full, &held, placeholder, &refs)? {
            chat_images::Cover::Prefix { cut, first_image } => {
                chat_images::attach_all(&mut self.session, &refs[first_image..]);
                full[cut..].to_vec()
            }
            chat_images::Cover::Replay => {
                // The session's tokens are not a prefix of the rendering (a
                // reply whose text re-encodes differently): replay it all.
                self.session.reset();
                self.replays += 1;
                chat_images::attach_all(&mut self.session, &refs);
                full
            }
        };
        self.last_prompt = prompt.len();
        let mut params = self.params.clone();
        params.seed = self.params.seed.wrapping_add(self.turns);
        self.cancel.store(false, Ordering::SeqCst);
        let renderer = Arc::new(Mutex::new(Renderer::new()));
        let sink = renderer.clone();
        let cancel = self.cancel.clone();
        let completion = self.session.generate(&prompt, &params, move |event| {
            let written = sink.lock().map(|mut r| r.token(event)).unwrap_or(false);
            written && !cancel.load(Ordering::SeqCst)
        });
        let mut r = renderer.lock().map_err(|_| anyhow::anyhow!("renderer lock poisoned"))?;
        r.clear();
        let completion = completion?;
        outln!();
        self.turns += 1;
        self.messages.push(ChatMessage::new("assistant", completion.text));
        self.images.push(Vec::new());
        eprintln!("{} (stop: {})", output::stats_line(&r.totals, r.seconds()), completion.stop_reason.as_str());
        if completion.stop_reason == waste_host::StopReason::ContextFull {
            eprintln!(
                "[the reply stopped at the end of the context ({} tokens); {}]",
                self.session.model().context(),
                if self.context_shift {
                    "the next turn drops the oldest turns to make room"
                } else {
                    "/reset starts over, --ctx N gives more context"
                }
            );
        }
        Ok(())
    }
}

fn messages_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".messages.json");
    PathBuf::from(name)
}
