//! The mock in its initialize-era shape: sessions, the probe's refusals (`LegacyRejects`),
//! the standalone GET stream, then the shared method table without `resultType`.

use super::*;

pub(super) async fn legacy(
    state: Arc<MockState>,
    opts: Opts,
    parts: http::request::Parts,
    body: Value,
) -> Response<Body> {
    let h = |n: &str| header(&parts.headers, n);
    let session = h("mcp-session-id");
    if parts.method == Method::DELETE {
        state.deletes.fetch_add(1, Ordering::Relaxed);
        if let Some(s) = session {
            state.sessions.lock().unwrap().remove(&s);
            state.deleted.lock().unwrap().push(s);
        }
        return empty(StatusCode::OK);
    }
    if parts.method == Method::GET && !opts.stateless && !opts.no_get_stream {
        // The standalone SSE stream of a session (legacy Streamable HTTP).
        let known = session
            .as_ref()
            .is_some_and(|s| state.sessions.lock().unwrap().contains(s));
        if !known {
            return empty(StatusCode::NOT_FOUND);
        }
        let _ = state.gets_open.subscribe().wait_for(|open| *open).await;
        let refused = {
            let mut r = state.get_refusals.lock().unwrap();
            match r.0 {
                0 => None,
                n => {
                    r.0 = n - 1;
                    Some(r.1)
                }
            }
        };
        if let Some(status) = refused {
            return empty(StatusCode::from_u16(status).unwrap());
        }
        if let Some(last) = h("last-event-id") {
            state.resumed_from.lock().unwrap().push(last.clone());
            let Some(r) = state.resumable.lock().unwrap().remove(&last) else {
                return empty(StatusCode::BAD_REQUEST);
            };
            return resumed(&state, session.as_deref().unwrap_or(""), r);
        }
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        state
            .get_streams
            .lock()
            .unwrap()
            .push((session.clone().unwrap_or_default(), tx));
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let mut r = Response::new(Body::Stream(Box::pin(stream)));
        r.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        return r;
    }
    if parts.method != Method::POST {
        return empty(StatusCode::METHOD_NOT_ALLOWED);
    }
    let id = body.get("id").cloned().unwrap_or(Value::Null);
    let method = body
        .get("method")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    // A response from the client to a server-initiated request.
    if body.get("method").is_none() && (body.get("result").is_some() || body.get("error").is_some())
    {
        let key = body["id"].to_string();
        if let Some(tx) = state.waiting.lock().unwrap().remove(&key) {
            let _ = tx.send(body.clone());
        }
        return empty(StatusCode::ACCEPTED);
    }
    // A 2026-07-28 request reaching a legacy server: the probe's view.
    if h("mcp-protocol-version").as_deref() == Some(LATEST) && method != "initialize" {
        match opts.rejects {
            LegacyRejects::TsUnsupportedVersion => {
                return json_resp(
                    StatusCode::BAD_REQUEST,
                    &err(
                        &Value::Null,
                        -32000,
                        "Bad Request: Unsupported protocol version: 2026-07-28 (supported versions: 2025-11-25, 2025-06-18, 2025-03-26)",
                    ),
                );
            }
            LegacyRejects::PyMissingSession => {
                return json_resp(
                    StatusCode::BAD_REQUEST,
                    &err(&id, -32600, "Bad Request: Missing session ID"),
                );
            }
            LegacyRejects::Empty404 => return empty(StatusCode::NOT_FOUND),
            LegacyRejects::Html405 => {
                let mut r = Response::new(Body::full("<html>405 Method Not Allowed</html>"));
                *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
                r.headers_mut()
                    .insert("content-type", "text/html".parse().unwrap());
                return r;
            }
            LegacyRejects::AnswerLegacy => {}
        }
    }
    if method == "initialize" {
        let asked = body["params"]["protocolVersion"]
            .as_str()
            .unwrap_or("2025-03-26");
        let version = if ["2025-11-25", "2025-06-18", "2025-03-26"].contains(&asked) {
            asked
        } else {
            "2025-11-25"
        };
        let mut capabilities = caps(&opts);
        if opts.subscribe_and_log {
            // 2025-11-25's in-core experimental tasks, which portico does not bridge.
            capabilities["tasks"] = json!({"list": {}, "cancel": {}});
        }
        let instructions = if opts.instructions_per_client {
            let declared = body["params"]["capabilities"]
                .as_object()
                .map(|c| c.keys().cloned().collect::<Vec<_>>().join(","))
                .unwrap_or_default();
            format!("legacy instructions for [{declared}]")
        } else {
            "legacy instructions".to_string()
        };
        let result = json!({"jsonrpc":"2.0","id":id,"result":{"protocolVersion":version,
            "capabilities":capabilities,
            "serverInfo":{"name":"legacy-mock","version":"1"},"instructions":instructions}});
        let mut resp = if opts.sse {
            sse_resp(vec![result])
        } else {
            json_resp(StatusCode::OK, &result)
        };
        if opts.stateless {
            state
                .inits
                .lock()
                .unwrap()
                .insert(String::new(), body["params"].clone());
        } else {
            let sid = format!(
                "sess-{}",
                state.next_session.fetch_add(1, Ordering::Relaxed)
            );
            state.sessions.lock().unwrap().insert(sid.clone());
            state
                .inits
                .lock()
                .unwrap()
                .insert(sid.clone(), body["params"].clone());
            resp.headers_mut()
                .insert("mcp-session-id", sid.parse().unwrap());
        }
        return resp;
    }
    if !opts.stateless {
        match &session {
            None => {
                return json_resp(
                    StatusCode::BAD_REQUEST,
                    &err(&Value::Null, -32000, "Bad Request: Server not initialized"),
                );
            }
            Some(s) if !state.sessions.lock().unwrap().contains(s) => {
                return json_resp(
                    StatusCode::NOT_FOUND,
                    &err(&Value::Null, -32001, "Session not found"),
                );
            }
            _ => {}
        }
    }
    if body.get("id").is_none() {
        if method == "notifications/cancelled" {
            let key = (
                session.clone().unwrap_or_default(),
                body["params"]["requestId"].to_string(),
            );
            if let Some(tag) = state.tags.lock().unwrap().get(&key) {
                state.cancelled_tags.lock().unwrap().push(tag.clone());
            }
            state.cancel_notes.lock().unwrap().push(body.clone());
            state.cancelled_notify.notify_waiters();
        }
        return empty(StatusCode::ACCEPTED);
    }
    if method == "tools/call"
        && let Some(tag) = body["params"]["arguments"]["tag"].as_str()
    {
        state.tags.lock().unwrap().insert(
            (session.clone().unwrap_or_default(), id.to_string()),
            tag.to_string(),
        );
    }
    if let Some(v) = h("mcp-protocol-version")
        && !["2025-11-25", "2025-06-18", "2025-03-26"].contains(&v.as_str())
    {
        return json_resp(
            StatusCode::BAD_REQUEST,
            &err(
                &Value::Null,
                -32000,
                &format!("Bad Request: Unsupported protocol version: {v}"),
            ),
        );
    }
    if method == "tools/call" && body["params"]["name"] == "resumable" {
        // 2025-11-25 resumability: a priming event (an id, no data) and the pause to wait, then
        // the stream closes; each resumption gets the next part (`hops` in all).
        let args = &body["params"]["arguments"];
        let first = format!("{}/{id}/0", session.as_deref().unwrap_or(""));
        let mut events = format!("id: {first}\ndata:\n\n");
        if let Some(ms) = args["retry"].as_u64() {
            events.push_str(&format!("retry: {ms}\n\n"));
        }
        let r = Resumable {
            id: id.clone(),
            left: args["hops"].as_u64().unwrap_or(1) - 1,
            next: 1,
        };
        state.resumable.lock().unwrap().insert(first, r);
        if args["break"] == true {
            // The connection breaks instead, in the middle of an event that is never finished
            // (its `id` read, its blank line never sent).
            events.push_str(&format!(
                "id: {session}/{id}/half\ndata: {{\"jsonrpc\"",
                session = session.as_deref().unwrap_or("")
            ));
            return broken_sse(events);
        }
        return raw_sse(events);
    }
    if opts.subscribe_and_log {
        let session = session.unwrap_or_default();
        let ok = json!({"jsonrpc":"2.0","id":id,"result":{}});
        match method.as_str() {
            "resources/subscribe" | "resources/unsubscribe" => {
                let uri = body["params"]["uri"].as_str().unwrap_or("").to_string();
                let mut subs = state.subscribed.lock().unwrap();
                let set = subs.entry(session).or_default();
                if method == "resources/subscribe" {
                    set.insert(uri);
                } else {
                    set.remove(&uri);
                }
                return json_resp(StatusCode::OK, &ok);
            }
            "logging/setLevel" => {
                let level = body["params"]["level"].as_str().unwrap_or("").to_string();
                state.levels.lock().unwrap().insert(session, level);
                return json_resp(StatusCode::OK, &ok);
            }
            "tools/call" if body["params"]["name"] == "log" => {
                // One line per level on this request's stream, as far as the session's level
                // lets through; `data` names the caller's tag and the level.
                let tag = body["params"]["arguments"]["tag"].as_str().unwrap_or("");
                let min = state.levels.lock().unwrap().get(&session).cloned();
                let mut msgs: Vec<Value> = ["debug", "info", "warning", "error"]
                    .iter()
                    .filter(|l| at_least(l, min.as_deref()))
                    .map(|l| json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":l,"data":format!("{tag}:{l}")}}))
                    .collect();
                msgs.push(json!({"jsonrpc":"2.0","id":id,"result":{"content":[{"type":"text","text":"logged"}],"isError":false}}));
                return sse_resp(msgs);
            }
            _ => {}
        }
    }
    answer(state, &opts, &method, &body, &parts.headers, false).await
}

/// The next part of a `resumable` answer: a log line (its stream closed again, to be resumed)
/// or the response.
fn resumed(state: &MockState, session: &str, r: Resumable) -> Response<Body> {
    let event_id = format!("{session}/{}/{}", r.id, r.next);
    let message = if r.left > 0 {
        let line = format!("part {}", r.next);
        state.resumable.lock().unwrap().insert(
            event_id.clone(),
            Resumable {
                id: r.id.clone(),
                left: r.left - 1,
                next: r.next + 1,
            },
        );
        json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":line}})
    } else {
        json!({"jsonrpc":"2.0","id":r.id,"result":{"content":[{"type":"text","text":"resumed"}],"isError":false}})
    };
    raw_sse(format!(
        "id: {event_id}\nevent: message\ndata: {message}\n\n"
    ))
}

/// An event stream of `events` whose connection breaks after them: it declares more bytes than
/// it sends, so the server drops the connection mid-body.
fn broken_sse(events: String) -> Response<Body> {
    let declared = events.len() + 64;
    // A stream, not one buffer: its length is unknown up front, so the declared one stands.
    // It pauses before it ends short, so what it sent is on the wire before the break.
    let chunk = futures_util::stream::unfold(Some(events), |events| async move {
        match events {
            Some(e) => Some((Bytes::from(e), None)),
            None => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                None
            }
        }
    });
    let mut r = Response::new(Body::Stream(Box::pin(chunk)));
    let h = r.headers_mut();
    h.insert("content-type", "text/event-stream".parse().unwrap());
    h.insert("content-length", declared.to_string().parse().unwrap());
    r
}

/// An event stream of exactly `events`, ended after them.
fn raw_sse(events: String) -> Response<Body> {
    let mut r = Response::new(Body::full(events));
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r
}
