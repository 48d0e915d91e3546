//! The mock's method table, shared by both eras (`answer`), and its streamed answers: SSE,
//! the slow tools (progress, sleep, a legacy elicitation) and `subscriptions/listen`.

use super::*;

/// The shared method table. `modern` adds `resultType` and cache fields.
pub(super) async fn answer(
    state: Arc<MockState>,
    opts: &Opts,
    method: &str,
    body: &Value,
    headers: &HeaderMap,
    modern: bool,
) -> Response<Body> {
    let id = body["id"].clone();
    let params = &body["params"];
    let wrap = |mut result: Value, cacheable: bool| {
        if modern {
            result["resultType"] = json!("complete");
            if cacheable {
                result = cache_fields(opts, result);
            }
            result["_meta"] =
                json!({"io.modelcontextprotocol/serverInfo":{"name":"mock","version":"1"}});
        }
        json!({"jsonrpc":"2.0","id":id,"result":result})
    };
    let list_delay = opts.list_delay;
    let result = match method {
        "server/discover" if modern => wrap(
            json!({"supportedVersions":[LATEST],"capabilities":caps(opts),"instructions":"mock instructions"}),
            true,
        ),
        "tools/list" => {
            tokio::time::sleep(list_delay).await;
            let cursor = params["cursor"].as_str();
            let caps = if modern {
                params["_meta"]["io.modelcontextprotocol/clientCapabilities"].clone()
            } else {
                state
                    .inits
                    .lock()
                    .unwrap()
                    .get(&session_of(headers))
                    .map(|p| p["capabilities"].clone())
                    .unwrap_or(Value::Null)
            };
            match opts.page_size {
                None => wrap(
                    json!({"tools": tools_for(&state, &caps), "echoCursor": cursor}),
                    true,
                ),
                Some(n) => {
                    let all = tools(&state).as_array().cloned().unwrap_or_default();
                    let Some(from) = cursor.map_or(Some(0), |c| c.parse::<usize>().ok()) else {
                        return json_resp(
                            StatusCode::BAD_REQUEST,
                            &err(&id, -32602, "invalid cursor"),
                        );
                    };
                    let to = (from + n).min(all.len());
                    let mut page = json!({"tools": all.get(from..to).unwrap_or(&[])});
                    if to < all.len() {
                        page["nextCursor"] = json!(to.to_string());
                    }
                    wrap(page, true)
                }
            }
        }
        "prompts/list" => wrap(json!({"prompts":[{"name":"greet"}]}), true),
        "resources/list" => wrap(json!({"resources":[{"uri":"mock://r","name":"r"}]}), true),
        "resources/templates/list" => wrap(json!({"resourceTemplates":[]}), true),
        "resources/read" => {
            let uri = params["uri"].as_str().unwrap_or("");
            if uri == "mock://r" {
                wrap(
                    json!({"contents":[{"uri":uri,"text":"mock resource"}]}),
                    true,
                )
            } else if uri == "mock://needs-input" && modern {
                // An MRTR round: the server needs input first. Carries a ttlMs to prove that
                // portico never caches an `input_required` result even when told a TTL.
                json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"input_required","ttlMs":60000,"cacheScope":"public",
                    "inputRequests":{"q":{"method":"elicitation/create","params":{"message":"why?","requestedSchema":{"type":"object"}}}},
                    "requestState":"s1"}})
            } else if modern {
                json!({"jsonrpc":"2.0","id":id,"error":{"code":-32602,"message":"Resource not found","data":{"uri":uri}}})
            } else {
                json!({"jsonrpc":"2.0","id":id,"error":{"code":-32002,"message":"Resource not found","data":{"uri":uri}}})
            }
        }
        "prompts/get" => wrap(
            json!({"messages":[{"role":"user","content":{"type":"text","text":format!("Hello, {}!", params["arguments"]["name"].as_str().unwrap_or("?"))}}]}),
            false,
        ),
        "ping" if !modern => json!({"jsonrpc":"2.0","id":id,"result":{}}),
        "tools/call" => {
            let name = params["name"].as_str().unwrap_or("");
            let args = &params["arguments"];
            let text = |t: String| {
                wrap(
                    json!({"content":[{"type":"text","text":t}],"isError":false}),
                    false,
                )
            };
            match name {
                "echo" => text(args["text"].as_str().unwrap_or("").to_string()),
                "add" => text(
                    (args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)).to_string(),
                ),
                // Per-session state: `store {value}` keeps a value, `recall` reads it back.
                "store" => {
                    let v = args["value"].as_str().unwrap_or("").to_string();
                    state.stored.lock().unwrap().insert(session_of(headers), v);
                    text("stored".into())
                }
                "recall" => text(
                    state
                        .stored
                        .lock()
                        .unwrap()
                        .get(&session_of(headers))
                        .cloned()
                        .unwrap_or_else(|| "none".into()),
                ),
                "sampler" => text("sampled".into()),
                // MRTR (2026-07-28): `arguments.rounds` rounds of `input_required` asking
                // `arguments.methods` (default elicitation), then the responses it got.
                "mrtr" if modern => {
                    let rounds = args["rounds"].as_u64().unwrap_or(1);
                    let done = params["requestState"]
                        .as_str()
                        .and_then(|s| s.strip_prefix("mrtr-state-"))
                        .and_then(|s| s.split(' ').next())
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                    if done < rounds {
                        let methods = args["methods"]
                            .as_array()
                            .cloned()
                            .unwrap_or_else(|| vec![json!("elicitation/create")]);
                        let mut reqs = serde_json::Map::new();
                        for (i, m) in methods.iter().enumerate() {
                            let p = match m.as_str().unwrap_or("") {
                                "sampling/createMessage" => {
                                    json!({"messages":[{"role":"user","content":{"type":"text","text":"capital of France?"}}],"maxTokens":10})
                                }
                                "roots/list" => json!({}),
                                _ => {
                                    json!({"mode":"form","message":"name?","requestedSchema":{"type":"object","properties":{"name":{"type":"string"}}}})
                                }
                            };
                            reqs.insert(format!("q{i}"), json!({"method": m, "params": p}));
                        }
                        json!({"jsonrpc":"2.0","id":id,"result":{"resultType":"input_required",
                            "inputRequests": reqs, "requestState": format!("mrtr-state-{} \u{e9}+/=", done + 1)}})
                    } else {
                        text(format!("got: {}", params["inputResponses"]))
                    }
                }
                "whoami" => text(
                    headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("none")
                        .to_string(),
                ),
                "regional" => text(format!(
                    "{} {} {}",
                    args["region"].as_str().unwrap_or("-"),
                    args["priority"],
                    args["urgent"]
                )),
                // An error whose words mention a session (the legacy session is fine).
                "session_error" => {
                    return json_resp(
                        StatusCode::BAD_REQUEST,
                        &err(&id, -32000, "Bad Request: No valid session ID provided"),
                    );
                }
                "progress" | "slow" | "ask" => {
                    return streaming(state, opts, name, body.clone(), modern).await;
                }
                n if state.extra_tools.lock().unwrap().iter().any(|t| t == n) => {
                    text(n.to_string())
                }
                _ => err(&id, -32602, &format!("Unknown tool: {name}")),
            }
        }
        "subscriptions/listen" if modern => return listen(state, body.clone()),
        _ => {
            return json_resp(
                StatusCode::NOT_FOUND,
                &err(&id, -32601, &format!("Method not found: {method}")),
            );
        }
    };
    if opts.sse {
        sse_resp(vec![result])
    } else {
        let status = if result.get("error").is_some() && modern && method != "tools/call" {
            StatusCode::BAD_REQUEST
        } else {
            StatusCode::OK
        };
        json_resp(status, &result)
    }
}

pub(super) fn sse_resp(msgs: Vec<Value>) -> Response<Body> {
    let chunks: Vec<Bytes> = msgs
        .iter()
        .map(|m| sse_event(m.to_string().as_bytes()))
        .collect();
    let mut r = Response::new(Body::Stream(Box::pin(futures_util::stream::iter(chunks))));
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r
}

/// Tools whose answers take time: `progress` (notifications then result), `slow` (sleeps),
/// `ask` (legacy: sends an elicitation request and waits for its answer).
async fn streaming(
    state: Arc<MockState>,
    opts: &Opts,
    name: &str,
    body: Value,
    modern: bool,
) -> Response<Body> {
    let id = body["id"].clone();
    let args = body["params"]["arguments"].clone();
    let token = body["params"]["_meta"]["progressToken"].clone();
    let sse = opts.sse || (name == "progress" && !token.is_null()) || name == "ask";
    let name = name.to_string();
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    let guard_state = state.clone();
    let fut = async move {
        let mut guard = CancelGuard {
            state: guard_state,
            req: body.clone(),
            done: false,
        };
        let result_text = match name.as_str() {
            "progress" => {
                let steps = args["steps"].as_u64().unwrap_or(3);
                let delay = args["delay_ms"].as_u64().unwrap_or(20);
                for i in 1..=steps {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    if !token.is_null() {
                        let n = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":token,"progress":i,"total":steps}});
                        if tx.send(sse_event(n.to_string().as_bytes())).await.is_err() {
                            return;
                        }
                    }
                }
                format!("done {steps}")
            }
            "slow" => {
                let ms = args["ms"].as_u64().unwrap_or(1000);
                // Keep-alive comments let the server notice a client that went away.
                let end = tokio::time::Instant::now() + Duration::from_millis(ms);
                while tokio::time::Instant::now() < end {
                    tokio::time::sleep(
                        Duration::from_millis(20).min(end - tokio::time::Instant::now()),
                    )
                    .await;
                    if sse
                        && tx
                            .send(Bytes::from_static(b": keepalive\n\n"))
                            .await
                            .is_err()
                    {
                        return;
                    }
                }
                format!("slept {ms}")
            }
            _ => {
                // ask: server-initiated requests (`arguments.method`, default elicitation,
                // `arguments.times` of them in turn), each waiting (`arguments.wait_ms`) for
                // the client's response; every answer is recorded with when it came.
                let method = args["method"].as_str().unwrap_or("elicitation/create");
                let times = args["times"].as_u64().unwrap_or(1);
                let wait = Duration::from_millis(args["wait_ms"].as_u64().unwrap_or(5000));
                let params = match method {
                    "sampling/createMessage" => {
                        json!({"messages":[{"role":"user","content":{"type":"text","text":"capital of France?"}}],"maxTokens":10})
                    }
                    "roots/list" => json!({}),
                    _ => {
                        json!({"message":"name?","requestedSchema":{"type":"object","properties":{}}})
                    }
                };
                let mut answers = Vec::new();
                for _ in 0..times {
                    let rid = format!("srv-{}", state.next_session.fetch_add(1, Ordering::Relaxed));
                    let (otx, orx) = oneshot::channel();
                    state
                        .waiting
                        .lock()
                        .unwrap()
                        .insert(format!("\"{rid}\""), otx);
                    let q = json!({"jsonrpc":"2.0","id":rid,"method":method,"params":params});
                    state
                        .asked
                        .lock()
                        .unwrap()
                        .push(tokio::time::Instant::now());
                    if tx.send(sse_event(q.to_string().as_bytes())).await.is_err() {
                        return;
                    }
                    match tokio::time::timeout(wait, orx).await {
                        Ok(Ok(answer)) => {
                            state
                                .answers
                                .lock()
                                .unwrap()
                                .push((tokio::time::Instant::now(), answer.clone()));
                            state.answered.notify_waiters();
                            answers.push(format!("answer: {answer}"));
                        }
                        _ => answers.push("no answer".to_string()),
                    }
                }
                answers.join("\n")
            }
        };
        let mut result = json!({"content":[{"type":"text","text":result_text}],"isError":false});
        if modern {
            result["resultType"] = json!("complete");
        }
        let msg = json!({"jsonrpc":"2.0","id":id,"result":result});
        guard.done = true;
        let _ = tx.send(sse_event(msg.to_string().as_bytes())).await;
    };
    if sse {
        // The producer runs inside the body stream: dropping the body (client gone) drops it,
        // and the guard records the cancellation.
        let stream = futures_util::stream::unfold(
            (Some(Box::pin(fut)), rx),
            |(mut fut, mut rx)| async move {
                loop {
                    match &mut fut {
                        Some(f) => {
                            tokio::select! {
                                biased;
                                m = rx.recv() => return m.map(|m| (m, (fut, rx))),
                                _ = f.as_mut() => { fut = None; }
                            }
                        }
                        None => return rx.recv().await.map(|m| (m, (None, rx))),
                    }
                }
            },
        );
        let mut r = Response::new(Body::Stream(Box::pin(stream)));
        r.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        r
    } else {
        // JSON: run to completion, then answer with the last message.
        let mut rx = rx;
        let collector = tokio::spawn(async move {
            let mut last = Bytes::new();
            while let Some(m) = rx.recv().await {
                last = m;
            }
            last
        });
        fut.await;
        let last = collector.await.unwrap_or_default();
        let text = String::from_utf8_lossy(&last);
        let data = text
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .unwrap_or("{}")
            .to_string();
        let mut r = Response::new(Body::full(data));
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        r
    }
}

/// `subscriptions/listen`: acknowledge, then relay `list_changed` as tools are added.
fn listen(state: Arc<MockState>, body: Value) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let id = body["id"].clone();
    let ack = json!({"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"notifications":body["params"]["notifications"],"_meta":{"io.modelcontextprotocol/subscriptionId":id}}});
    let _ = tx.try_send(sse_event(ack.to_string().as_bytes()));
    let uris = body["params"]["notifications"]["resourceSubscriptions"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|u| u.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    state.listeners.lock().unwrap().push((uris, tx));
    let stream =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    let mut r = Response::new(Body::Stream(Box::pin(stream)));
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r
}
