//! The `portico` command: argument parsing, logging setup, runtime, signals. Everything else
//! lives in the library.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use portico::config::{self, LogFormat};

/// mimalloc instead of glibc malloc: the request path allocates a few dozen small objects per
/// request (header maps, buffers, futures) and glibc's allocator showed up at ~8 % of portico's
/// CPU in profiles; mimalloc's thread-local free lists make those allocations cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "\
usage: portico --config FILE          run the gateway
       portico --check --config FILE  validate the config and exit
       portico stdio --config FILE [--endpoint /mcp/NAME] [--max-line-bytes N]
       portico stdio --url URL [--header 'K: V']... [--max-line-bytes N]
                                      serve one endpoint over stdin/stdout
       portico --version";

struct Args {
    config: Option<PathBuf>,
    check: bool,
    version: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        config: None,
        check: false,
        version: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" => {
                args.config = Some(it.next().ok_or("--config needs a file")?.into());
            }
            "--check" | "-t" => args.check = true,
            "--version" | "-V" => args.version = true,
            "--help" | "-h" => return Err(String::new()),
            other => {
                if let Some(v) = other.strip_prefix("--config=") {
                    args.config = Some(v.into());
                } else {
                    return Err(format!("unknown argument {other:?}"));
                }
            }
        }
    }
    Ok(args)
}

/// `portico stdio …`.
struct StdioArgs {
    config: Option<PathBuf>,
    url: Option<String>,
    headers: Vec<String>,
    endpoint: Option<String>,
    max_line_bytes: Option<usize>,
}

fn parse_stdio_args(mut it: impl Iterator<Item = String>) -> Result<StdioArgs, String> {
    let mut a = StdioArgs {
        config: None,
        url: None,
        headers: Vec::new(),
        endpoint: None,
        max_line_bytes: None,
    };
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or(format!("{flag} needs {what}"))
        };
        match flag.as_str() {
            "--config" | "-c" => a.config = Some(value("a file")?.into()),
            "--url" => a.url = Some(value("a URL")?),
            "--header" | "-H" => a.headers.push(value("\"Name: value\"")?),
            "--endpoint" => a.endpoint = Some(value("a path")?),
            "--max-line-bytes" => {
                let v = value("a number")?;
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or(format!("--max-line-bytes {v:?}: want a positive number"))?;
                a.max_line_bytes = Some(n);
            }
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    match (&a.config, &a.url) {
        (Some(_), Some(_)) | (None, None) => {
            Err("stdio needs exactly one of --config FILE or --url URL".into())
        }
        (Some(_), None) if !a.headers.is_empty() => {
            Err("--header goes with --url; put headers in the config file".into())
        }
        (None, Some(_)) if a.endpoint.is_some() => {
            Err("--endpoint goes with --config; --url serves its one upstream".into())
        }
        _ => Ok(a),
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
    init_logging(&config.log);
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
        authorization: std::env::var("PORTICO_AUTHORIZATION").ok(),
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
    if std::env::args().nth(1).as_deref() == Some("stdio") {
        return match parse_stdio_args(std::env::args().skip(2)) {
            Ok(a) => stdio_main(a),
            Err(e) => {
                if !e.is_empty() {
                    eprintln!("portico: {e}");
                }
                eprintln!("{USAGE}");
                ExitCode::from(2)
            }
        };
    }
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("portico: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    if args.version {
        println!("portico {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let Some(path) = args.config else {
        eprintln!("portico: --config FILE is required\n{USAGE}");
        return ExitCode::from(2);
    };
    let config = match config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("portico: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    if args.check {
        println!(
            "portico: {}: ok ({} backends)",
            path.display(),
            config.backends.len()
        );
        return ExitCode::SUCCESS;
    }
    init_logging(&config.log);
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

fn init_logging(cfg: &config::LogConfig) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match cfg.format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
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
