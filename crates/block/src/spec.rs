//! Backend spec strings: `ram:SIZE`, `file:PATH`, a plain path, or
//! `rbd:POOL/IMAGE[@SNAPSHOT]`, followed by comma-separated options `size=SIZE`,
//! `direct`, `sync`, `readonly`, and for rbd `conf=PATH`, `id=USER`,
//! `timeout=SECS`.
//!
//! The text is how a spec is written (a flag, a configuration file, an
//! RPC parameter); code builds and passes [`BackendSpec`] values. A value
//! whose names the text cannot carry (a comma, which starts an option; a
//! blank the reader trims; bytes that are not UTF-8) is refused by
//! [`BackendSpec::to_text`] and by serde, never written as another spec.

use crate::parse_size;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendKind {
    /// Anonymous memory (a sparse memfd), lost when the process exits.
    Ram { size: u64 },
    /// A regular file (created sparse with `size` if missing) or a block device.
    File { path: PathBuf, size: Option<u64> },
    /// A Ceph RBD image, reached through librbd (created with `size` if
    /// missing).
    Rbd(RbdTarget),
}

/// Where an RBD image lives and how to reach its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdTarget {
    pub pool: String,
    pub image: String,
    /// A snapshot of the image (`rbd:POOL/IMAGE@SNAP`), opened read-only.
    pub snap: Option<String>,
    /// ceph.conf to read; librados' default search path when `None`.
    pub conf: Option<PathBuf>,
    /// Ceph client id (the `USER` of `client.USER`); `admin` when `None`.
    pub id: Option<String>,
    pub size: Option<u64>,
    /// Seconds a request to the cluster may take before it fails with an
    /// error (librados waits forever by default); `None`: the default of
    /// [`RbdTarget::DEFAULT_TIMEOUT_SECS`].
    pub timeout_secs: Option<u32>,
}

impl RbdTarget {
    /// Below the Linux initiators' 30 s command timeouts, so a cluster that
    /// is gone shows up as failed commands rather than aborts and resets.
    pub const DEFAULT_TIMEOUT_SECS: u32 = 20;
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
        let is_rbd = head.starts_with("rbd:");
        let mut size_opt = None;
        let (mut conf, mut id, mut timeout_secs) = (None, None, None);
        let (mut direct, mut sync, mut readonly) = (false, false, false);
        for opt in parts {
            let opt = opt.trim();
            match opt.split_once('=') {
                Some(("size", v)) => size_opt = Some(parse_size(v)?),
                Some(("conf", v)) if is_rbd => conf = Some(PathBuf::from(v)),
                Some(("id", v)) if is_rbd => id = Some(v.to_string()),
                Some(("timeout", v)) if is_rbd => {
                    let t: u32 = v.parse().map_err(|_| format!("timeout={v:?}: expected whole seconds"))?;
                    if t == 0 {
                        return Err("timeout=0: an rbd request needs a time limit above zero".into());
                    }
                    timeout_secs = Some(t);
                }
                Some((k @ ("conf" | "id" | "timeout"), _)) => return Err(format!("option {k}= is for rbd: backends only, in {s:?}")),
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
        } else if let Some(rest) = head.strip_prefix("rbd:") {
            if direct || sync {
                return Err("options direct and sync make no sense for an rbd backend (every write is acknowledged by the OSDs)".into());
            }
            let (pool, image) = rest
                .split_once('/')
                .filter(|(p, i)| !p.is_empty() && !i.is_empty() && !i.contains('/'))
                .ok_or_else(|| format!("invalid rbd backend {head:?}: expected rbd:POOL/IMAGE or rbd:POOL/IMAGE@SNAPSHOT"))?;
            let (image, snap) = match image.split_once('@') {
                Some((i, s)) if !i.is_empty() && !s.is_empty() && !s.contains('@') => (i, Some(s.to_string())),
                Some(_) => return Err(format!("invalid rbd backend {head:?}: expected rbd:POOL/IMAGE@SNAPSHOT")),
                None => (image, None),
            };
            if size_opt == Some(0) {
                return Err("an rbd image needs a size above zero".into());
            }
            if snap.is_some() {
                if size_opt.is_some() {
                    return Err(format!("{head}: a snapshot has the size it was taken with (no size=)"));
                }
                // A snapshot cannot be written: say so in the spec.
                readonly = true;
            }
            BackendKind::Rbd(RbdTarget { pool: pool.into(), image: image.into(), snap, conf, id, size: size_opt, timeout_secs })
        } else if head.starts_with('/') || head.starts_with('.') {
            BackendKind::File { path: PathBuf::from(head), size: size_opt }
        } else {
            return Err(format!(
                "invalid backend {head:?}: expected ram:SIZE, file:PATH, rbd:POOL/IMAGE or a path to a file or block device"
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

impl BackendSpec {
    /// The spec as text that [`BackendSpec::parse`] reads back as this
    /// same spec, or why there is none. (`Display` writes the text
    /// regardless, for messages.)
    pub fn to_text(&self) -> Result<String, String> {
        let text = self.to_string();
        if BackendSpec::parse(&text).as_ref() == Ok(self) {
            return Ok(text);
        }
        let comma = match &self.kind {
            BackendKind::File { path, .. } => path.to_string_lossy().contains(',').then(|| format!("file name {:?}", path.display().to_string())),
            BackendKind::Rbd(t) => [Some(t.pool.as_str()), Some(t.image.as_str()), t.snap.as_deref(), t.id.as_deref(), t.conf.as_ref().and_then(|c| c.to_str())]
                .into_iter()
                .flatten()
                .find(|n| n.contains(','))
                .map(|n| format!("name {n:?}")),
            BackendKind::Ram { .. } => None,
        };
        Err(match comma {
            Some(what) => format!("{what} holds a comma, which a backend spec reads as the start of an option: use a name without one"),
            None => format!("backend {text:?} does not read back as the same backend (a name with a comma, a trailing blank, a '/' or '@' in an RBD name, or bytes that are not UTF-8)"),
        })
    }
}

/// Read from and written as the text form, so configuration files and
/// saved configurations keep the strings people write.
impl serde::Serialize for BackendSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_text().map_err(serde::ser::Error::custom)?)
    }
}

impl<'de> serde::Deserialize<'de> for BackendSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        BackendSpec::parse(&text).map_err(serde::de::Error::custom)
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
            BackendKind::Rbd(t) => {
                write!(f, "rbd:{}/{}", t.pool, t.image)?;
                if let Some(snap) = &t.snap {
                    write!(f, "@{snap}")?;
                }
                if let Some(c) = &t.conf {
                    write!(f, ",conf={}", c.display())?;
                }
                if let Some(id) = &t.id {
                    write!(f, ",id={id}")?;
                }
                if let Some(s) = t.size {
                    write!(f, ",size={}", crate::format_size(s))?;
                }
                if let Some(s) = t.timeout_secs {
                    write!(f, ",timeout={s}")?;
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
    fn parses_rbd_specs() {
        let r = BackendSpec::parse("rbd:pool/img,conf=/etc/ceph/x.conf,id=gw,size=1G,timeout=5,readonly").unwrap();
        let want = RbdTarget {
            pool: "pool".into(),
            image: "img".into(),
            snap: None,
            conf: Some("/etc/ceph/x.conf".into()),
            id: Some("gw".into()),
            size: Some(1 << 30),
            timeout_secs: Some(5),
        };
        assert_eq!(r.kind, BackendKind::Rbd(want));
        assert!(r.readonly);
        let snap = BackendSpec::parse("rbd:pool/img@monday").unwrap();
        assert!(snap.readonly && matches!(&snap.kind, BackendKind::Rbd(t) if t.image == "img" && t.snap.as_deref() == Some("monday")), "{snap:?}");
        for bad in ["rbd:p/i@", "rbd:p/@s", "rbd:p/i@s@t", "rbd:p/i@s,size=1M", "rbd:img", "rbd:/img", "rbd:pool/", "rbd:a/b/c", "rbd:p/i,direct", "rbd:p/i,size=0", "rbd:p/i,timeout=0", "rbd:p/i,timeout=x", "file:/x,conf=/y", "ram:1M,id=a"] {
            assert!(BackendSpec::parse(bad).is_err(), "{bad} parsed");
        }
    }

    /// A name the text cannot carry is refused, never written as another
    /// spec: a file name with a comma would read as options (a file
    /// `x,size=64M` as file `x` of 64 MiB).
    #[test]
    fn names_the_text_cannot_carry_are_refused() {
        let file = |p: &str| BackendSpec { kind: BackendKind::File { path: p.into(), size: None }, direct: false, sync: false, readonly: false };
        let e = file("/srv/x,size=64M").to_text().unwrap_err();
        assert!(e.contains("\"/srv/x,size=64M\"") && e.contains("comma"), "{e}");
        assert!(file("/srv/x ").to_text().is_err(), "a trailing blank is trimmed by the reader");
        let rbd = |image: &str| BackendSpec { kind: BackendKind::Rbd(RbdTarget { pool: "p".into(), image: image.into(), snap: None, conf: None, id: None, size: None, timeout_secs: None }), direct: false, sync: false, readonly: false };
        assert!(rbd("a,id=admin").to_text().unwrap_err().contains("comma"));
        assert!(rbd("a/b").to_text().is_err());
        assert_eq!(file("/srv/x.img").to_text().unwrap(), "file:/srv/x.img");
        assert!(serde_json::to_string(&file("/srv/a,b")).is_err());
    }

    /// serde reads and writes the text; a spec that does not parse is an
    /// error naming what is wrong.
    #[test]
    fn serde_uses_the_text() {
        for s in ["ram:1G", "file:/tmp/a,size=2M,direct,sync,readonly", "rbd:p/i@s,conf=/c,id=u,timeout=3,readonly"] {
            let spec: BackendSpec = serde_json::from_str(&format!("{s:?}")).unwrap();
            assert_eq!(spec, BackendSpec::parse(s).unwrap());
            assert_eq!(serde_json::to_string(&spec).unwrap(), format!("{s:?}"));
        }
        let e = serde_json::from_str::<BackendSpec>("\"tape:1\"").unwrap_err().to_string();
        assert!(e.contains("invalid backend"), "{e}");
    }

    #[test]
    fn display_round_trips() {
        for s in ["ram:1G", "file:/tmp/a,size=2M,direct,sync,readonly", "file:/dev/sdb", "rbd:p/i,conf=/c,id=u,size=4M,timeout=3,readonly", "rbd:p/i@s,conf=/c"] {
            let spec = BackendSpec::parse(s).unwrap();
            assert_eq!(BackendSpec::parse(&spec.to_string()).unwrap(), spec);
        }
    }
}
