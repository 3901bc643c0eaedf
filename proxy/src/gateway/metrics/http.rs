//! The metrics endpoint: HTTP/1.1 by hyper (keep-alive, HEAD, a header read
//! timeout), `GET /metrics` answered from a fresh snapshot.
//!
//! Content negotiation: the body is the OpenMetrics 1.0 text (the format
//! prometheus-client encodes). A client whose `Accept` names
//! `application/openmetrics-text` (Prometheus does by default) gets that
//! content type; any other gets `text/plain; version=0.0.4`, the content
//! type Prometheus' classic text parser expects. That parser reads the
//! OpenMetrics text as is (`# EOF` is a comment to it); it only does not
//! attach a counter's `# TYPE` line (family name without `_total`) to its
//! samples.

use std::convert::Infallible;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use crate::gateway::Shared;

pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
pub const TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// How long a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a scrape waits for the device loops' snapshot.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(2);

/// Binds the metrics listener (SO_REUSEADDR so a restart does not wait for
/// TIME_WAIT). Bound before the threads start, so that a taken port is a
/// start-up error.
pub fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    s.set_reuse_address(true)?;
    s.bind(&addr.into())?;
    s.listen(64)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// The content type for a request's `Accept` header: OpenMetrics when it
/// names `application/openmetrics-text` with a weight above 0.
pub fn negotiate(accept: Option<&HeaderValue>) -> &'static str {
    let accepts_openmetrics = accept.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|range| {
            let mut parts = range.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let weight = parts
                .filter_map(|p| p.strip_prefix("q="))
                .find_map(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            media.eq_ignore_ascii_case("application/openmetrics-text") && weight > 0.0
        })
    });
    if accepts_openmetrics {
        OPENMETRICS
    } else {
        TEXT
    }
}

fn reply(status: StatusCode, ctype: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

async fn handle(
    req: Request<Incoming>,
    shared: Arc<Shared>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    // hyper sends the headers of a HEAD answer (Content-Length included)
    // and leaves its body out.
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET or HEAD only\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            let ctype = negotiate(req.headers().get(ACCEPT));
            // The snapshot waits on the device loops (a condition
            // variable): off the runtime's thread.
            let snap = tokio::task::spawn_blocking(move || shared.snapshot(SNAPSHOT_TIMEOUT))
                .await
                .ok()
                .flatten();
            match snap {
                Some(s) => reply(StatusCode::OK, ctype, super::render(&s)),
                None => reply(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "no snapshot\n",
                ),
            }
        }
        "/" => reply(
            StatusCode::OK,
            "text/html",
            "<html><body><a href=\"/metrics\">/metrics</a></body></html>\n",
        ),
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    })
}

/// Serves connections until the task is dropped (the control plane stops).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("metrics listener: {e}");
            return;
        }
    };
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| handle(req, shared.clone()));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                tracing::debug!("metrics connection: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        let h = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(negotiate(None), TEXT);
        assert_eq!(negotiate(Some(&h("*/*"))), TEXT);
        assert_eq!(negotiate(Some(&h("text/plain;version=0.0.4"))), TEXT);
        assert_eq!(
            negotiate(Some(&h("application/openmetrics-text"))),
            OPENMETRICS
        );
        // What Prometheus 2.x/3.x sends.
        assert_eq!(
            negotiate(Some(&h("application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"))),
            OPENMETRICS
        );
        assert_eq!(
            negotiate(Some(&h("application/openmetrics-text;q=0, text/plain"))),
            TEXT
        );
    }
}
