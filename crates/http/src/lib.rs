//! serve's HTTP/1.1 endpoints: the control methods over HTTP (`--rpc-http`)
//! and the Prometheus metrics. The protocol is hyper's (a well-kept parser
//! with its own bounds on the head and a timer on reading it); what is
//! ours is which connections are kept ([`admission`]) and the shape every
//! endpoint shares: one request per connection, its head bounded in bytes
//! and time, its body read only once the head was accepted
//! ([`Endpoint::check`]) and bounded in bytes and time, the answer made on
//! the blocking pool ([`Endpoint::answer`]) and sent within a time limit,
//! then the connection closed without losing the answer.

pub mod admission;
pub mod log_throttle;

pub use admission::{Accept, Admission, AdmissionLimits, ConnId};
pub use log_throttle::LogThrottle;
pub use hyper::http::request::Parts as Head;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

/// The bounds of an endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub admission: AdmissionLimits,
    /// Request line and headers (hyper needs at least 8 KiB of buffer).
    pub max_head: usize,
    pub max_body: usize,
    /// From accept to the whole head: a connection that sends less in
    /// this time is closed.
    pub head_timeout: Duration,
    /// From an accepted head to the whole body.
    pub body_timeout: Duration,
    /// From the answer made to the answer sent.
    pub send_timeout: Duration,
}

/// An answer: its status, type, body and any further headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Answer {
        Answer { status, content_type, body: body.into(), headers: Vec::new() }
    }

    /// A plain-text answer: the status line's words (`"401 Unauthorized"`)
    /// as the body.
    pub fn status(status: u16) -> Answer {
        let reason = hyper::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
        Answer::new(status, "text/plain; charset=utf-8", format!("{status} {reason}\n"))
    }

    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Answer {
        self.headers.push((name, value.into()));
        self
    }
}

/// What a request's head earns it ([`Endpoint::check`]).
#[derive(Debug)]
pub enum Verdict {
    /// Its sender proved who it is: the connection moves to an
    /// authenticated slot, and its body is read and answered.
    Authenticated,
    /// No credentials are needed here: read and answered from the
    /// pending slot.
    Anonymous,
    /// Answered with this, its body unread.
    Refused(Answer),
}

/// One endpoint's requests.
pub trait Endpoint: Send + Sync + 'static {
    /// For log lines.
    fn name(&self) -> &'static str;
    /// A request's head, before its body is read: whether to go on.
    fn check(&self, head: &Head, peer: SocketAddr) -> Verdict;
    /// The answer to a request whose head passed [`Endpoint::check`] and
    /// whose body was read. Runs on the blocking pool: it may take as long
    /// as the work takes.
    fn answer(&self, head: &Head, body: Bytes, peer: SocketAddr) -> Answer;
}

/// The admission state and how to tell each admitted connection to go.
struct Slots {
    admission: Admission,
    push_out: HashMap<ConnId, Arc<Notify>>,
    /// Connections answered and being drained (see [`close_after_answer`]):
    /// at most as many as there are pending slots; past that, closed at once.
    draining: usize,
}

type Shared = Arc<Mutex<Slots>>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Slots> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serve `endpoint` on `listener` until `shutdown` resolves.
pub async fn serve<E: Endpoint>(listener: tokio::net::TcpListener, endpoint: Arc<E>, limits: Limits, shutdown: impl std::future::Future<Output = ()>) {
    let slots: Shared = Arc::new(Mutex::new(Slots { admission: Admission::new(limits.admission), push_out: HashMap::new(), draining: 0 }));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    log::warn!("{}: accept: {e}", endpoint.name());
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let (id, pushed_out) = {
            let mut s = lock(&slots);
            match s.admission.accept(peer.ip()) {
                Accept::Refused => {
                    log::debug!("{}: {peer}: closed: its address holds {} unanswered connections", endpoint.name(), limits.admission.per_peer);
                    continue;
                }
                Accept::Admitted { id, evict } => {
                    if let Some(n) = evict.and_then(|old| s.push_out.remove(&old)) {
                        log::debug!("{}: the oldest unanswered connection closed for {peer}'s", endpoint.name());
                        n.notify_one();
                    }
                    let n = Arc::new(Notify::new());
                    s.push_out.insert(id, n.clone());
                    (id, n)
                }
            }
        };
        tokio::spawn(connection(stream, peer, id, pushed_out, endpoint.clone(), slots.clone(), limits));
    }
}

async fn connection<E: Endpoint>(stream: tokio::net::TcpStream, peer: SocketAddr, id: ConnId, pushed_out: Arc<Notify>, endpoint: Arc<E>, slots: Shared, limits: Limits) {
    let answered = Arc::new(Notify::new());
    let svc = {
        let (endpoint, slots, answered) = (endpoint.clone(), slots.clone(), answered.clone());
        hyper::service::service_fn(move |req| {
            let (endpoint, slots, answered) = (endpoint.clone(), slots.clone(), answered.clone());
            async move {
                let answer = request(req, peer, id, &endpoint, &slots, &limits).await;
                answered.notify_one();
                Ok::<_, Infallible>(response(answer))
            }
        })
    };
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(limits.max_head.max(8192))
        .max_header_size(limits.max_head)
        .keep_alive(false);
    let conn = http1.serve_connection(TokioIo::new(stream), svc).without_shutdown();
    tokio::pin!(conn);
    let finished = tokio::select! {
        r = &mut conn => Some(r),
        _ = pushed_out.notified() => None,
        _ = answered.notified() => tokio::time::timeout(limits.send_timeout, &mut conn).await.ok(),
    };
    // The slot is free once the answer is sent: a client that has read it
    // whole finds it free for its next request.
    let drain = {
        let mut s = lock(&slots);
        s.admission.close(id);
        s.push_out.remove(&id);
        let drain = matches!(finished, Some(Ok(_))) && s.draining < limits.admission.pending;
        s.draining += drain as usize;
        drain
    };
    match finished {
        Some(Ok(parts)) if drain => {
            close_after_answer(parts.io.into_inner(), limits.max_head + limits.max_body).await;
            lock(&slots).draining -= 1;
        }
        Some(Err(e)) => log::debug!("{}: {peer}: {e}", endpoint.name()),
        _ => {}
    }
}

/// Check the head, read the body, answer.
async fn request<E: Endpoint>(req: Request<Incoming>, peer: SocketAddr, id: ConnId, endpoint: &Arc<E>, slots: &Shared, limits: &Limits) -> Answer {
    let (head, body) = req.into_parts();
    match endpoint.check(&head, peer) {
        Verdict::Refused(a) => return a,
        Verdict::Authenticated if !lock(slots).admission.authenticate(id) => {
            log::warn!("{}: {peer}: {} authenticated clients are being answered; answered 503", endpoint.name(), limits.admission.authenticated);
            return Answer::status(503);
        }
        Verdict::Authenticated | Verdict::Anonymous => {}
    }
    if body.size_hint().lower() > limits.max_body as u64 {
        return Answer::status(413);
    }
    let body = match tokio::time::timeout(limits.body_timeout, Limited::new(body, limits.max_body).collect()).await {
        Err(_) => return Answer::status(408),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return Answer::status(413),
        Ok(Err(_)) => return Answer::status(400),
        Ok(Ok(b)) => b.to_bytes(),
    };
    let e = endpoint.clone();
    match tokio::task::spawn_blocking(move || e.answer(&head, body, peer)).await {
        Ok(a) => a,
        Err(e) => {
            log::error!("{}: {peer}: answering failed: {e}", endpoint.name());
            Answer::status(500)
        }
    }
}

fn response(a: Answer) -> Response<Full<Bytes>> {
    let mut r = Response::builder().status(a.status).header("content-type", a.content_type).header("connection", "close");
    for (k, v) in a.headers {
        r = r.header(k, v);
    }
    r.body(Full::new(Bytes::from(a.body))).unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"500\n"))))
}

/// How long a connection is drained after its answer (below).
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Close a connection without losing its answer: a socket closed with
/// input still unread (the body of a request refused at its head: 401,
/// 413, 503) sends a reset, and the client's read of the answer then fails
/// with "connection reset" instead of showing the status. Half-close, then
/// read and drop what the client still sends until it closes, bounded in
/// bytes and time.
async fn close_after_answer(mut s: tokio::net::TcpStream, most: usize) {
    let _ = s.shutdown().await;
    let mut chunk = [0u8; 8192];
    let mut left = most;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while left > 0 {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests;
