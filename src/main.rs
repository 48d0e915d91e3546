//! The `portico` command: argument parsing (clap), logging setup, runtime, signals. Everything
//! else lives in the library. Subcommands: `serve` (the default), `check`, `stdio`,
//! `config schema` (README, Other commands).

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use portico::config::{self, LogFormat};

/// mimalloc instead of glibc malloc: the request path allocates a few dozen small objects per
/// request (header maps, buffers, futures) and glibc's allocator showed up at ~8 % of portico's
/// CPU in profiles; mimalloc's thread-local free lists make those allocations cheap. Built with
/// `no_thp` (Cargo.toml says why).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `portico`: no subcommand means `serve`, so `portico --config F` (the form in deploy/ and
/// tests) keeps working.
#[derive(Parser)]
#[command(
    name = "portico",
    version,
    about = "An MCP gateway: one address in front of your Model Context Protocol servers.",
    propagate_version = true,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default when no subcommand is given).
    Serve(ServeArgs),
    /// Validate a config file and exit; non-zero with the offending key on error.
    Check(CheckArgs),
    /// Serve one backend or endpoint over stdin/stdout (newline-delimited JSON-RPC; logs on
    /// stderr), for clients that can only launch a command.
    Stdio(StdioArgs),
    /// Config file tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the JSON Schema (draft-07) of the config file, for editors and linters.
    Schema,
}

#[derive(Args)]
struct ServeArgs {
    /// The config file (TOML).
    #[arg(short, long, value_name = "FILE", env = CONFIG_ENV)]
    config: Option<PathBuf>,
    /// Validate the config and exit (the older spelling of `portico check`).
    #[arg(short = 't', long, hide = true)]
    check: bool,
}

#[derive(Args)]
struct CheckArgs {
    /// The config file (TOML).
    #[arg(short, long, value_name = "FILE", env = CONFIG_ENV)]
    config: PathBuf,
}

#[derive(Args)]
#[command(
    after_help = "Exactly one of --config and --url. --config falls back to \
    $PORTICO_CONFIG only without --url."
)]
struct StdioArgs {
    /// Serve a backend or endpoint of this config file.
    #[arg(short, long, value_name = "FILE", env = CONFIG_ENV)]
    config: Option<PathBuf>,
    /// Serve this one Streamable HTTP upstream, without a config file.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// A header sent to the --url upstream (`${VAR}` expanded); repeatable.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Which backend or endpoint of --config to serve, when it has several.
    #[arg(long, value_name = "/mcp/NAME")]
    endpoint: Option<String>,
    /// Longest stdin line accepted.
    #[arg(long, value_name = "N", value_parser = positive)]
    max_line_bytes: Option<usize>,
    /// The credential this stdio client stands behind (the `Authorization` value an HTTP client
    /// would send, e.g. "Bearer KEY"): with `[auth]` in --config, team policies, allow_teams and
    /// rate limits apply as on HTTP. Prefer the environment variable (not visible in `ps`).
    #[arg(
        long,
        value_name = "VALUE",
        env = "PORTICO_AUTHORIZATION",
        hide_env_values = true
    )]
    authorization: Option<String>,
}

/// Environment variable read when `--config` is not given.
const CONFIG_ENV: &str = "PORTICO_CONFIG";

fn positive(v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{v:?}: want a positive number"))
}

/// A usage error in the style of clap's own (message, usage line, exit code 2).
fn usage_error(subcommand: Option<&str>, message: &str) -> ! {
    let mut cmd = Cli::command();
    cmd.build();
    let cmd = match subcommand.and_then(|name| cmd.find_subcommand_mut(name)) {
        Some(sub) => sub,
        None => &mut cmd,
    };
    cmd.error(ErrorKind::ArgumentConflict, message).exit()
}

/// The stdio rules clap's attributes cannot say: exactly one of --config / --url, where a
/// `PORTICO_CONFIG` from the environment yields to an explicit --url.
fn check_stdio_args(mut a: StdioArgs, matches: &ArgMatches) -> StdioArgs {
    let config_from_env = matches
        .subcommand_matches("stdio")
        .and_then(|m| m.value_source("config"))
        == Some(ValueSource::EnvVariable);
    if config_from_env && a.url.is_some() {
        a.config = None;
    }
    let problem = match (&a.config, &a.url) {
        (Some(_), Some(_)) | (None, None) => {
            Some("stdio needs exactly one of --config FILE or --url URL")
        }
        (Some(_), None) if !a.headers.is_empty() => {
            Some("--header goes with --url; put headers in the config file")
        }
        (None, Some(_)) if a.endpoint.is_some() => {
            Some("--endpoint goes with --config; --url serves its one upstream")
        }
        _ => None,
    };
    if let Some(message) = problem {
        usage_error(Some("stdio"), message);
    }
    a
}

/// `portico config schema`: the schema `schemars` derives from the config structs, which
/// carries their `deny_unknown_fields`, defaults and doc comments. Draft-07 rather than
/// 2020-12: it is the draft TOML editors' language servers (taplo) validate most reliably.
/// Cross-field rules (exactly one of `url`/`builtin`/`command`, …) are `portico check`'s.
fn print_schema() -> ExitCode {
    let mut schema = schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<config::Config>();
    schema.insert("title".into(), "portico configuration".into());
    let written = serde_json::to_string_pretty(&schema)
        .map_err(std::io::Error::other)
        .and_then(|text| writeln!(std::io::stdout().lock(), "{text}"));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        // `portico config schema | head`: the reader left; nothing to report.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("portico: cannot print the schema: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `portico check` / `portico --check`.
fn check_main(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(config) => {
            println!(
                "portico: {}: ok ({} backends)",
                path.display(),
                config.backends.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("portico: {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

/// `portico stdio`: one endpoint over stdin/stdout. stdout carries protocol lines only; every
/// log line goes to stderr.
fn stdio_main(args: StdioArgs) -> ExitCode {
    let loaded = match (&args.config, &args.url) {
        (Some(path), _) => config::load(path).map_err(|e| format!("{}: {e}", path.display())),
        (None, Some(url)) => {
            portico::stdio_front::url_config(url, &args.headers).map_err(|e| e.to_string())
        }
        (None, None) => Err("stdio needs --config or --url".into()),
    };
    let config = match loaded {
        Ok(c) => c,
        Err(e) => {
            eprintln!("portico: {e}");
            return ExitCode::FAILURE;
        }
    };
    let _log = init_logging(&config.log);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("portico: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let opts = portico::stdio_front::StdioOptions {
        authorization: args.authorization,
        endpoint: args.endpoint,
        max_line_bytes: args.max_line_bytes,
    };
    let code = rt.block_on(async move {
        let run = portico::stdio_front::run(
            config,
            opts,
            tokio::io::stdin(),
            tokio::io::stdout(),
            shutdown_signal(),
        );
        match run.await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("portico: {e}");
                ExitCode::FAILURE
            }
        }
    });
    // A read of stdin may still sit on a blocking thread (shutdown by signal): don't wait for it.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    code
}

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let serve = match cli.command {
        None => cli.serve,
        Some(Command::Serve(args)) => args,
        Some(Command::Check(args)) => return check_main(&args.config),
        Some(Command::Stdio(args)) => return stdio_main(check_stdio_args(args, &matches)),
        Some(Command::Config {
            command: ConfigCommand::Schema,
        }) => return print_schema(),
    };
    let Some(path) = serve.config else {
        usage_error(
            None,
            "--config FILE is required (or set PORTICO_CONFIG); see --help",
        );
    };
    if serve.check {
        return check_main(&path);
    }
    let config = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("portico: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let _log = init_logging(&config.log);
    raise_open_file_limit();
    // One worker: a current-thread runtime. Everything then runs on the thread that accepts,
    // with no work-stealing queues or cross-thread wake-ups — measurably cheaper per request
    // (benches/) when the operator has pinned portico to one core anyway.
    let mut rt = if config.server.workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        if config.server.workers > 0 {
            b.worker_threads(config.server.workers);
        }
        b
    };
    rt.enable_all();
    let rt = match rt.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("portico: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&config.server.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("portico: cannot listen on {}: {e}", config.server.listen);
                return ExitCode::FAILURE;
            }
        };
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(%addr, backends = config.backends.len(), "portico listening");
        // The file is loaded again (same steps) so that SIGHUP and file changes reload it.
        match portico::run_with_reload(&path, listener, shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("portico: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Raises the soft open-file limit to the hard one, as nginx's `worker_rlimit_nofile` or Go's
/// runtime do: every client connection, upstream connection and stdio child's pipe is a file
/// descriptor, and the usual soft default (1024) would refuse connections long before the
/// machine runs out of anything. `[server] max_connections = 0` then takes half of it.
fn raise_open_file_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(open_files = limit, "open-file limit"),
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
}

/// Logs (the access log included) go to stderr through `logsink`'s buffer and writer thread:
/// a request never waits on a `write` to a slow pipe or terminal. The guard writes what is
/// buffered when it is dropped at exit. Without a writer thread (it could not be spawned)
/// lines go to stderr directly.
fn init_logging(cfg: &config::LogConfig) -> Option<portico::logsink::SinkGuard> {
    use portico::logsink::{AccessFormat, LogSink};
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // The buffered writer only with the access log on: its thread makes the process
    // multi-threaded, and then every socket call of the request path pays glibc's
    // cancellation-point bookkeeping (two atomic operations, ~60 instructions each;
    // callgrind, README "Logs"). Without the access log the few other lines are written
    // directly, as `tracing` does by default.
    let started = if cfg.access {
        LogSink::start(std::io::stderr()).ok()
    } else {
        None
    };
    let Some((sink, guard)) = started else {
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(ansi);
        match cfg.format {
            LogFormat::Json => builder.json().flatten_event(true).init(),
            LogFormat::Text => builder.init(),
        }
        return None;
    };
    sink.install(match cfg.format {
        LogFormat::Json => AccessFormat::Json,
        LogFormat::Text => AccessFormat::Text,
    });
    let counted = sink.clone();
    portico::metrics::set_log_drops(move || counted.dropped());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(sink)
        .with_ansi(ansi);
    match cfg.format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
    Some(guard)
}

/// Resolves on SIGTERM or ctrl-c.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received");
}
