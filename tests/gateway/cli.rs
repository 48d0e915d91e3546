//! The `portico` command line: `--check` names the offending key and exits non-zero, the
//! bundled config passes, `--version` prints the version.

use std::process::Command;

fn portico(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_portico"))
        .args(args)
        .output()
        .expect("run portico");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

fn check_file(name: &str, toml: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("portico-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    portico(&["--check", "--config", path.to_str().unwrap()])
}

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
    let bundled = concat!(env!("CARGO_MANIFEST_DIR"), "/config/portico.toml");
    let (code, text) = portico(&["--check", "--config", bundled]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("ok"), "{text}");
    let (code, text) = portico(&["--version"]);
    assert_eq!(code, 0);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
}
