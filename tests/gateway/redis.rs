//! Scale-out: two portico replicas sharing one real `redis-server` (Debian package
//! `redis-server`, started here on a free loopback port, killed on drop) in front of the in-repo
//! mock, whose per-method counter says whether a request reached the backend.
//!
//! Redis-dependent assertions run with `redis_timeout_ms = 1000`, so a busy CI machine cannot
//! turn a Redis answer into a timeout; the outage test uses a short budget on purpose.

use crate::common::mock::MockMcp;
use crate::common::*;
use portico::cache::{Cache, Fetched, KeyInput, Outcome, Partition};
use portico::protocol::RequestId;
use serde_json::json;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};

/// A `redis-server` owned by one test.
pub(crate) struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    pub(crate) async fn start() -> RedisServer {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
            l.local_addr().expect("addr").port()
        };
        let mut r = RedisServer { port, child: None };
        r.spawn().await;
        r
    }

    /// Starts (or restarts) the server on this port, without persistence.
    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect(
                "redis-server not found: install the Debian package redis-server (.ci/run does)",
            );
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut c) = self.conn().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut c)
                    .await
                    .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!(
            "redis-server did not answer on port {} within 10 s",
            self.port
        );
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn conn(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }

    fn signal(&self, sig: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .expect("redis-server running");
        let ok = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// Waits until `n` connections subscribe to portico's invalidation channel, so a test never
    /// publishes before a replica listens.
    async fn wait_subscribers(&self, n: i64) {
        let mut c = self.conn().await.expect("connect");
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let (_, count): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("portico:v1:invalidate")
                .query_async(&mut c)
                .await
                .expect("PUBSUB NUMSUB");
            if count >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{count} of {n} replicas subscribed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn config(mock: &str, redis: &RedisServer, redis_timeout_ms: u64) -> String {
    format!(
        "[log]\naccess = false\n[admin]\nlisten = \"127.0.0.1:0\"\n[cache]\nredis_url = \"{}\"\nredis_timeout_ms = {redis_timeout_ms}\n\
         [[backends]]\nname = \"m\"\nurl = \"{mock}\"\ntimeout_ms = 10000\n",
        redis.url()
    )
}

/// Two replicas, both subscribed to the invalidation channel.
async fn replicas(mock: &str, redis: &RedisServer, redis_timeout_ms: u64) -> (Gateway, Gateway) {
    let a = Gateway::start(&config(mock, redis, redis_timeout_ms)).await;
    let b = Gateway::start(&config(mock, redis, redis_timeout_ms)).await;
    redis.wait_subscribers(2).await;
    (a, b)
}

async fn list_with(gw: &Gateway, id: i64, auth: Option<&str>, params: serde_json::Value) -> Resp {
    let bearer = auth.map(|a| format!("Bearer {a}"));
    let extra: Vec<(&str, &str)> = bearer
        .as_deref()
        .map(|b| vec![("authorization", b)])
        .unwrap_or_default();
    let r = mcp_with(&gw.url("/mcp/m"), json!(id), "tools/list", params, &extra).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.json()["id"], id, "the caller's own id");
    r
}

async fn list(gw: &Gateway, id: i64, auth: Option<&str>) -> Resp {
    list_with(gw, id, auth, json!({})).await
}

fn tools(r: &Resp) -> serde_json::Value {
    r.json()["result"]["tools"].clone()
}

/// An admin purge on `a`: `b` (which held the list locally, fetched once) drops its copy when
/// the message arrives (asynchronously: polled, 5 s at most) and refetches from the backend.
async fn purge_reaches(a: &Gateway, b: &Gateway, mock: &crate::common::mock::MockHandle) {
    let r = send("POST", &a.admin_url("/admin/cache/purge"), &[], "").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut id = 10;
    while mock.count("tools/list") < 2 {
        assert!(Instant::now() < deadline, "the purge never reached B");
        list(b, id, None).await;
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (20 s at most) until a key `a` fetches is a Redis hit on `b`: both use Redis again.
async fn shared_again(a: &Gateway, b: &Gateway, mock: &crate::common::mock::MockHandle, tag: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut n = 0;
    loop {
        let cursor = json!({"cursor": format!("{tag}-{n}")});
        list_with(a, 100 + n, None, cursor.clone()).await;
        let before = mock.count("tools/list");
        list_with(b, 200 + n, None, cursor).await;
        if mock.count("tools/list") == before {
            return; // B was answered from Redis
        }
        assert!(Instant::now() < deadline, "B never read from Redis again");
        n += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_public_list_fetched_by_one_replica_is_served_by_the_other() {
    let redis = RedisServer::start().await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(60_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    let (a, b) = replicas(&mock.url(), &redis, 1000).await;
    let first = list(&a, 1, None).await;
    assert_eq!(mock.count("tools/list"), 1);
    let shared = list(&b, 2, None).await;
    assert_eq!(
        mock.count("tools/list"),
        1,
        "replica B answered from Redis, without the backend"
    );
    assert_eq!(tools(&shared), tools(&first));
    let left = shared.json()["result"]["ttlMs"].as_u64().expect("ttlMs");
    assert!(
        left > 0 && left <= 60_000,
        "remaining freshness, not the original: {left}"
    );
    list(&b, 3, None).await;
    assert_eq!(mock.count("tools/list"), 1, "and from its local tier next");
}

#[tokio::test]
async fn a_private_entry_is_shared_with_its_owner_only_and_holds_no_credential() {
    let redis = RedisServer::start().await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(60_000))
        .cache_scope(Some("private"))
        .start()
        .await;
    let (a, b) = replicas(&mock.url(), &redis, 1000).await;
    list(&a, 1, Some("alice-token")).await;
    assert_eq!(mock.count("tools/list"), 1);
    list(&b, 2, Some("bob-token")).await;
    assert_eq!(
        mock.count("tools/list"),
        2,
        "bob's request on B reached the backend: alice's entry is not his"
    );
    list(&b, 3, Some("alice-token")).await;
    assert_eq!(
        mock.count("tools/list"),
        2,
        "alice on B is served her entry from Redis"
    );
    list(&a, 4, None).await;
    assert_eq!(
        mock.count("tools/list"),
        3,
        "anonymous is a partition of its own"
    );

    // Nothing in Redis names the tokens: keys are digests, values are results.
    let mut c = redis.conn().await.expect("connect");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut c)
        .await
        .expect("KEYS");
    assert!(
        keys.iter().any(|k| k.starts_with("portico:v1:e:")),
        "{keys:?}"
    );
    for key in &keys {
        assert!(!key.contains("token"), "{key}");
        if key.starts_with("portico:v1:e:") {
            let value: Vec<u8> = redis::cmd("GET")
                .arg(key)
                .query_async(&mut c)
                .await
                .expect("GET");
            let text = String::from_utf8_lossy(&value);
            assert!(
                !text.contains("token") && !text.contains("Bearer"),
                "{text}"
            );
        }
    }
}

#[tokio::test]
async fn list_changed_seen_by_one_replica_makes_the_other_refetch() {
    let redis = RedisServer::start().await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .list_changed()
        .start()
        .await;
    let (a, b) = replicas(&mock.url(), &redis, 1000).await;
    list(&a, 1, None).await;
    // A opens its listen stream once something is stored; B has served nothing, so it has
    // none: only A hears the change.
    let deadline = Instant::now() + Duration::from_secs(5);
    while mock.count("subscriptions/listen") < 1 {
        assert!(
            Instant::now() < deadline,
            "A never opened its listen stream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // the ack is read
    assert_eq!(mock.count("subscriptions/listen"), 1);
    mock.add_tool("fresh_tool");
    // Poll B only. Without shared invalidation, B would serve A's old record from Redis (and
    // then from its local tier) for ten minutes.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut id = 10;
    loop {
        let r = list(&b, id, None).await;
        if String::from_utf8_lossy(&r.body).contains("fresh_tool") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B still serves the old list: {:?}",
            r.body
        );
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(mock.count("tools/list") >= 2, "B refetched");
}

#[tokio::test]
async fn an_admin_purge_on_one_replica_reaches_the_other() {
    let redis = RedisServer::start().await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    let (a, b) = replicas(&mock.url(), &redis, 1000).await;
    list(&a, 1, None).await;
    list(&b, 2, None).await;
    list(&b, 3, None).await;
    assert_eq!(mock.count("tools/list"), 1, "B holds the entry locally now");
    // B drops its local copy when the message arrives.
    purge_reaches(&a, &b, &mock).await;
    assert_eq!(mock.count("tools/list"), 2, "one refetch, by B");
    // A's local tier was purged too; B's refetch is in Redis for it.
    list(&a, 100, None).await;
    assert_eq!(mock.count("tools/list"), 2, "A is served B's fresh record");
}

/// One `tools/list` through `c` directly (no HTTP), counting fetches in `calls`.
async fn get(c: &Cache, calls: &AtomicU64) -> Outcome {
    let key = KeyInput {
        backend: "m",
        credential_id: "",
        method: "tools/list",
        params: None,
        protocol_version: LATEST,
        capabilities: None,
        client_info: None,
        covers: &[],
    };
    let message =
        r#"{"jsonrpc":"2.0","id":9,"result":{"tools":[],"ttlMs":60000,"cacheScope":"public"}}"#;
    c.get_or_fetch(
        &key,
        &Partition::Anonymous,
        &RequestId::number(1),
        false,
        || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(Fetched {
                status: 200,
                message: message.into(),
            })
        },
    )
    .await
    .expect("served")
    .outcome
}

/// What a config reload does (`Cache::purge_all`) stays in its replica; an operator's purge
/// (`purge_all_replicas`) does not.
#[tokio::test]
async fn a_local_purge_leaves_the_other_replicas_and_redis_alone() {
    let redis = RedisServer::start().await;
    let toml = format!(
        "[cache]\nredis_url = \"{}\"\nredis_timeout_ms = 1000\n",
        redis.url()
    );
    let cfg = portico::config::validate(portico::config::parse(&toml).expect("parse"))
        .expect("valid")
        .cache;
    let (a, b) = (Cache::new(&cfg), Cache::new(&cfg));
    redis.wait_subscribers(2).await;
    let calls = AtomicU64::new(0);
    assert_eq!(get(&a, &calls).await, Outcome::Miss);
    assert_eq!(get(&b, &calls).await, Outcome::SharedHit);
    a.purge_all();
    assert_eq!(
        get(&b, &calls).await,
        Outcome::Hit,
        "B's local tier is untouched"
    );
    assert_eq!(
        get(&a, &calls).await,
        Outcome::SharedHit,
        "Redis still has it"
    );
    assert_eq!(
        a.stats().redis_published,
        0,
        "a local purge announces nothing"
    );

    a.purge_all_replicas();
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.stats().redis_received < 1 {
        assert!(Instant::now() < deadline, "B never heard the purge");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        get(&b, &calls).await,
        Outcome::Miss,
        "gone from B and from Redis"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn replicas_answer_while_redis_hangs_or_is_down_and_use_it_again_after() {
    let mut redis = RedisServer::start().await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    // A short budget: this test is about what happens when Redis does not answer.
    let (a, b) = replicas(&mock.url(), &redis, 200).await;
    let first = list(&a, 1, None).await;
    list(&b, 2, None).await;
    let mut backend = mock.count("tools/list");

    // Hung: connections stay open, nothing answers. Each request is still answered, by the
    // local tier or the backend, bounded by the Redis budget rather than hanging.
    redis.signal("-STOP");
    for (i, gw) in [&a, &b, &a, &b].into_iter().enumerate() {
        let started = Instant::now();
        let r = list_with(
            gw,
            10 + i as i64,
            None,
            json!({"cursor": format!("hung-{i}")}),
        )
        .await;
        assert!(r.json()["result"]["tools"].is_array());
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "a hung Redis delayed a request by {:?}",
            started.elapsed()
        );
        backend += 1;
        assert_eq!(
            mock.count("tools/list"),
            backend,
            "a new key goes to the backend"
        );
        let hit = list(gw, 20 + i as i64, None).await;
        assert_eq!(tools(&hit), tools(&first), "local hits are unaffected");
        assert_eq!(mock.count("tools/list"), backend);
    }
    redis.signal("-CONT");

    // Down: connection refused.
    redis.kill().await;
    for (i, gw) in [&a, &b].into_iter().enumerate() {
        let r = list_with(
            gw,
            30 + i as i64,
            None,
            json!({"cursor": format!("down-{i}")}),
        )
        .await;
        assert!(r.json()["result"]["tools"].is_array());
        let hit = list(gw, 40 + i as i64, None).await;
        assert_eq!(tools(&hit), tools(&first));
    }

    // Back: the replicas reconnect by themselves; a key A fetches is soon a Redis hit on B.
    redis.spawn().await;
    shared_again(&a, &b, &mock, "back").await;
}

/// An invalidated record stays dead even when Redis loses the generation keys (expiry, or
/// eviction under `maxmemory`): a recreated generation starts at a fresh random value.
#[tokio::test]
async fn an_invalidated_record_stays_dead_when_generations_vanish() {
    let redis = RedisServer::start().await;
    let toml = format!(
        "[cache]\nredis_url = \"{}\"\nredis_timeout_ms = 1000\n",
        redis.url()
    );
    let cfg = portico::config::validate(portico::config::parse(&toml).expect("parse"))
        .expect("valid")
        .cache;
    let a = Cache::new(&cfg);
    redis.wait_subscribers(1).await;
    let calls = AtomicU64::new(0);
    assert_eq!(get(&a, &calls).await, Outcome::Miss);
    a.invalidate("m", "tools/list");
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.stats().redis_published < 1 {
        assert!(
            Instant::now() < deadline,
            "the invalidation never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut c = redis.conn().await.expect("connect");
    let gens: Vec<String> = redis::cmd("KEYS")
        .arg("portico:v1:g:*")
        .query_async(&mut c)
        .await
        .expect("KEYS");
    assert_eq!(gens.len(), 3, "all, backend, method: {gens:?}");
    let _: () = redis::cmd("DEL")
        .arg(&gens)
        .query_async(&mut c)
        .await
        .expect("DEL");
    // A replica with an empty local tier: only Redis could answer, and must not.
    let b = Cache::new(&cfg);
    assert_eq!(get(&b, &calls).await, Outcome::Miss);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// A merged page of an aggregated endpoint is one shared entry: replica A is served B's page
/// from Redis (one shared hit, not one per member, and no member asked); purging one member on
/// A kills the page on B as well (its record carries the members' generations, its local copy
/// goes with the member's invalidation message), and B's re-merge asks only that member again.
#[tokio::test]
async fn a_merged_page_is_shared_and_dies_with_any_member_on_every_replica() {
    let redis = RedisServer::start().await;
    let start = || {
        MockMcp::modern()
            .ttl_ms(Some(600_000))
            .cache_scope(Some("public"))
            .start()
    };
    let (x, y) = (start().await, start().await);
    let conf = format!(
        "[log]\naccess = false\n[metrics]\n[admin]\nlisten = \"127.0.0.1:0\"\n[cache]\n\
         redis_url = \"{}\"\nredis_timeout_ms = 1000\n\
         [[backends]]\nname = \"x\"\nurl = \"{}\"\ntimeout_ms = 10000\n\
         [[backends]]\nname = \"y\"\nurl = \"{}\"\ntimeout_ms = 10000\n\
         [[endpoints]]\npath = \"/mcp\"\nbackends = [\"x\", \"y\"]\n",
        redis.url(),
        x.url(),
        y.url()
    );
    let a = Gateway::start(&conf).await;
    let b = Gateway::start(&conf).await;
    redis.wait_subscribers(2).await;
    let merged = |gw: &Gateway, id: i64| {
        let url = gw.url("/mcp");
        async move {
            let r = mcp(&url, json!(id), "tools/list", json!({})).await;
            assert_eq!(r.status, 200, "{:?}", r.body);
            assert_eq!(r.json()["id"], id);
            r.json()["result"]["tools"].clone()
        }
    };
    let counts = || (x.count("tools/list"), y.count("tools/list"));
    let page = merged(&b, 1).await;
    assert_eq!(page.as_array().map(Vec::len), Some(12));
    assert_eq!(counts(), (1, 1));
    let shared = cache_outcome(&a, "shared_hit").await;
    assert_eq!(merged(&a, 2).await, page);
    assert_eq!(counts(), (1, 1), "no member asked");
    assert_eq!(
        cache_outcome(&a, "shared_hit").await - shared,
        1.0,
        "the whole page from Redis, not its parts"
    );
    let r = send(
        "POST",
        &a.admin_url("/admin/cache/purge?backend=x"),
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut id = 10;
    while counts().0 < 2 {
        assert!(
            Instant::now() < deadline,
            "B still serves the page x was purged from"
        );
        assert_eq!(merged(&b, id).await, page);
        id += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(counts(), (2, 1), "only the purged member asked again");
}

/// A TCP relay to Redis that can go silent on the connections that subscribed so far: bytes
/// stop flowing both ways while both sockets stay open, as in a network partition. Stopped
/// (with every connection) on drop.
struct SilentRelay {
    url: String,
    /// Each connection's "silent" switch: those that subscribed, and all of them.
    subscribers: Switches,
    every: Switches,
    task: tokio::task::JoinHandle<()>,
}

type Switches =
    std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<std::sync::atomic::AtomicBool>>>>;

impl Drop for SilentRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SilentRelay {
    async fn start(redis: &RedisServer) -> SilentRelay {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        let upstream = format!("127.0.0.1:{}", redis.port);
        let subscribers: Switches = Arc::default();
        let list = subscribers.clone();
        let every: Switches = Arc::default();
        let all = every.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let silent = Arc::new(AtomicBool::new(false));
                all.lock().unwrap().push(silent.clone());
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let (up_silent, list) = (silent.clone(), list.clone());
                conns.spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut listed = false;
                    while let Ok(n @ 1..) = cr.read(&mut buf).await {
                        let data = &buf[..n];
                        if !listed
                            && data
                                .windows(9)
                                .any(|w| w.eq_ignore_ascii_case(b"SUBSCRIBE"))
                        {
                            listed = true;
                            list.lock().unwrap().push(up_silent.clone());
                        }
                        if up_silent.load(Ordering::SeqCst) {
                            std::future::pending::<()>().await;
                        }
                        if sw.write_all(data).await.is_err() {
                            return;
                        }
                    }
                });
                conns.spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = sr.read(&mut buf).await {
                        if silent.load(Ordering::SeqCst) {
                            std::future::pending::<()>().await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        SilentRelay {
            url,
            subscribers,
            every,
            task,
        }
    }

    /// Every connection so far goes silent (new ones still pass).
    fn silence_all(&self) {
        for s in self.every.lock().unwrap().iter() {
            s.store(true, Ordering::SeqCst);
        }
    }

    /// Every connection that has subscribed so far goes silent.
    fn silence_subscribers(&self) -> usize {
        let list = self.subscribers.lock().unwrap();
        for s in list.iter() {
            s.store(true, Ordering::SeqCst);
        }
        list.len()
    }
}

/// Connections that die without a word (a partition: nothing closes, nothing answers) are
/// found out and replaced. The subscription, by its ping: the replica subscribes again, and an
/// invalidation published afterwards reaches it (before, it waited on the dead connection for
/// good and served its local copies past every purge). The data connection, by two timed-out
/// calls in a row: the replica reads shared entries again (before, every call timed out for as
/// long as the socket stayed open, since the connection manager reconnects only on errors).
#[tokio::test]
async fn silently_dead_redis_connections_are_replaced() {
    let redis = RedisServer::start().await;
    let relay = SilentRelay::start(&redis).await;
    let mock = MockMcp::modern()
        .ttl_ms(Some(600_000))
        .cache_scope(Some("public"))
        .start()
        .await;
    let a = Gateway::start(&config(&mock.url(), &redis, 1000)).await;
    let b_config = config(&mock.url(), &redis, 1000).replace(&redis.url(), &relay.url);
    let b = Gateway::start(&b_config).await;
    redis.wait_subscribers(2).await;
    list(&a, 1, None).await;
    list(&b, 2, None).await;
    list(&b, 3, None).await;
    assert_eq!(mock.count("tools/list"), 1, "B holds the entry locally");
    assert_eq!(
        relay.silence_subscribers(),
        1,
        "B's subscription goes silent"
    );
    // Redis still counts the silent connection; B's new one makes three.
    redis.wait_subscribers(3).await;
    purge_reaches(&a, &b, &mock).await;
    // Now every connection of B's goes silent, the data connection too.
    relay.silence_all();
    shared_again(&a, &b, &mock, "after").await;
}
