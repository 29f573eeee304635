//! `tessera`: the one command of Tessera.
//!
//! Owns: the process: argument parsing, logging, and the exit code. Admin
//! verbs (`status`, `host`, `policy`, `volume`, `object`, `resync`) talk
//! to the REST API over HTTP and print its answers; `store check` reads a
//! stopped host's devices offline; `up` and `node` run the node library's
//! daemons until Ctrl-C or SIGTERM.
//! Must not touch: engine logic. The binary decides nothing about the
//! cluster: every admin verb is one API request.
//! Invariant: exit 0 on success, 1 when the API refused or the command
//! found a problem, 2 for usage mistakes, 3 when the API cannot be reached;
//! errors and logs go to stderr (colourless unless it is a terminal),
//! results and `tessera up`'s banner to stdout.

mod args;
mod client;
mod daemon;
mod render;
mod table;
mod top;
mod verbs;

use args::Cli;
use clap::Parser;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

/// Every I/O allocates a few small buffers and futures on the runtime's
/// worker threads and frees them on another: glibc's allocator spent about
/// an eighth of the serving process's CPU on that under mixed I/O, mimalloc's
/// thread-local free lists a fraction of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    let result = match &cli.command {
        args::Command::Up(up) => daemon::up(up),
        args::Command::Node(node) => daemon::node(node),
        command => client::find_credentials(
            cli.token.as_deref(),
            cli.token_file.as_deref(),
            cli.ca_cert.as_deref(),
        )
        .and_then(|credentials| run_admin(command, &cli.api, credentials, cli.json)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(1))
        }
    }
}

/// Runs an admin verb, printing to stdout.
fn run_admin(
    command: &args::Command,
    api: &str,
    credentials: client::Credentials,
    json: bool,
) -> Result<(), client::CliError> {
    let stdout = std::io::stdout();
    let mut lock = stdout.lock();
    let mut output = verbs::Output {
        json,
        out: &mut lock,
    };
    let result = verbs::run(command, api, credentials, &mut output);
    let _ = lock.flush();
    result
}

/// Logs to stderr, filtered by `RUST_LOG` (default `info`), so stdout
/// carries only results (and `tessera up`'s banner) and `--json` stays
/// parseable. Colours only on a terminal: a log redirected to a file or a
/// pipe is plain text (and `NO_COLOR` turns them off everywhere).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
}
