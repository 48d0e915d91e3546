//! Calls in flight on shared upstreams, by client, so a client's `notifications/cancelled`
//! cancels its own call and nobody else's.
//!
//! On a pooled legacy session or a stdio child, requests of many clients travel together with
//! rewritten, gateway-unique ids (docs/protocol.md §8 item 14). A client's cancel names *its*
//! id, so it is looked up here under the client's scope (its authorization context, or its
//! legacy-client session: `bridge::Owner::scope`) — never forwarded. Cancelling drops the call:
//! the transport then tells the server `notifications/cancelled` with the id *it* saw (the
//! bridge's `CancelGuard`, the stdio transport's own guard). An initialize-era client's calls
//! are registered whatever the upstream: it cancels by a notification on another POST, and on a
//! 2026-07-28 backend dropping the call closes its stream, that revision's cancel.
//!
//! Per replica: a cancel that lands on another replica than its request finds nothing (README
//! "Scale-out").

use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

use crate::pool::OwnerKey;
use crate::protocol::RequestId;

type Key = (OwnerKey, RequestId);
/// foldhash, seeded per process: every bridged call registers and leaves (SipHash cost ~1k
/// instructions a call, callgrind). The map holds only calls in flight, which admission bounds.
type Map = HashMap<Key, Waiting, foldhash::fast::RandomState>;
/// The calls of one key: (registration token, the trigger of its cancellation). Almost always
/// one (a client reuses an id only after its call ended), so it is kept inline: a `Vec` was an
/// allocation and a free on every bridged call.
type Waiting = SmallVec<[(u64, oneshot::Sender<()>); 1]>;

/// The registry of one config generation.
#[derive(Default)]
pub struct Calls {
    map: Mutex<Map>,
    next: AtomicU64,
}

/// A call's place in the registry; leaves it when dropped.
pub struct Registration {
    calls: Arc<Calls>,
    key: Key,
    token: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut map = self.calls.lock();
        if let Some(list) = map.get_mut(&self.key) {
            // Calls of one key mostly finish in the order they began, so the search from the
            // front ends early; an ordered remove keeps it that way. (`retain` walked the whole
            // list: ~600 instructions a call at 64 in flight under one id, callgrind.)
            if let Some(i) = list.iter().position(|(t, _)| *t == self.token) {
                list.remove(i);
            }
            if list.is_empty() {
                map.remove(&self.key);
            }
        }
    }
}

impl Calls {
    fn lock(&self) -> std::sync::MutexGuard<'_, Map> {
        // Never held across anything that can panic; recover from poison anyway.
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `scope`'s call `id`; the receiver fires when the client cancels it.
    pub fn register(
        self: &Arc<Self>,
        scope: OwnerKey,
        id: RequestId,
    ) -> (Registration, oneshot::Receiver<()>) {
        let token = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let key = (scope, id);
        self.lock()
            .entry(key.clone())
            .or_default()
            .push((token, tx));
        let reg = Registration {
            calls: self.clone(),
            key,
            token,
        };
        (reg, rx)
    }

    /// Cancels `scope`'s calls with `id` (one, unless the same client reused an id while it was
    /// in flight, which the spec forbids). Returns how many were cancelled.
    pub fn cancel(&self, scope: OwnerKey, id: &RequestId) -> usize {
        let list = self.lock().remove(&(scope, id.clone())).unwrap_or_default();
        let n = list.len();
        for (_, tx) in list {
            let _ = tx.send(());
        }
        n
    }

    /// Calls registered now.
    pub fn len(&self) -> usize {
        self.lock().values().map(|list| list.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn a_cancel_reaches_only_its_clients_call() {
        let calls = Arc::new(Calls::default());
        let id = RequestId::from_value(&json!(1)).unwrap();
        let (reg_a, mut rx_a) = calls.register([1; 32], id.clone());
        let (_reg_b, mut rx_b) = calls.register([2; 32], id.clone());
        assert_eq!(calls.cancel([1; 32], &id), 1);
        assert!(rx_a.try_recv().is_ok());
        assert!(rx_b.try_recv().is_err(), "the other client's call lives on");
        assert_eq!(calls.cancel([3; 32], &id), 0);
        drop(reg_a);
        assert_eq!(calls.len(), 1);
    }
}
