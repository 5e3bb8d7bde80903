//! A small TCP proxy for the fault run: it sits between one contender and the store's
//! server and can pass traffic, blackhole it, reset every connection, or add latency.
//! (No toxiproxy here; `tc netem` does not work on these machines.) The tests use it too,
//! to lose the answer to one request the server has carried out (`drop_response_to`).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Accept and read, forward nothing: requests hang, as behind a dead route.
    Blackhole,
    /// Reset every open connection and every new one.
    Reset,
    /// Forward each chunk after this delay.
    Delay(Duration),
}

const PASS: u64 = 0;
const BLACKHOLE: u64 = 1;
const RESET: u64 = 2;
/// Delay is stored as DELAY_BASE + milliseconds.
const DELAY_BASE: u64 = 1 << 32;

struct Shared {
    mode: AtomicU64,
    target: SocketAddr,
    open: Mutex<Vec<TcpStream>>,
    stopped: AtomicBool,
    /// Connections accepted, for counting requests at the proxy.
    accepted: AtomicU64,
    /// Requests that contain these bytes are counted; while `armed`, the next one's answer
    /// is lost.
    drop_response_to: Mutex<Option<Vec<u8>>>,
    armed: AtomicBool,
    /// Requests seen that contained the last needle given, and answers dropped.
    matched: AtomicU64,
    dropped: AtomicU64,
}

pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `target`.
    pub fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            mode: AtomicU64::new(PASS),
            target,
            open: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            drop_response_to: Mutex::new(None),
            armed: AtomicBool::new(false),
            matched: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let accept = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accept.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                accept.accepted.fetch_add(1, Ordering::SeqCst);
                if accept.mode.load(Ordering::SeqCst) == RESET {
                    reset(&client);
                    continue;
                }
                let Ok(server) = TcpStream::connect_timeout(&accept.target, Duration::from_secs(2)) else {
                    reset(&client);
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    accept.open.lock().unwrap().extend([c, s]);
                }
                let cut = Arc::new(AtomicBool::new(false));
                pump(Arc::clone(&accept), &client, &server, Direction::Request(Arc::clone(&cut)));
                pump(Arc::clone(&accept), &server, &client, Direction::Answer(cut));
            }
        });
        Ok(Self { port, shared })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Let the next request that contains `needle` through, then lose its answer: the
    /// server has carried it out, and the client sees its connection reset. Once.
    pub fn drop_response_to(&self, needle: &str) {
        self.shared.matched.store(0, Ordering::SeqCst);
        *self.shared.drop_response_to.lock().unwrap() = Some(needle.as_bytes().to_vec());
        self.shared.armed.store(true, Ordering::SeqCst);
    }

    /// Requests that contained the last `drop_response_to` needle, the one dropped included.
    pub fn requests_matched(&self) -> u64 {
        self.shared.matched.load(Ordering::SeqCst)
    }

    /// Answers lost by `drop_response_to`.
    pub fn responses_dropped(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    pub fn set(&self, mode: Mode) {
        let value = match mode {
            Mode::Pass => PASS,
            Mode::Blackhole => BLACKHOLE,
            Mode::Reset => RESET,
            Mode::Delay(d) => DELAY_BASE + d.as_millis() as u64,
        };
        self.shared.mode.store(value, Ordering::SeqCst);
        if mode == Mode::Reset {
            for stream in self.shared.open.lock().unwrap().drain(..) {
                reset(&stream);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        for stream in self.shared.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        // Wake the accept loop so that it sees `stopped`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Close with RST rather than FIN, as a middlebox that drops state would.
fn reset(stream: &TcpStream) {
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: setsockopt on a socket we own, with a correctly sized value.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Which way a pump copies; both of one connection share `cut`: its next answer is lost.
enum Direction {
    Request(Arc<AtomicBool>),
    Answer(Arc<AtomicBool>),
}

/// Copy `from` → `to` on a thread of its own, obeying the mode chunk by chunk.
fn pump(shared: Arc<Shared>, from: &TcpStream, to: &TcpStream, direction: Direction) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            match &direction {
                Direction::Request(cut) => {
                    let needle = shared.drop_response_to.lock().unwrap().clone();
                    if needle.is_some_and(|wanted| buf[..n].windows(wanted.len()).any(|w| w == wanted)) {
                        shared.matched.fetch_add(1, Ordering::SeqCst);
                        if shared.armed.swap(false, Ordering::SeqCst) {
                            cut.store(true, Ordering::SeqCst);
                        }
                    }
                }
                Direction::Answer(cut) if cut.load(Ordering::SeqCst) => {
                    shared.dropped.fetch_add(1, Ordering::SeqCst);
                    reset(&from);
                    reset(&to);
                    return;
                }
                Direction::Answer(_) => {}
            }
            loop {
                match shared.mode.load(Ordering::SeqCst) {
                    PASS => break,
                    BLACKHOLE => thread::sleep(Duration::from_millis(20)),
                    RESET => {
                        reset(&from);
                        reset(&to);
                        return;
                    }
                    delay => {
                        thread::sleep(Duration::from_millis(delay - DELAY_BASE));
                        break;
                    }
                }
                if shared.stopped.load(Ordering::SeqCst) {
                    return;
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
