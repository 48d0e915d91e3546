//! Aggregated endpoints without a network: how prefixed and bare names and resource URIs
//! route to members, and what policies see.

use super::*;

fn endpoint(members: &str) -> Endpoint {
    let cfg = crate::config::validate(
        crate::config::parse(&format!(
            "[[backends]]\nname='gh'\nbuiltin='demo'\n[[backends]]\nname='fs'\nbuiltin='demo'\n\
             [[backends]]\nname='bare'\nbuiltin='demo'\n[[endpoints]]\npath='/mcp'\nbackends={members}\n"
        ))
        .expect("parse"),
    )
    .expect("valid");
    let backends: HashMap<String, Arc<Backend>> = cfg
        .backends
        .iter()
        .map(|b| {
            (
                b.name.clone(),
                Arc::new(Backend::build(b).expect("backend")),
            )
        })
        .collect();
    Endpoint::build(&cfg.endpoints[0], &backends).expect("endpoint")
}

#[test]
fn prefixes_route_names_and_expose_them_to_policies() {
    let ep = endpoint(r#"["gh", { name = "fs", prefix = "files" }]"#);
    assert_eq!(
        ep.owner(ListKind::Tools, "gh__echo"),
        Some((0, "echo".into()))
    );
    assert_eq!(
        ep.owner(ListKind::Tools, "files__read"),
        Some((1, "read".into()))
    );
    assert_eq!(
        ep.owner(ListKind::Tools, "fs__read"),
        None,
        "the prefix, not the name"
    );
    assert_eq!(ep.owner(ListKind::Tools, "echo"), None);
    // What team policies are matched against.
    assert_eq!(ep.exposure(1).name("read"), "files__read");
    assert!(!ep.has_bare_member());
}

#[test]
fn bare_names_come_from_the_lists_and_collide_loudly() {
    let ep = endpoint(r#"[{ name = "bare", prefix = "" }, { name = "fs", prefix = "" }, "gh"]"#);
    assert!(ep.has_bare_member());
    assert_eq!(
        ep.owner(ListKind::Tools, "echo"),
        None,
        "unknown until listed"
    );
    ep.learn(
        ListKind::Tools,
        true,
        &[("echo".into(), 0), ("gh__x".into(), 2)],
    )
    .expect("first page");
    assert_eq!(ep.owner(ListKind::Tools, "echo"), Some((0, "echo".into())));
    // A later page where another bare member lists the same name: a named collision.
    let err = ep
        .learn(ListKind::Tools, false, &[("echo".into(), 1)])
        .expect_err("collision");
    assert!(
        matches!(err, GatewayError::NameCollision { ref first, ref second, .. } if first == "bare" && second == "fs"),
        "{err}"
    );
    // A new first page starts afresh: the tool moved to the other member.
    ep.learn(ListKind::Tools, true, &[("echo".into(), 1)])
        .expect("fresh walk");
    assert_eq!(ep.owner(ListKind::Tools, "echo"), Some((1, "echo".into())));
}

#[test]
fn resources_route_by_listed_uri_then_template() {
    let ep = endpoint(r#"["gh", "fs"]"#);
    ep.learn(
        ListKind::Resources,
        true,
        &[("file:///a".into(), 1), ("file:///a".into(), 0)],
    )
    .expect("resources");
    ep.learn(
        ListKind::Templates,
        true,
        &[("repo://{owner}/{name}".into(), 0)],
    )
    .expect("templates");
    assert_eq!(
        ep.uri_owner("file:///a"),
        Some(1),
        "the first member listing it"
    );
    assert_eq!(ep.uri_owner("repo://octo/portico"), Some(0));
    assert_eq!(ep.uri_owner("other://x"), None);
}
