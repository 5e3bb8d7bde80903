//! A store replicated the way its users run it (a primary and replicas with automatic or
//! scripted failover), for the failover tests and the fault run's failover faults. Each store's
//! set-up implements `Replicated`: `postgres_replicated.rs`, `mariadb_replicated.rs`,
//! `redis_sentinel.rs`.
//!
//! `Endpoint` stands for the one address clients reach "the primary" by (a VIP, HAProxy, a
//! managed endpoint): a TCP forwarder whose upstream moves at failover.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A replicated store started on this host.
pub trait Replicated: Send + Sync {
    /// The URL a leaderrun run is given: through the moving endpoint, or naming the Sentinels.
    fn url(&self) -> String;

    /// From now on, writes reach the primary only, never the replica the next `fail_over`
    /// promotes (its WAL replay or receiver paused, its replication link cut): a failover after
    /// this loses them, as an asynchronous replica that lags does.
    fn hold_back(&self);

    /// Wait until the replica the next `fail_over` promotes has every write the primary
    /// acknowledged (after a `hold_back`, let it catch up first).
    fn catch_up(&self);

    /// SIGKILL the primary, promote the replica and point the clients at it (move the endpoint,
    /// or let the Sentinels elect it); returns once the new primary takes writes.
    fn fail_over(&self);

    /// Give the current primary a new replica, caught up, for the next `fail_over`.
    fn add_replica(&self);

    /// Whether a write is acknowledged only once the replica has it (then `hold_back` cannot
    /// keep an acknowledged write off it: the write waits instead).
    fn synchronous(&self) -> bool {
        false
    }

    /// One line for the fault run's report: what the set-up is.
    fn describe(&self) -> String;
}

/// A TCP forwarder on a free port of 127.0.0.1 to a port of 127.0.0.1 that can change.
/// Moving it resets every connection it carries, as a VIP that moves or a proxy that marks the
/// old primary down does: no client stays on the old primary.
#[derive(Clone)]
pub struct Endpoint {
    port: u16,
    upstream: Arc<AtomicU16>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Endpoint {
    pub fn start(upstream: u16) -> Endpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let endpoint = Endpoint { port, upstream: Arc::new(AtomicU16::new(upstream)), open: Arc::default() };
        let inner = endpoint.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let to = inner.upstream.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect_timeout(&([127, 0, 0, 1], to).into(), Duration::from_secs(2))
                else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                {
                    let mut open = inner.open.lock().unwrap();
                    open.retain(|s| s.peer_addr().is_ok());
                    open.push(client.try_clone().unwrap());
                    open.push(server.try_clone().unwrap());
                }
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        endpoint
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Send new connections to `upstream`, and reset every open one.
    pub fn move_to(&self, upstream: u16) {
        self.upstream.store(upstream, Ordering::SeqCst);
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Copy one direction until either side closes, then close both.
pub fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
