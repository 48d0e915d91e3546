//! The stdio wire: newline-delimited JSON-RPC lines read within a size cap, and the
//! rewriting of ids and progress tokens to gateway ids and back.

use super::*;

/// One line from a stdio server, or what was left of one too long to keep.
pub(crate) enum Line {
    Text(Vec<u8>),
    /// A line longer than the limit was discarded; its length.
    TooLong(usize),
}

/// Reads `\n`-terminated lines, holding at most `max` bytes: the rest of a longer line is
/// discarded as it arrives. Cancel-safe (all state lives here; nothing is lost between awaits),
/// so it can sit in a `select!`.
pub(crate) struct LineReader<R> {
    inner: BufReader<R>,
    buf: Vec<u8>,
    max: usize,
    /// Bytes discarded so far of an oversized line.
    skipping: Option<usize>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner: BufReader::new(inner),
            buf: Vec::new(),
            max,
            skipping: None,
        }
    }

    pub(crate) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let chunk = self.inner.fill_buf().await?;
            if chunk.is_empty() {
                // End of stream: a last line without '\n' still counts.
                if let Some(n) = self.skipping.take() {
                    return Ok(Some(Line::TooLong(n)));
                }
                return Ok(
                    (!self.buf.is_empty()).then(|| Line::Text(std::mem::take(&mut self.buf)))
                );
            }
            let newline = chunk.iter().position(|b| *b == b'\n');
            let take = newline.unwrap_or(chunk.len());
            match &mut self.skipping {
                Some(n) => *n += take,
                None if self.buf.len() + take > self.max => {
                    self.skipping = Some(self.buf.len() + take);
                    self.buf = Vec::new(); // give the memory back now
                }
                None => self.buf.extend_from_slice(&chunk[..take]),
            }
            self.inner.consume(take + usize::from(newline.is_some()));
            if newline.is_some() {
                if let Some(n) = self.skipping.take() {
                    return Ok(Some(Line::TooLong(n)));
                }
                let mut line = std::mem::take(&mut self.buf);
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                if !line.is_empty() {
                    return Ok(Some(Line::Text(line)));
                }
            }
        }
    }
}

/// The parts of a caller's message portico needs; params stay raw (never re-encoded, so big
/// numbers and key order survive).
pub(super) struct Outbound<'a> {
    pub(super) id: Option<&'a RawValue>,
    pub(super) method: Cow<'a, str>,
    pub(super) params: Option<&'a RawValue>,
}

impl<'a> Outbound<'a> {
    pub(super) fn parse(body: &'a [u8]) -> Result<Outbound<'a>, UpstreamError> {
        #[derive(Deserialize)]
        struct Msg<'a> {
            #[serde(borrow)]
            id: Option<&'a RawValue>,
            #[serde(borrow)]
            method: Option<Cow<'a, str>>,
            #[serde(borrow)]
            params: Option<&'a RawValue>,
        }
        let bad = || UpstreamError::Protocol("not a JSON-RPC request or notification".into());
        if first_byte(body) != Some(b'{') {
            return Err(bad());
        }
        let m: Msg = serde_json::from_slice(body).map_err(|_| bad())?;
        Ok(Outbound {
            id: m.id,
            method: m.method.ok_or_else(bad)?,
            params: m.params,
        })
    }
}

/// Whether a request's `params._meta` sets `io.modelcontextprotocol/logLevel` (to anything but
/// null): read as JSON, so the name inside a string (a tool's arguments) does not count.
pub(super) fn asks_for_logs(params: Option<&RawValue>) -> bool {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "_meta", borrow)]
        meta: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(rename = "io.modelcontextprotocol/logLevel", borrow)]
        level: Option<&'a RawValue>,
    }
    let Some(p) = params.filter(|p| p.get().contains(crate::protocol::meta::LOG_LEVEL)) else {
        return false;
    };
    serde_json::from_str::<Params>(p.get())
        .ok()
        .and_then(|p| p.meta)
        .and_then(|m| serde_json::from_str::<Meta>(m.get()).ok())
        .and_then(|m| m.level)
        .is_some_and(|l| l.get() != "null")
}

/// A message from the child.
#[derive(Deserialize)]
pub(super) struct Incoming<'a> {
    #[serde(borrow)]
    pub(super) id: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) method: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) params: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) result: Option<&'a RawValue>,
    #[serde(borrow)]
    pub(super) error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct ErrorCode {
    pub(super) code: i64,
}

#[derive(Serialize)]
pub(super) struct OutRequest<'a> {
    pub(super) jsonrpc: &'static str,
    pub(super) id: u64,
    pub(super) method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) params: Option<&'a RawValue>,
}

#[derive(Serialize)]
pub(super) struct OutResponse<'a> {
    pub(super) jsonrpc: &'static str,
    pub(super) id: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) result: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) error: Option<&'a RawValue>,
}

pub(super) fn request_line(gid: u64, method: &str, params: Option<&RawValue>) -> Bytes {
    let msg = OutRequest {
        jsonrpc: "2.0",
        id: gid,
        method,
        params,
    };
    line_of(serde_json::to_vec(&msg).unwrap_or_default())
}

/// Replaces `params._meta.progressToken` with the gateway token; returns the new params and the
/// caller's token. `None` when there is no token (the params are then sent untouched).
pub(super) fn rewrite_token(params: &RawValue, gid: u64) -> Option<(Box<RawValue>, Box<RawValue>)> {
    if !params.get().contains("progressToken") {
        return None; // cheap skip: most requests carry no token
    }
    let mut p = serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(params.get()).ok()?;
    let mut meta =
        serde_json::from_str::<BTreeMap<String, Box<RawValue>>>(p.get("_meta")?.get()).ok()?;
    let token = to_raw_value(&format!("{TOKEN_PREFIX}{gid}")).ok()?;
    let orig = meta.insert("progressToken".into(), token)?;
    p.insert("_meta".into(), to_raw_value(&meta).ok()?);
    Some((to_raw_value(&p).ok()?, orig))
}

/// One wire line. Raw bytes `\n`/`\r` can only be insignificant whitespace in valid JSON
/// (control characters are escaped inside strings), so turning them into spaces keeps a
/// pretty-printed message intact while keeping the newline framing.
pub(super) fn line_of(mut msg: Vec<u8>) -> Bytes {
    for b in msg.iter_mut().filter(|b| matches!(**b, b'\n' | b'\r')) {
        *b = b' ';
    }
    msg.push(b'\n');
    Bytes::from(msg)
}

/// A gateway id as the child echoed it (we only ever send non-negative integers).
pub(super) fn gateway_id(raw: &RawValue) -> Option<u64> {
    raw.get().parse().ok()
}

pub(super) fn preview(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(&line[..line.len().min(200)]);
    if line.len() > 200 {
        format!("{text}…")
    } else {
        text.into_owned()
    }
}
