//! `blockwire ctl`'s text output: any JSON-RPC result as lines a person
//! reads (`--json` gives the response itself, for scripts).

use serde_json::Value;

/// A result as text, ending in a newline.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    match v {
        Value::Null => out.push_str("ok\n"),
        Value::Object(o) if o.len() == 1 && o.get("changes").is_some_and(Value::is_array) => {
            let changes = o["changes"].as_array().map(Vec::as_slice).unwrap_or_default();
            if changes.is_empty() {
                out.push_str("no change\n");
            }
            for c in changes {
                out.push_str(&scalar(c));
                out.push('\n');
            }
        }
        v => block(v, 0, &mut out),
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_array()) => {
            if a.is_empty() { "-".into() } else { a.iter().map(scalar).collect::<Vec<_>>().join(", ") }
        }
        v => v.to_string(),
    }
}

fn is_table(v: &Value) -> bool {
    matches!(v, Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object))
}

fn block(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                if x.is_object() || is_table(x) {
                    out.push_str(&format!("{pad}{k}:\n"));
                    block(x, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}{k}: {}\n", scalar(x)));
                }
            }
        }
        Value::Array(rows) if is_table(v) => table(rows, &pad, out),
        Value::Array(a) if a.is_empty() => out.push_str(&format!("{pad}(none)\n")),
        v => out.push_str(&format!("{pad}{}\n", scalar(v))),
    }
}

/// Rows of objects as aligned columns, headed by the first row's keys.
fn table(rows: &[Value], pad: &str, out: &mut String) {
    let keys: Vec<&String> = rows[0].as_object().map(|o| o.keys().collect()).unwrap_or_default();
    let cells: Vec<Vec<String>> = rows.iter().map(|r| keys.iter().map(|k| scalar(&r[k.as_str()])).collect()).collect();
    let width: Vec<usize> = keys.iter().enumerate().map(|(i, k)| cells.iter().map(|c| c[i].len()).chain([k.len()]).max().unwrap_or(0)).collect();
    let line = |cols: Vec<String>| {
        let s: Vec<String> = cols.iter().zip(&width).map(|(c, w)| format!("{c:<w$}")).collect();
        format!("{pad}{}\n", s.join("  ").trim_end())
    };
    out.push_str(&line(keys.iter().map(|k| k.to_uppercase()).collect()));
    for c in cells {
        out.push_str(&line(c));
    }
}

#[cfg(test)]
mod tests {
    use super::render;
    use serde_json::json;

    #[test]
    fn results_as_text() {
        assert_eq!(render(&json!(null)), "ok\n");
        assert_eq!(render(&json!({"changes": []})), "no change\n");
        assert_eq!(render(&json!({"changes": ["volume b: added", "x"]})), "volume b: added\nx\n");
        let t = render(&json!([{"id": "iscsi:1", "reads": 10}, {"id": "nvme:12", "reads": 3}]));
        assert_eq!(t, "ID       READS\niscsi:1  10\nnvme:12  3\n");
        let s = render(&json!({"pid": 7, "volumes": [{"name": "a", "size": 1}], "sessions": {"iscsi": 0}, "hosts": ["h1", "h2"]}));
        assert_eq!(s, "hosts: h1, h2\npid: 7\nsessions:\n  iscsi: 0\nvolumes:\n  NAME  SIZE\n  a     1\n");
    }
}
