//! The `portico` command: argument parsing, logging setup, runtime, signals. Everything else
//! lives in the library.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use portico::config::{self, LogFormat};

const USAGE: &str = "\
usage: portico --config FILE          run the gateway
       portico --check --config FILE  validate the config and exit
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

fn main() -> ExitCode {
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
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.enable_all();
    if config.server.workers > 0 {
        rt.worker_threads(config.server.workers);
    }
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
        .with_writer(std::io::stderr);
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
