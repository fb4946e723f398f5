//! Backend spec strings: `ram:SIZE`, `file:PATH`, or a plain path, followed by
//! comma-separated options `size=SIZE`, `direct`, `sync`, `readonly`.

use crate::parse_size;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// Anonymous memory (a sparse memfd), lost when the process exits.
    Ram { size: u64 },
    /// A regular file (created sparse with `size` if missing) or a block device.
    File { path: PathBuf, size: Option<u64> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSpec {
    pub kind: BackendKind,
    /// Bypass the page cache (O_DIRECT).
    pub direct: bool,
    /// Every write durable before it is acknowledged (O_DSYNC).
    pub sync: bool,
    pub readonly: bool,
}

impl BackendSpec {
    pub fn ram(size: u64) -> Self {
        BackendSpec { kind: BackendKind::Ram { size }, direct: false, sync: false, readonly: false }
    }

    pub fn parse(s: &str) -> Result<Self, String> {
        let mut parts = s.split(',');
        let head = parts.next().unwrap_or_default().trim();
        let mut size_opt = None;
        let (mut direct, mut sync, mut readonly) = (false, false, false);
        for opt in parts {
            let opt = opt.trim();
            match opt.split_once('=') {
                Some(("size", v)) => size_opt = Some(parse_size(v)?),
                Some((k, _)) => return Err(format!("unknown backend option {k:?} in {s:?}")),
                None => match opt {
                    "direct" => direct = true,
                    "sync" => sync = true,
                    "readonly" | "ro" => readonly = true,
                    "" => {}
                    other => {
                        return Err(format!(
                            "unknown backend option {other:?} in {s:?} (expected size=, direct, sync, readonly)"
                        ))
                    }
                },
            }
        }
        let kind = if let Some(sz) = head.strip_prefix("ram:") {
            if direct {
                return Err("option direct makes no sense for a ram backend".into());
            }
            BackendKind::Ram { size: parse_size(sz)? }
        } else if let Some(p) = head.strip_prefix("file:") {
            BackendKind::File { path: PathBuf::from(p), size: size_opt }
        } else if head.starts_with('/') || head.starts_with('.') {
            BackendKind::File { path: PathBuf::from(head), size: size_opt }
        } else {
            return Err(format!(
                "invalid backend {head:?}: expected ram:SIZE, file:PATH or a path to a file or block device"
            ));
        };
        if let BackendKind::Ram { size } = kind {
            if size == 0 {
                return Err("a ram backend needs a size above zero".into());
            }
        }
        Ok(BackendSpec { kind, direct, sync, readonly })
    }
}

impl std::fmt::Display for BackendSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            BackendKind::Ram { size } => write!(f, "ram:{}", crate::format_size(*size))?,
            BackendKind::File { path, size } => {
                write!(f, "file:{}", path.display())?;
                if let Some(s) = size {
                    write!(f, ",size={}", crate::format_size(*s))?;
                }
            }
        }
        for (on, name) in [(self.direct, "direct"), (self.sync, "sync"), (self.readonly, "readonly")] {
            if on {
                write!(f, ",{name}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specs() {
        assert_eq!(BackendSpec::parse("ram:1G").unwrap(), BackendSpec::ram(1 << 30));
        let f = BackendSpec::parse("file:/tmp/x,size=64M,direct,sync").unwrap();
        assert_eq!(f.kind, BackendKind::File { path: "/tmp/x".into(), size: Some(64 << 20) });
        assert!(f.direct && f.sync && !f.readonly);
        let d = BackendSpec::parse("/dev/loop0,readonly").unwrap();
        assert!(d.readonly);
        assert!(BackendSpec::parse("nbd:foo").is_err());
        assert!(BackendSpec::parse("ram:1G,direct").is_err());
        assert!(BackendSpec::parse("ram:1G,bogus").is_err());
        assert!(BackendSpec::parse("ram:0").is_err());
    }

    #[test]
    fn display_round_trips() {
        for s in ["ram:1G", "file:/tmp/a,size=2M,direct,sync,readonly", "file:/dev/sdb"] {
            let spec = BackendSpec::parse(s).unwrap();
            assert_eq!(BackendSpec::parse(&spec.to_string()).unwrap(), spec);
        }
    }
}
