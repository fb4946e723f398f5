//! The server against clients on loopback addresses of their own (all of
//! 127/8 reaches lo). Nothing here waits for time to pass: each step waits
//! for what the server does (an answer, a close), and the time limits of
//! the server are far beyond any step but the one that checks a limit.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::{TcpSocket, TcpStream};

/// Credentials in a header ("Basic good"); `/anon` needs none; `/slow`
/// holds its answer until told.
struct Fake {
    in_answer: AtomicUsize,
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Endpoint for Fake {
    fn name(&self) -> &'static str {
        "test"
    }
    fn check(&self, head: &Head, _: SocketAddr) -> Verdict {
        if head.uri.path() == "/anon" {
            return Verdict::Anonymous;
        }
        match head.headers.get("authorization").and_then(|v| v.to_str().ok()) {
            Some("Basic good") => Verdict::Authenticated,
            _ => Verdict::Refused(Answer::status(401).with_header("www-authenticate", "Basic realm=\"test\"")),
        }
    }
    fn answer(&self, head: &Head, body: Bytes, _: SocketAddr) -> Answer {
        if head.uri.path() == "/slow" {
            self.in_answer.fetch_add(1, Ordering::SeqCst);
            let _ = self.entered.send(());
            let _ = self.release.lock().unwrap().recv();
        }
        Answer::new(200, "text/plain", format!("{} bytes\n", body.len()))
    }
}

const LIMITS: Limits = Limits {
    admission: AdmissionLimits { pending: 8, per_peer: 3, authenticated: 2 },
    max_head: 8192,
    max_body: 4096,
    head_timeout: Duration::from_secs(300),
    body_timeout: Duration::from_secs(300),
    send_timeout: Duration::from_secs(300),
};

struct Server {
    port: u16,
    entered: tokio::sync::mpsc::UnboundedReceiver<()>,
    release: std::sync::mpsc::Sender<()>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for _ in 0..8 {
            let _ = self.release.send(());
        }
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

async fn server(limits: Limits) -> Server {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel();
    let (release, release_rx) = std::sync::mpsc::channel();
    let fake = Arc::new(Fake { in_answer: AtomicUsize::new(0), entered: entered_tx, release: std::sync::Mutex::new(release_rx) });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(l, fake, limits, async move {
        let _ = stopped.await;
    }));
    Server { port, entered, release, stop: Some(stop) }
}

/// A connection from 127.0.0.`from`.
async fn connect(port: u16, from: u8) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from(([127, 0, 0, from], 0))).unwrap();
    s.connect(SocketAddr::from(([127, 0, 0, 1], port))).await.unwrap()
}

/// Send `req` from 127.0.0.`from`; the whole answer (status line first).
async fn ask(port: u16, from: u8, req: &[u8]) -> String {
    let mut s = connect(port, from).await;
    s.write_all(req).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn post(path: &str, auth: Option<&str>, body: &str) -> Vec<u8> {
    let auth = auth.map(|a| format!("Authorization: {a}\r\n")).unwrap_or_default();
    format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

/// Whether the server closed `s` (it reads end of file, or a reset).
async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(s.read(&mut b).await, Ok(0) | Err(_))
}

#[tokio::test]
async fn idle_connections_from_anywhere_do_not_keep_out_a_client_that_authenticates() {
    let srv = server(LIMITS).await;
    // One address: three idle connections kept, the rest closed at once.
    let mut idle = Vec::new();
    for i in 0..10 {
        let mut s = connect(srv.port, 2).await;
        s.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
        if i >= 3 {
            assert!(closed(&mut s).await, "connection {i} from one address was kept");
        }
        idle.push(s);
    }
    assert_eq!(ask(srv.port, 200, &post("/", Some("Basic good"), "{}")).await.lines().next(), Some("HTTP/1.1 200 OK"));
    // Many addresses, one idle connection each: the pending slots fill
    // and each new one pushes out the oldest.
    for from in 10..40 {
        let mut s = connect(srv.port, from).await;
        s.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
        idle.push(s);
    }
    assert!(closed(&mut idle[0]).await, "the oldest idle connection was not pushed out");
    let a = ask(srv.port, 201, &post("/", Some("Basic good"), "{\"x\":1}")).await;
    assert!(a.starts_with("HTTP/1.1 200 OK") && a.ends_with("7 bytes\n"), "{a}");
}

#[tokio::test]
async fn heads_bodies_and_credentials_are_bounded_and_refusals_arrive_whole() {
    let srv = server(LIMITS).await;
    let status = |a: String| a.lines().next().unwrap_or("").to_string();
    assert_eq!(status(ask(srv.port, 3, &post("/", None, "{}")).await), "HTTP/1.1 401 Unauthorized");
    // Refused at its head with a body the client is still sending: the
    // answer arrives, not a reset.
    let big = "x".repeat(64 * 1024);
    let a = ask(srv.port, 3, &post("/", Some("Basic bad"), &big)).await;
    assert!(a.starts_with("HTTP/1.1 401") && a.to_ascii_lowercase().contains("www-authenticate: basic"), "{a}");
    assert_eq!(status(ask(srv.port, 3, &post("/", Some("Basic good"), &"y".repeat(5000))).await), "HTTP/1.1 413 Payload Too Large");
    let chunked = format!("POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic good\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{}\r\n0\r\n\r\n", 5000, "z".repeat(5000));
    assert_eq!(status(ask(srv.port, 3, chunked.as_bytes()).await), "HTTP/1.1 413 Payload Too Large");
    let chunked = "POST / HTTP/1.1\r\nHost: x\r\nAuthorization: Basic good\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
    assert!(ask(srv.port, 3, chunked.as_bytes()).await.ends_with("3 bytes\n"));
    let long_head = format!("GET /anon HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "p".repeat(9000));
    assert_eq!(status(ask(srv.port, 3, long_head.as_bytes()).await), "HTTP/1.1 431 Request Header Fields Too Large");
    assert_eq!(status(ask(srv.port, 3, b"GET /anon HTTP/1.1\r\nHost: x\r\n\r\n").await), "HTTP/1.1 200 OK");
    assert_eq!(status(ask(srv.port, 3, b"NOT HTTP AT ALL\r\n\r\n").await), "HTTP/1.1 400 Bad Request");
    // An unfinished head is closed at the head timeout.
    let quick = server(Limits { head_timeout: Duration::from_millis(200), ..LIMITS }).await;
    let mut s = connect(quick.port, 3).await;
    s.write_all(b"POST / HTTP/1.1\r\nHost").await.unwrap();
    assert!(closed(&mut s).await);
}

#[tokio::test]
async fn authenticated_slots_are_bounded_and_freed() {
    let mut srv = server(LIMITS).await;
    let port = srv.port;
    let slow = |from| tokio::spawn(async move { ask(port, from, &post("/slow", Some("Basic good"), "")).await });
    let held = [slow(4), slow(5)];
    for _ in 0..2 {
        srv.entered.recv().await.unwrap();
    }
    assert!(ask(port, 6, &post("/", Some("Basic good"), "")).await.starts_with("HTTP/1.1 503"));
    // Requests without credentials are not counted against them.
    assert!(ask(port, 6, b"GET /anon HTTP/1.1\r\nHost: x\r\n\r\n").await.starts_with("HTTP/1.1 200"));
    srv.release.send(()).unwrap();
    srv.release.send(()).unwrap();
    for h in held {
        assert!(h.await.unwrap().starts_with("HTTP/1.1 200"));
    }
    assert!(ask(port, 6, &post("/", Some("Basic good"), "")).await.starts_with("HTTP/1.1 200"));
}
