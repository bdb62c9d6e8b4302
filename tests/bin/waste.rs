//! `waste`, built for the integration tests (see tests/Cargo.toml).

fn main() -> std::process::ExitCode {
    waste_cli::main()
}
