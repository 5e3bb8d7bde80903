//! `--http ADDR`: /healthz, /readyz and /metrics, served by hyper (HTTP/1) on the run's own
//! runtime, in leaders and standbys alike.
//!
//! The port is bound while the flags are checked, before the store is opened, so a port in
//! use is a usage error (exit 2) that writes nothing to the store. The server is a spawned
//! task whose handlers only read what the observers keep (`Health`, `Metrics`): no handler
//! waits on anything or holds a lock across an await, so a scrape never delays the elector.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::health::Health;
use super::metrics::{Format, Metrics};
use crate::clock::boottime;

/// A client that sends no request head in this long is dropped (an idle or stuck scraper
/// must not pile up connections).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Listen on `addr` now; `Err` is the one line to exit 2 with.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let cannot = |err: std::io::Error| {
        // "Address already in use", without the "(os error 98)" that says nothing more.
        let text = err.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text).to_string();
        format!("--http {addr}: cannot listen: {text}")
    };
    let listener = std::net::TcpListener::bind(addr).map_err(cannot)?;
    listener.set_nonblocking(true).map_err(cannot)?;
    Ok(listener)
}

/// Serve on `listener` until the run ends (must be called on the run's runtime).
pub fn serve(listener: std::net::TcpListener, health: Arc<Health>, metrics: Arc<Metrics>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors, most likely: pause rather than spin.
                    tracing::debug!("--http: cannot accept a connection: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let (health, metrics) = (health.clone(), metrics.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                    let response = respond(&health, &metrics, &request);
                    async move { Ok::<_, Infallible>(response) }
                });
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), service);
                if let Err(err) = connection.await {
                    tracing::debug!("--http: connection ended: {err}");
                }
            });
        }
    });
    Ok(())
}

/// The whole of the server's logic: a few reads of state the observers keep.
fn respond<B>(health: &Health, metrics: &Metrics, request: &Request<B>) -> Response<String> {
    let method = request.method();
    if method != Method::GET && method != Method::HEAD {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into());
        response.headers_mut().insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match request.uri().path() {
        "/healthz" => answer(health.healthy(boottime())),
        "/readyz" => answer(health.ready()),
        "/metrics" => {
            let format = Format::accepted(request.headers().get(ACCEPT).and_then(|v| v.to_str().ok()));
            let mut response = Response::new(metrics.encode(boottime(), format));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(format.content_type()));
            response
        }
        _ => plain(StatusCode::NOT_FOUND, "not found: try /healthz, /readyz or /metrics\n".into()),
    }
}

fn answer(verdict: Result<(), String>) -> Response<String> {
    match verdict {
        Ok(()) => plain(StatusCode::OK, "ok\n".into()),
        Err(reason) => plain(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

fn plain(status: StatusCode, body: String) -> Response<String> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}
