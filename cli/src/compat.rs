//! llama.cpp habits the argument parser cannot express: `-m MODEL` in place
//! of the positional container (clap has no option that fills a
//! positional), and `-ngl N`, which asks for something WASTE does not have
//! and would otherwise read as `-n gl`.

use std::ffi::OsString;

/// Commands whose first positional argument is the container.
const TAKES_A_MODEL: &[&str] =
    &["run", "chat", "eval", "tokenize", "detokenize", "info", "plan", "perplexity", "bench", "serve"];

/// Flags of llama.cpp that offload layers to a GPU.
const GPU_LAYER_FLAGS: &[&str] = &["-ngl", "--n-gpu-layers", "--gpu-layers"];

/// The arguments with `-m X` / `--model X` / `--model=X` moved to the
/// position of the container (right after the command), or the one-line
/// reason they cannot be taken.
pub fn rewrite(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let text = |a: &OsString| a.to_str().map(str::to_owned);
    // Everything after a bare `--` is data (a prompt may say anything).
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    for a in &args[1..end] {
        if let Some(flag) =
            text(a).filter(|t| GPU_LAYER_FLAGS.iter().any(|g| t == g || t.starts_with(&format!("{g}="))))
        {
            return Err(format!(
                "{}: waste runs on the CPU only (the experts stream from disk into RAM; there are no layers to \
                 offload to a GPU); leave the flag out",
                flag.split('=').next().unwrap_or(&flag)
            ));
        }
    }
    let Some(command) = args.get(1).and_then(text) else { return Ok(args) };
    if !TAKES_A_MODEL.contains(&command.as_str()) {
        return Ok(args);
    }
    let mut model = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut i = 2;
    while i < args.len() {
        let t = text(&args[i]);
        if i < end && (t.as_deref() == Some("-m") || t.as_deref() == Some("--model")) {
            let value = args.get(i + 1).ok_or_else(|| format!("{}: expected the container after it", t.unwrap()))?;
            if model.replace(value.clone()).is_some() {
                return Err("-m/--model: given twice".into());
            }
            i += 2;
            continue;
        }
        if let Some(value) = t.as_deref().filter(|_| i < end).and_then(|t| t.strip_prefix("--model=")) {
            if model.replace(OsString::from(value)).is_some() {
                return Err("-m/--model: given twice".into());
            }
            i += 1;
            continue;
        }
        rest.push(args[i].clone());
        i += 1;
    }
    let mut out = vec![args[0].clone(), args[1].clone()];
    out.extend(model);
    out.extend(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn model_flag_becomes_the_positional_container() {
        assert_eq!(
            rewrite(args(&["waste", "run", "-p", "hi", "-m", "M"])).unwrap(),
            args(&["waste", "run", "M", "-p", "hi"])
        );
        assert_eq!(
            rewrite(args(&["waste", "chat", "--model=M", "-c", "64"])).unwrap(),
            args(&["waste", "chat", "M", "-c", "64"])
        );
        // Without the flag, and for commands without a container, nothing moves.
        assert_eq!(rewrite(args(&["waste", "run", "M", "hi"])).unwrap(), args(&["waste", "run", "M", "hi"]));
        assert_eq!(rewrite(args(&["waste", "synth", "-m", "x"])).unwrap(), args(&["waste", "synth", "-m", "x"]));
        // After `--` it is the prompt's text.
        assert_eq!(
            rewrite(args(&["waste", "run", "M", "--", "-m", "x"])).unwrap(),
            args(&["waste", "run", "M", "--", "-m", "x"])
        );
        assert!(rewrite(args(&["waste", "run", "-m"])).is_err());
        assert!(rewrite(args(&["waste", "run", "-m", "A", "--model", "B"])).is_err());
    }

    #[test]
    fn gpu_layers_are_refused_in_one_line() {
        for flag in ["-ngl", "--n-gpu-layers", "--gpu-layers=99"] {
            let e = rewrite(args(&["waste", "run", "M", flag, "99"])).unwrap_err();
            assert!(e.contains("CPU only") && !e.contains('\n'), "{e}");
        }
    }
}
