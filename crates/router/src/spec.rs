//! Command-line router description -> `RouterConfig`.

use bw_mpls::switch::{Mac, Pseudowire, RouterConfig, Swap};

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("--port {0:?}: expected NAME=INTERFACE")]
    Port(String),
    #[error("port name {0:?} given twice")]
    DuplicatePort(String),
    #[error("{what} {text:?}: {why}")]
    Bad {
        what: &'static str,
        text: String,
        why: String,
    },
    #[error("interface {iface}: {err}")]
    Interface { iface: String, err: std::io::Error },
    #[error(transparent)]
    Config(#[from] bw_mpls::switch::ConfigError),
}

/// A router's ports (name, interface) and its forwarding configuration.
#[derive(Debug, Clone)]
pub struct RouterSpec {
    pub ports: Vec<(String, String)>,
    pub config: RouterConfig,
}

pub fn parse_mac(s: &str) -> Option<Mac> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(parts) {
        if p.is_empty() || p.len() > 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    Some(m)
}

/// `key=value,key=value` with exactly the keys in `keys`.
fn fields<'a>(what: &'static str, text: &'a str, keys: &[&str]) -> Result<Vec<&'a str>, SpecError> {
    let bad = |why: String| SpecError::Bad {
        what,
        text: text.to_string(),
        why,
    };
    let mut vals = vec![None; keys.len()];
    for kv in text.split(',') {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| bad(format!("{kv:?} is not KEY=VALUE")))?;
        let i = keys
            .iter()
            .position(|x| *x == k)
            .ok_or_else(|| bad(format!("unknown key {k:?} (keys: {})", keys.join(", "))))?;
        if vals[i].replace(v).is_some() {
            return Err(bad(format!("{k} given twice")));
        }
    }
    keys.iter()
        .zip(vals)
        .map(|(k, v)| v.ok_or_else(|| bad(format!("{k}= missing"))))
        .collect()
}

/// Build a router from its command line. `mac_of` looks up an interface's
/// MAC (the real one reads it from the kernel; tests pass a table).
pub fn parse(
    ports: &[String],
    pseudowires: &[String],
    swaps: &[String],
    pops: &[u32],
    mac_of: impl Fn(&str) -> std::io::Result<Mac>,
) -> Result<RouterSpec, SpecError> {
    let mut named: Vec<(String, String)> = Vec::new();
    for p in ports {
        let (n, i) = p
            .split_once('=')
            .filter(|(n, i)| !n.is_empty() && !i.is_empty())
            .ok_or_else(|| SpecError::Port(p.clone()))?;
        if named.iter().any(|(x, _)| x == n) {
            return Err(SpecError::DuplicatePort(n.to_string()));
        }
        named.push((n.to_string(), i.to_string()));
    }
    let macs = named
        .iter()
        .map(|(_, i)| {
            mac_of(i).map_err(|err| SpecError::Interface {
                iface: i.clone(),
                err,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut cfg = RouterConfig::new(macs);
    let port = |what: &'static str, text: &str, n: &str| {
        named
            .iter()
            .position(|(x, _)| x == n)
            .ok_or_else(|| SpecError::Bad {
                what,
                text: text.to_string(),
                why: format!("no port named {n:?}"),
            })
    };
    let num = |what: &'static str, text: &str, v: &str| {
        v.parse::<u32>().map_err(|_| SpecError::Bad {
            what,
            text: text.to_string(),
            why: format!("{v:?} is not a label number"),
        })
    };
    let mac = |what: &'static str, text: &str, v: &str| {
        parse_mac(v).ok_or_else(|| SpecError::Bad {
            what,
            text: text.to_string(),
            why: format!("{v:?} is not a MAC address"),
        })
    };
    for t in pseudowires {
        const W: &str = "--pseudowire";
        let f = fields(W, t, &["customer", "core", "route", "label", "via"])?;
        cfg.pseudowires.push(Pseudowire {
            customer_port: port(W, t, f[0])?,
            core_port: port(W, t, f[1])?,
            route_label: num(W, t, f[2])?,
            customer_label: num(W, t, f[3])?,
            next_hop: mac(W, t, f[4])?,
        });
    }
    for t in swaps {
        const S: &str = "--swap";
        let f = fields(S, t, &["in", "out", "port", "via"])?;
        let s = Swap {
            out_label: num(S, t, f[1])?,
            port: port(S, t, f[2])?,
            next_hop: mac(S, t, f[3])?,
        };
        if cfg.swaps.insert(num(S, t, f[0])?, s).is_some() {
            return Err(SpecError::Bad {
                what: S,
                text: t.clone(),
                why: "incoming label given twice".into(),
            });
        }
    }
    cfg.pop_labels.extend_from_slice(pops);
    // Validate now, so a bad command line fails before any socket opens.
    bw_mpls::LabelRouter::new(cfg.clone())?;
    Ok(RouterSpec {
        ports: named,
        config: cfg,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn macs(i: &str) -> std::io::Result<Mac> {
        match i {
            "v0" => Ok([2, 0, 0, 0, 0, 1]),
            "v1" => Ok([2, 0, 0, 0, 0, 2]),
            _ => Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such interface",
            )),
        }
    }
    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn edge_and_switch() {
        let r = parse(
            &s(&["c=v0", "k=v1"]),
            &s(&["customer=c,core=k,route=101,label=1000,via=02:00:00:00:00:0b"]),
            &[],
            &[204],
            macs,
        )
        .unwrap();
        assert_eq!(r.config.pseudowires[0].core_port, 1);
        assert_eq!(r.config.pseudowires[0].next_hop, [2, 0, 0, 0, 0, 0xb]);
        assert_eq!(r.config.pop_labels, vec![204]);
        let r = parse(
            &s(&["w=v0", "e=v1"]),
            &[],
            &s(&["in=101,out=102,port=e,via=2:0:0:0:0:c"]),
            &[],
            macs,
        )
        .unwrap();
        assert_eq!(r.config.swaps[&101].out_label, 102);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let e = |p: &[&str], w: &[&str], sw: &[&str]| {
            parse(&s(p), &s(w), &s(sw), &[], macs)
                .unwrap_err()
                .to_string()
        };
        assert!(e(&["c"], &[], &[]).contains("NAME=INTERFACE"));
        assert!(e(&["c=v0", "c=v1"], &[], &[]).contains("twice"));
        assert!(e(&["c=nope"], &[], &[]).contains("nope"));
        assert!(e(
            &["w=v0"],
            &[],
            &["in=101,out=102,port=x,via=02:00:00:00:00:01"]
        )
        .contains("no port named"));
        assert!(e(&["w=v0"], &[], &["in=101,out=102,port=w"]).contains("via= missing"));
        assert!(e(
            &["w=v0"],
            &[],
            &["in=101,out=1x,port=w,via=02:00:00:00:00:01"]
        )
        .contains("not a label"));
        assert!(e(
            &["w=v0"],
            &[],
            &["in=101,out=102,port=w,via=02:00:00:00:01"]
        )
        .contains("MAC"));
        assert!(e(
            &["w=v0"],
            &[],
            &["in=3,out=102,port=w,via=02:00:00:00:00:01"]
        )
        .contains("reserved"));
        assert!(e(
            &["w=v0"],
            &[],
            &["in=101,out=102,port=w,via=02:00:00:00:00:01,ttl=3"]
        )
        .contains("unknown key"));
    }
}
