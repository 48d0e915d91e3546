//! What initialize-era clients asked to hear, by client (their `bridge::Owner` key): the log
//! level of their `logging/setLevel`, the resource subscriptions they hold, and the channel
//! their GET stream reads (`legacy::notes` fills and drains it).
//!
//! Per replica, like the calls in flight (`calls`): a GET stream on another replica than the
//! client's `resources/subscribe` does not see that subscription (README "Scale-out"). A
//! client's entry ends with its session (`DELETE`, or its expiry: pruned as entries are made),
//! and with it the upstream streams its subscriptions hold.

use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::AtomicU8;
use std::sync::{Arc, Mutex};
use tokio::sync::broadcast;

use crate::pool::{OwnerKey, unix_ms};

/// Notifications buffered for a client's GET stream.
const QUEUE: usize = 64;
/// Clients remembered at once; past it, new ones are refused a subscription (expired ones are
/// pruned whenever a client is added).
pub const MAX_CLIENTS: usize = 10_000;
/// Resource subscriptions one client may hold.
pub const MAX_SUBSCRIPTIONS: usize = 256;

/// One client's notification state.
pub struct Client {
    /// What its GET stream carries: resource updates its subscriptions heard (the GET
    /// stream's own list-changed and log feed is opened by the GET request itself).
    pub tx: broadcast::Sender<Bytes>,
    /// Its `logging/setLevel`, as 1 + the rank in `protocol::LOG_LEVELS`; 0 = never set (no
    /// log lines: a 2026-07-28 request without `logLevel` gets none either).
    pub level: AtomicU8,
    /// Its resource subscriptions: the task that relays each one's upstream stream. Dropping
    /// an entry aborts the task, which closes that stream (and unsubscribes upstream).
    pub subscriptions: Mutex<HashMap<String, Feed>>,
    expires_ms: u64,
}

/// A relaying task, aborted when dropped.
pub struct Feed(pub tokio::task::AbortHandle);

impl Drop for Feed {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The clients of one config generation.
#[derive(Default)]
pub struct Clients {
    map: Mutex<HashMap<OwnerKey, Arc<Client>>>,
}

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<OwnerKey, Arc<Client>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key`'s entry, made when absent (`None`: too many clients).
    pub fn get(&self, key: &OwnerKey, expires_ms: u64) -> Option<Arc<Client>> {
        let mut map = self.lock();
        if let Some(c) = map.get(key) {
            return Some(c.clone());
        }
        // Pruned as clients arrive (rare: a GET stream, a subscription, a level), so expired
        // sessions do not keep their upstream subscriptions open.
        {
            let now = unix_ms();
            map.retain(|_, c| {
                let live = c.expires_ms > now;
                if !live {
                    // Its relaying tasks hold the entry: stopping them ends both.
                    c.subscriptions
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clear();
                }
                live
            });
        }
        if map.len() >= MAX_CLIENTS {
            return None;
        }
        let c = Arc::new(Client {
            tx: broadcast::channel(QUEUE).0,
            level: AtomicU8::new(0),
            subscriptions: Mutex::new(HashMap::new()),
            expires_ms,
        });
        map.insert(*key, c.clone());
        Some(c)
    }

    /// `key`'s entry, if it has one.
    pub fn peek(&self, key: &OwnerKey) -> Option<Arc<Client>> {
        self.lock().get(key).cloned()
    }

    /// Forgets `key` (its session ended): its subscriptions' upstream streams close.
    pub fn remove(&self, key: &OwnerKey) {
        let gone = self.lock().remove(key);
        if let Some(c) = gone {
            c.subscriptions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
    }

    /// How many subscriptions are held (tests, status).
    pub fn subscriptions(&self) -> usize {
        self.lock()
            .values()
            .map(|c| c.subscriptions.lock().map(|s| s.len()).unwrap_or(0))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn expired_clients_are_pruned_with_their_subscriptions() {
        let clients = Clients::default();
        let old = clients.get(&[1; 32], 1).expect("room");
        let task = tokio::spawn(std::future::pending::<()>());
        old.subscriptions
            .lock()
            .unwrap()
            .insert("x://y".into(), Feed(task.abort_handle()));
        assert_eq!(clients.subscriptions(), 1);
        // A new client arrives: the expired one goes, and its relay is stopped.
        clients.get(&[2; 32], u64::MAX).expect("room");
        assert!(clients.peek(&[1; 32]).is_none());
        assert_eq!(clients.subscriptions(), 0);
        assert!(task.await.unwrap_err().is_cancelled());
    }
}
