//! The `portico` command line: `--check` / `check` name the offending key and exit non-zero, the
//! bundled config passes, `--version` prints the version, every subcommand has `--help`,
//! `PORTICO_CONFIG` stands in for `--config`, and `config schema` prints a JSON Schema that the
//! bundled config (and the README's reference) satisfy and an unknown key breaks.

use serde_json::Value;
use std::process::Command;

fn portico(args: &[&str]) -> (i32, String) {
    portico_env(args, None)
}

/// `portico ARGS` with `PORTICO_CONFIG` set to `config` (or removed): (exit code, stdout+stderr).
fn portico_env(args: &[&str], config: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_portico"));
    cmd.args(args);
    match config {
        Some(c) => cmd.env("PORTICO_CONFIG", c),
        None => cmd.env_remove("PORTICO_CONFIG"),
    };
    let out = cmd.output().expect("run portico");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn temp_file(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("portico-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

fn check_file(name: &str, toml: &str) -> (i32, String) {
    portico(&["--check", "--config", &temp_file(name, toml)])
}

const BUNDLED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/portico.toml");

#[test]
fn check_names_an_unknown_key() {
    let (code, text) = check_file(
        "unknown.toml",
        "[server]\nlisten = \"127.0.0.1:8787\"\nlisten_backlog = 5\n[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\n",
    );
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("listen_backlog"), "{text}");
    let (code, text) = check_file(
        "unknown-backend-key.toml",
        "[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\ntimeout = 5\n",
    );
    assert_ne!(code, 0, "{text}");
    assert!(text.contains("timeout"), "{text}");
}

#[test]
fn check_names_a_duplicate_backend() {
    let (code, text) = check_file(
        "dup.toml",
        "[[backends]]\nname = \"w\"\nbuiltin = \"demo\"\n[[backends]]\nname = \"w\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
    );
    assert_ne!(code, 0, "{text}");
    assert!(
        text.contains("backends[1].name") && text.contains("duplicate"),
        "{text}"
    );
}

#[test]
fn check_refuses_a_backend_with_both_or_neither_url_and_builtin() {
    for (name, toml) in [
        (
            "both.toml",
            "[[backends]]\nname = \"x\"\nbuiltin = \"demo\"\nurl = \"http://127.0.0.1:9/mcp\"\n",
        ),
        ("neither.toml", "[[backends]]\nname = \"x\"\n"),
    ] {
        let (code, text) = check_file(name, toml);
        assert_ne!(code, 0, "{name}: {text}");
        assert!(text.contains("backends[0]"), "{name}: {text}");
    }
}

#[test]
fn the_bundled_config_passes_and_version_prints() {
    let (code, text) = portico(&["--check", "--config", BUNDLED]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok"), "{text}");
    let (code, text) = portico(&["--version"]);
    assert_eq!(code, 0);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
}

#[test]
fn every_subcommand_has_help_naming_its_options() {
    for (args, want) in [
        (
            &["--help"][..],
            &[
                "serve",
                "check",
                "stdio",
                "config",
                "--config",
                "PORTICO_CONFIG",
            ][..],
        ),
        (&["serve", "--help"], &["--config", "PORTICO_CONFIG"]),
        (&["check", "--help"], &["--config", "PORTICO_CONFIG"]),
        (
            &["stdio", "--help"],
            &[
                "--config",
                "--url",
                "--header",
                "-H",
                "--endpoint",
                "--max-line-bytes",
            ],
        ),
        (&["config", "--help"], &["schema"]),
        (&["config", "schema", "--help"], &["JSON Schema"]),
    ] {
        let (code, text) = portico(args);
        assert_eq!(code, 0, "{args:?}: {text}");
        for w in want {
            assert!(text.contains(w), "{args:?} should mention {w}: {text}");
        }
    }
    // The compatibility flag works but is not advertised.
    assert!(!portico(&["--help"]).1.contains("--check"));
    for args in [&["serve", "--version"][..], &["stdio", "--version"]] {
        let (code, text) = portico(args);
        assert_eq!(code, 0, "{args:?}: {text}");
        assert!(text.contains(env!("CARGO_PKG_VERSION")), "{args:?}: {text}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["--check"],
        &["check"],
        &["--no-such-flag"],
        &["serve", "--config"],
        &["no-such-command"],
    ] {
        let (code, text) = portico(args);
        assert_eq!(code, 2, "{args:?}: {text}");
    }
    let (_, text) = portico(&[]);
    assert!(text.contains("--config"), "{text}");
}

#[test]
fn the_check_subcommand_passes_the_bundled_config_and_names_a_bad_key() {
    let (code, text) = portico(&["check", "--config", BUNDLED]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok (1 backends)"), "{text}");
    let bad = temp_file(
        "check-sub.toml",
        "[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\ntimeout = 5\n",
    );
    let (code, text) = portico(&["check", "--config", &bad]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("timeout"), "{text}");
    // `-c` and `--config=` spell it too.
    assert_eq!(portico(&["check", "-c", BUNDLED]).0, 0);
    assert_eq!(portico(&["check", &format!("--config={BUNDLED}")]).0, 0);
}

#[test]
fn portico_config_env_stands_in_for_the_flag() {
    let bad = temp_file(
        "env-bad.toml",
        "[server]\nlisten = \"127.0.0.1:0\"\nlisten_backlog = 5\n",
    );
    let (code, text) = portico_env(&["check"], Some(BUNDLED));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("portico.toml: ok"), "{text}");
    let (code, text) = portico_env(&["check"], Some(&bad));
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("listen_backlog"), "{text}");
    // The old spelling reads it too, and an explicit --config wins over it.
    assert_eq!(portico_env(&["--check"], Some(BUNDLED)).0, 0, "--check");
    let (code, text) = portico_env(&["check", "--config", BUNDLED], Some(&bad));
    assert_eq!(code, 0, "--config over the environment: {text}");
}

/// `portico config schema`, parsed.
fn schema() -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(["config", "schema"])
        .output()
        .expect("run portico");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("the schema is JSON")
}

/// A TOML document as the JSON value the schema describes.
fn toml_json(text: &str) -> Value {
    toml::from_str(text).expect("TOML")
}

fn schema_errors(validator: &jsonschema::Validator, text: &str) -> Vec<String> {
    let doc = toml_json(text);
    validator.iter_errors(&doc).map(|e| e.to_string()).collect()
}

#[test]
fn the_config_schema_validates_the_bundled_config_and_refuses_unknown_keys() {
    let schema = schema();
    assert!(
        jsonschema::meta::is_valid(&schema),
        "not a valid JSON Schema"
    );
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    let validator = jsonschema::validator_for(&schema).expect("compiles");

    let bundled = std::fs::read_to_string(BUNDLED).unwrap();
    assert_eq!(schema_errors(&validator, &bundled), Vec::<String>::new());

    // deny_unknown_fields is additionalProperties: false, at the top and in every table.
    assert_eq!(schema["additionalProperties"], false);
    for (toml, key) in [
        ("[server]\nlisten_backlog = 5\n", "listen_backlog"),
        (
            "[[backends]]\nname = \"demo\"\nbuiltin = \"demo\"\ntimeout = 5\n",
            "timeout",
        ),
        ("[auth.jwt]\njwks_file = \"j\"\nteam = \"x\"\n", "team"),
        ("unknown_table = 1\n", "unknown_table"),
    ] {
        let errors = schema_errors(&validator, toml);
        assert!(
            errors.iter().any(|e| e.contains(key)),
            "{toml:?}: {errors:?}"
        );
    }
    // Types and enumerations are checked too.
    assert!(!schema_errors(&validator, "[server]\nworkers = \"two\"\n").is_empty());
    assert!(!schema_errors(&validator, "[log]\nformat = \"xml\"\n").is_empty());

    // Defaults are the code's DEFAULT_* constants.
    let defs = &schema["definitions"];
    assert_eq!(
        defs["ServerConfig"]["properties"]["listen"]["default"],
        portico::config::DEFAULT_LISTEN
    );
    assert_eq!(
        defs["BackendConfig"]["properties"]["timeout_ms"]["default"],
        portico::config::DEFAULT_TIMEOUT_MS
    );
    assert_eq!(defs["LogConfig"]["properties"]["format"]["default"], "text");
    assert_eq!(defs["AuthConfig"]["properties"]["mode"]["default"], "none");
}

/// The README's configuration reference (every key, with its default) is a file the schema
/// accepts: the two cannot drift apart unnoticed.
#[test]
fn the_readme_reference_satisfies_the_schema() {
    let readme = include_str!("../../README.md");
    let start = readme
        .find("## Configuration reference")
        .expect("README section");
    let block = readme[start..]
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a toml block");
    let validator = jsonschema::validator_for(&schema()).unwrap();
    assert_eq!(schema_errors(&validator, block), Vec::<String>::new());
}
