//! A gate in front of a plain-HTTP/1.1 server: every connection is forwarded as it is, except
//! that, once armed, the first request whose head (request line and headers) contains a given
//! text is held until the test opens the gate. It puts two clients' requests in the order a
//! test needs, by events rather than by timing. Requests with a body are forwarded whole
//! (`Content-Length`); chunked requests are not understood (the stores' tests send none).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    /// The text a request's head must contain to be held (lower case); `None`: disarmed.
    needle: Option<String>,
    held: bool,
    open: bool,
}

#[derive(Clone)]
pub struct Gate {
    port: u16,
    state: Arc<(Mutex<State>, Condvar)>,
}

impl Gate {
    /// A gate on a free port of 127.0.0.1 to `upstream` on 127.0.0.1.
    pub fn start(upstream: u16) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let gate = Gate { port, state: Arc::default() };
        let inner = gate.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else { continue };
                let (mut from_server, mut to_client) = (server.try_clone().unwrap(), client.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from_server, &mut to_client);
                    let _ = to_client.shutdown(Shutdown::Both);
                });
                let inner = inner.clone();
                std::thread::spawn(move || inner.forward_requests(client, server));
            }
        });
        gate
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Hold the next request whose head contains `needle` (case-insensitive).
    pub fn arm(&self, needle: &str) {
        let mut state = self.state.0.lock().unwrap();
        *state = State { needle: Some(needle.to_ascii_lowercase()), held: false, open: false };
    }

    /// Wait until the armed request is held (it has reached the gate, not the server).
    pub fn wait_held(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut state = self.state.0.lock().unwrap();
        while !state.held {
            let left = deadline.checked_duration_since(Instant::now()).expect("no request came to the gate");
            state = self.state.1.wait_timeout(state, left).unwrap().0;
        }
    }

    /// Let the held request (and everything after it) through.
    pub fn open(&self) {
        let mut state = self.state.0.lock().unwrap();
        state.open = true;
        state.needle = None;
        self.state.1.notify_all();
    }

    fn forward_requests(&self, client: TcpStream, mut server: TcpStream) {
        let mut reader = BufReader::new(client);
        loop {
            let mut head = String::new();
            loop {
                let mut line = String::new();
                match reader.read_line(&mut line) {
                    Ok(0) | Err(_) => {
                        let _ = server.shutdown(Shutdown::Write);
                        return;
                    }
                    Ok(_) => head.push_str(&line),
                }
                if line == "\r\n" {
                    break;
                }
            }
            let lower = head.to_ascii_lowercase();
            let length = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            self.maybe_hold(&lower);
            if server.write_all(head.as_bytes()).and_then(|()| server.write_all(&body)).is_err() {
                return;
            }
        }
    }

    fn maybe_hold(&self, head: &str) {
        let mut state = self.state.0.lock().unwrap();
        if state.held || !state.needle.as_deref().is_some_and(|n| head.contains(n)) {
            return;
        }
        state.held = true;
        self.state.1.notify_all();
        while !state.open {
            state = self.state.1.wait(state).unwrap();
        }
    }
}
