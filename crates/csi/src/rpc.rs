//! The plugin's way to a gateway: blockwire's control API over HTTP
//! (`serve --rpc-http`), one JSON-RPC request POSTed per connection with
//! HTTP basic authentication, as Cinder's SPDK driver reaches it. No other
//! path into serve exists for the plugin.

use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::time::Duration;

/// Longest answer taken from a gateway (a `volume_list` of many volumes
/// fits; a gateway that sends more is treated as failing).
const MAX_ANSWER: usize = 16 << 20;
/// From connect to the whole answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// `user:password` for HTTP basic authentication.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}:***)", self.user)
    }
}

impl Credentials {
    /// `USER:PASSWORD` (one line, as serve's --rpc-http-credentials file).
    pub fn parse(line: &str) -> Option<Credentials> {
        let (u, p) = line.trim_end().split_once(':')?;
        (!u.is_empty() && !p.is_empty()).then(|| Credentials { user: u.into(), password: p.into() })
    }

    /// From a CSI request's secrets: `username` and `password` (the names
    /// the external-provisioner's secret keys take by convention).
    pub fn from_secrets(s: &std::collections::HashMap<String, String>) -> Option<Credentials> {
        let user = s.get("username").or_else(|| s.get("user"))?;
        let password = s.get("password")?;
        Some(Credentials { user: user.clone(), password: password.clone() })
    }

    fn header(&self) -> String {
        let raw = format!("{}:{}", self.user, self.password);
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(raw))
    }
}

/// What went wrong with one call.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The gateway answered with a JSON-RPC error.
    #[error("{method}: {message} (JSON-RPC error {code})")]
    Refused { method: String, code: i64, message: String },
    /// Unreachable, wrong credentials, a broken answer.
    #[error("{method} at {url}: {why}")]
    Unavailable { method: String, url: String, why: String },
}

impl RpcError {
    pub fn code(&self) -> Option<i64> {
        match self {
            RpcError::Refused { code, .. } => Some(*code),
            RpcError::Unavailable { .. } => None,
        }
    }
}

/// One gateway's control endpoint.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `http://HOST:PORT` (plain HTTP: loopback or behind a TLS proxy, as
    /// docs/control.md says of the endpoint).
    pub url: String,
    addr: String,
}

impl Endpoint {
    pub fn new(url: &str) -> anyhow::Result<Endpoint> {
        let rest = url.strip_prefix("http://").ok_or_else(|| anyhow::anyhow!("{url}: the control endpoint is http://HOST:PORT"))?;
        let addr = rest.trim_end_matches('/');
        if addr.is_empty() || addr.contains('/') || !addr.contains(':') {
            anyhow::bail!("{url}: the control endpoint is http://HOST:PORT");
        }
        Ok(Endpoint { url: url.trim_end_matches('/').into(), addr: addr.into() })
    }

    /// Call `method` with `params`; the `result` member of the answer.
    pub async fn call(&self, creds: Option<&Credentials>, method: &str, params: Value) -> Result<Value, RpcError> {
        let unavailable = |why: String| RpcError::Unavailable { method: method.into(), url: self.url.clone(), why };
        let body = serde_json::to_vec(&json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params })).expect("JSON");
        let answer = tokio::time::timeout(CALL_TIMEOUT, self.post(creds, body)).await.map_err(|_| unavailable(format!("no answer in {CALL_TIMEOUT:?}")))?.map_err(unavailable)?;
        let v: Value = serde_json::from_slice(&answer).map_err(|e| unavailable(format!("answer is not JSON: {e}")))?;
        if let Some(e) = v.get("error") {
            return Err(RpcError::Refused {
                method: method.into(),
                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: e.get("message").and_then(Value::as_str).unwrap_or("").into(),
            });
        }
        v.get("result").cloned().ok_or_else(|| unavailable("answer has neither result nor error".into()))
    }

    async fn post(&self, creds: Option<&Credentials>, body: Vec<u8>) -> Result<Vec<u8>, String> {
        let stream = tokio::net::TcpStream::connect(&self.addr).await.map_err(|e| format!("connect: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.map_err(|e| format!("HTTP: {e}"))?;
        let driver = tokio::spawn(conn);
        let mut req = hyper::Request::post("/").header("host", &self.addr).header("content-type", "application/json");
        if let Some(c) = creds {
            req = req.header("authorization", c.header());
        }
        let req = req.body(Full::new(Bytes::from(body))).map_err(|e| e.to_string())?;
        let res = sender.send_request(req).await.map_err(|e| format!("HTTP: {e}"))?;
        let status = res.status();
        let limited = http_body_util::Limited::new(res.into_body(), MAX_ANSWER);
        let bytes = limited.collect().await.map_err(|e| format!("reading the answer: {e}"))?.to_bytes();
        driver.abort();
        if status == hyper::StatusCode::UNAUTHORIZED {
            return Err("401: the gateway refused the credentials (CSI secrets username/password, or --credentials)".into());
        }
        if !status.is_success() {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes[..bytes.len().min(200)])));
        }
        Ok(bytes.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_endpoints() {
        assert_eq!(Credentials::parse("u:p:q\n"), Some(Credentials { user: "u".into(), password: "p:q".into() }));
        assert_eq!(Credentials::parse(":p"), None);
        assert_eq!(Credentials::parse("u:"), None);
        assert_eq!(format!("{:?}", Credentials::parse("u:secret").unwrap()), "Credentials(u:***)");
        assert!(Endpoint::new("http://127.0.0.1:8000/").is_ok());
        assert!(Endpoint::new("https://127.0.0.1:8000").is_err());
        assert!(Endpoint::new("http://127.0.0.1:8000/x").is_err());
    }
}
