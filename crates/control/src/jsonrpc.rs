//! JSON-RPC 2.0 over any byte stream: the framing of requests (one per
//! line, or SPDK's indented ones), the checks of a request object, and the
//! dispatch to a row of [`all_methods`]: blockwire's (crate::methods),
//! then the SPDK-compatible ones (crate::spdk). The control socket and the
//! HTTP endpoint both answer through [`handle_line`] or [`handle_value`].

use crate::live::Live;
use crate::rpc::{code, params, Method, RpcError};
use crate::{methods, spdk};
use serde::Deserialize;
use serde_json::{json, Value};

/// `rpc_get_methods` lists every method as SPDK's does: the names, as
/// strings (every method is callable at any time and none has an alias).
const RPC_GET_METHODS: Method = Method { name: "rpc_get_methods", params: "{current?, include_aliases?}", call: |_, p| {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Args {
        #[serde(default)]
        current: bool,
        #[serde(default)]
        include_aliases: bool,
    }
    params::<Args>(p)?;
    Ok(json!(all_methods().map(|m| m.name).collect::<Vec<_>>()))
} };

/// Every method: `rpc_get_methods`, blockwire's, then the SPDK-compatible ones.
pub fn all_methods() -> impl Iterator<Item = &'static Method> {
    std::iter::once(&RPC_GET_METHODS).chain(methods::METHODS).chain(spdk::METHODS)
}

/// Longest request taken (a whole subsystem with its hosts fits).
pub const MAX_REQUEST: usize = 1 << 20;

pub fn error_response(id: Value, e: RpcError) -> Value {
    let mut error = json!({ "code": e.code, "message": e.message });
    if let Some(d) = e.data {
        error["data"] = d;
    }
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

/// Answer one request object; `None` for a notification (no id).
pub fn handle(live: &Live, req: Value) -> Option<Value> {
    let Value::Object(mut o) = req else {
        return Some(error_response(Value::Null, RpcError::new(code::INVALID_REQUEST, "invalid request: not a JSON object")));
    };
    let id = o.remove("id");
    let reply_id = id.clone().unwrap_or(Value::Null);
    let bad = |why: &str| Some(error_response(reply_id.clone(), RpcError::new(code::INVALID_REQUEST, format!("invalid request: {why}"))));
    if o.get("jsonrpc") != Some(&json!("2.0")) {
        return bad("\"jsonrpc\" must be \"2.0\"");
    }
    if !matches!(id, None | Some(Value::Null | Value::Number(_) | Value::String(_))) {
        return bad("\"id\" must be a number, a string or null");
    }
    let Some(Value::String(method)) = o.remove("method") else {
        return bad("\"method\" must be a string");
    };
    let p = o.remove("params").unwrap_or(Value::Null);
    if !matches!(p, Value::Null | Value::Object(_)) {
        return Some(error_response(reply_id, RpcError::new(code::INVALID_PARAMS, "invalid params: must be an object (named parameters)")));
    }
    let result = match all_methods().find(|m| m.name == method) {
        Some(m) => (m.call)(live, p),
        None => Err(RpcError::new(code::METHOD_NOT_FOUND, format!("Method not found: {method:?} (rpc_get_methods lists them)"))),
    };
    id.as_ref()?;
    Some(match result {
        Ok(r) => json!({ "jsonrpc": "2.0", "id": reply_id, "result": r }),
        Err(e) => {
            log::info!("control: {method}: {}", e.message);
            error_response(reply_id, e)
        }
    })
}

/// Answer one parsed request or batch. `None`: nothing to send back.
pub fn handle_value(live: &Live, v: Value) -> Option<String> {
    let out = match v {
        Value::Array(reqs) if reqs.is_empty() => error_response(Value::Null, RpcError::new(code::INVALID_REQUEST, "invalid request: empty batch")),
        Value::Array(reqs) => {
            let all: Vec<Value> = reqs.into_iter().filter_map(|r| handle(live, r)).collect();
            if all.is_empty() {
                return None;
            }
            Value::Array(all)
        }
        v => handle(live, v)?,
    };
    Some(out.to_string())
}

pub fn parse_error(e: impl std::fmt::Display) -> String {
    error_response(Value::Null, RpcError::new(code::PARSE_ERROR, format!("parse error: {e}"))).to_string()
}

/// Answer one line: a request or a batch. `None`: nothing to send back.
pub fn handle_line(live: &Live, line: &str) -> Option<String> {
    match serde_json::from_str(line) {
        Ok(v) => handle_value(live, v),
        Err(e) => Some(parse_error(e)),
    }
}

/// Splits a byte stream into JSON texts: one per line as `blockwire ctl`
/// sends them, or several lines each (SPDK's client indents its
/// requests) with or without a newline after. A text that is not JSON is
/// reported and the stream resumes after the next newline.
#[derive(Default)]
pub struct Framer {
    buf: Vec<u8>,
}

/// What the framer found in the bytes so far.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Request(Value),
    /// Not JSON: answer a parse error.
    Garbage(String),
    /// A request longer than [`MAX_REQUEST`]: answer and close.
    TooLong,
}

impl Framer {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete text, or `None` until more bytes come.
    pub fn next_frame(&mut self) -> Option<Frame> {
        let start = self.buf.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(self.buf.len());
        self.buf.drain(..start);
        if self.buf.is_empty() {
            return None;
        }
        let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
        match it.next()? {
            Ok(v) => {
                let used = it.byte_offset();
                self.buf.drain(..used);
                Some(Frame::Request(v))
            }
            Err(e) if e.is_eof() => (self.buf.len() > MAX_REQUEST).then(|| {
                self.buf.clear();
                Frame::TooLong
            }),
            Err(e) => {
                let line_end = self.buf.iter().position(|&b| b == b'\n').map_or(self.buf.len(), |n| n + 1);
                self.buf.drain(..line_end);
                Some(Frame::Garbage(e.to_string()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bw_serve::start::not_started;

    fn live() -> Live {
        let mut c = bw_serve::ServeConfig::default();
        c.add_volume_flag("a=ram:1M").unwrap();
        let vols = bw_serve::start::open_volumes(&c).unwrap();
        Live::new(c, &vols, not_started(), None)
    }

    fn code_of(r: &str) -> i64 {
        let v: Value = serde_json::from_str(r).unwrap();
        v["error"]["code"].as_i64().unwrap_or(0)
    }

    #[test]
    fn errors_follow_json_rpc_and_change_nothing() {
        let l = live();
        let before = l.config();
        for (line, code) in [
            ("{not json", code::PARSE_ERROR),
            ("[]", code::INVALID_REQUEST),
            ("42", code::INVALID_REQUEST),
            (r#"{"jsonrpc":"1.0","id":1,"method":"status"}"#, code::INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":[1],"method":"status"}"#, code::INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":1,"method":7}"#, code::INVALID_REQUEST),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_explode"}"#, code::METHOD_NOT_FOUND),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":[1,2]}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b"}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"ram:1M","colour":"red"}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"floppy:1M"}}"#, code::REFUSED),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_resize","params":{"name":"a","size":"lots"}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":1,"method":"status","params":{"verbose":true}}"#, code::INVALID_PARAMS),
            (r#"{"jsonrpc":"2.0","id":"x","method":"nvme_ns_add","params":{"nqn":"nqn.x:y","nsid":1,"volume":"a"}}"#, code::REFUSED),
        ] {
            let r = handle_line(&l, line).unwrap();
            assert_eq!(code_of(&r), code, "{line} -> {r}");
        }
        assert_eq!(l.config(), before);
        // A refusal says what went wrong in data.reason.
        for (line, reason) in [
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_remove","params":{"name":"nope"}}"#, "not_found"),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"a","backend":"ram:1M"}}"#, "already_exists"),
            (r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"floppy:1M"}}"#, "invalid"),
            (r#"{"jsonrpc":"2.0","id":1,"method":"ana_set","params":{"nqn":"nqn.x:y","state":"optimized"}}"#, "unsupported"),
        ] {
            let r: Value = serde_json::from_str(&handle_line(&l, line).unwrap()).unwrap();
            assert_eq!((r["error"]["code"].as_i64(), r["error"]["data"]["reason"].as_str()), (Some(code::REFUSED), Some(reason)), "{line} -> {r}");
        }
        // A notification gets no answer; a batch one answer per request.
        assert!(handle_line(&l, r#"{"jsonrpc":"2.0","method":"status"}"#).is_none());
        let r: Value = serde_json::from_str(&handle_line(&l, r#"[{"jsonrpc":"2.0","id":1,"method":"status"},{"jsonrpc":"2.0","id":2,"method":"nope"}]"#).unwrap()).unwrap();
        assert_eq!((r[0]["id"].as_i64(), r[1]["error"]["code"].as_i64()), (Some(1), Some(code::METHOD_NOT_FOUND)));
    }

    #[test]
    fn methods_change_the_configuration() {
        let l = live();
        let r: Value = serde_json::from_str(&handle_line(&l, r#"{"jsonrpc":"2.0","id":1,"method":"volume_add","params":{"name":"b","backend":"ram:2M"}}"#).unwrap()).unwrap();
        assert_eq!(r["result"]["changes"][0], "volume b: added (2097152 bytes)", "{r}");
        handle_line(&l, r#"{"jsonrpc":"2.0","id":2,"method":"volume_resize","params":{"name":"b","size":"3M"}}"#).unwrap();
        let s: Value = serde_json::from_str(&handle_line(&l, r#"{"jsonrpc":"2.0","id":3,"method":"status"}"#).unwrap()).unwrap();
        assert_eq!(s["result"]["volumes"][1]["size"], 3 << 20, "{s}");
        let names: Value = serde_json::from_str(&handle_line(&l, r#"{"jsonrpc":"2.0","id":4,"method":"rpc_get_methods"}"#).unwrap()).unwrap();
        assert_eq!(names["result"].as_array().unwrap().len(), all_methods().count());
        assert_eq!(names["result"][0], "rpc_get_methods");
        // Method names are unique.
        let mut n: Vec<&str> = all_methods().map(|m| m.name).collect();
        n.sort();
        n.dedup();
        assert_eq!(n.len(), all_methods().count());
    }

    /// Requests split over reads, several per read, indented over lines
    /// (SPDK's client) or one per line; garbage costs its line only.
    #[test]
    fn framer_finds_each_request() {
        let mut f = Framer::default();
        f.push(b"{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 1,\n  \"met");
        assert_eq!(f.next_frame(), None);
        f.push(b"hod\": \"status\"\n}{\"id\":2}\n{not json\n[1]");
        let mut got = vec![];
        while let Some(x) = f.next_frame() {
            got.push(x);
        }
        assert!(matches!(&got[0], Frame::Request(v) if v["method"] == "status"), "{got:?}");
        assert_eq!(got[1], Frame::Request(json!({"id": 2})));
        assert!(matches!(got[2], Frame::Garbage(_)), "{got:?}");
        assert_eq!(got[3], Frame::Request(json!([1])));
        assert_eq!(got.len(), 4);
        f.push(b"\"");
        f.push(&vec![b'a'; MAX_REQUEST]);
        assert_eq!(f.next_frame(), Some(Frame::TooLong));
    }
}
