//! The `waste` binary: the command line of `waste_cli`.

fn main() -> std::process::ExitCode {
    waste_cli::main()
}
