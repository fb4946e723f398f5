//! Target URLs, one scheme per protocol.

use std::fmt;

#[derive(Clone, PartialEq, Eq)]
pub enum TargetUrl {
    /// `aoe://IFACE/SHELF.SLOT`
    Aoe { iface: String, shelf: u16, slot: u8 },
    /// `iscsi://[USER[%SECRET]@]HOST[:PORT]/IQN/LUN`
    Iscsi { host: String, port: u16, iqn: String, lun: u64, user: Option<String>, secret: Option<String> },
    /// `nvme+tcp://HOST[:PORT]/SUBNQN/NSID[?tls[=auto|kernel|user]]`: with
    /// `tls`, every queue runs TLS 1.3 with the PSK of
    /// `ConnectOptions::tls_psk`, its records kept by the kernel (kTLS)
    /// or in user space as asked (auto: the kernel's where it has TLS).
    Nvme { host: String, port: u16, subnqn: String, nsid: u32, tls: Option<bw_tls::RecordChoice> },
    /// `nvme+rdma://HOST[:PORT]/SUBNQN/NSID`: HOST is an address of the
    /// target's RDMA device (RoCE, iWARP, IPoIB).
    NvmeRdma { host: String, port: u16, subnqn: String, nsid: u32 },
    /// `nfs://HOST[:PORT]/EXPORT/FILE[?sync]`: the export is everything up
    /// to the last `/`, as qemu's nfs driver reads it.
    Nfs { host: String, port: u16, export: String, file: String, sync: bool },
}

#[derive(Debug, thiserror::Error)]
#[error("invalid target URL {url:?}: {why}")]
pub struct UrlError {
    pub url: String,
    pub why: String,
}

fn err(url: &str, why: impl Into<String>) -> UrlError {
    UrlError { url: redact_url(url), why: why.into() }
}

/// `url` with the CHAP secret of `USER%SECRET@` replaced by `***`, for
/// anything printed or stored (the parse takes the last `@` as the end of
/// the credentials, as here).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    match rest.rsplit_once('@') {
        Some((auth, tail)) => match auth.split_once('%') {
            Some((user, _)) => format!("{scheme}://{user}%***@{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Like `Display`: the secret is left out.
impl fmt::Debug for TargetUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TargetUrl({self})")
    }
}

/// Split `HOST[:PORT]`, accepting `[v6addr]:port`.
fn host_port(url: &str, s: &str, default_port: u16) -> Result<(String, u16), UrlError> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(|| err(url, "unclosed [ in host"))?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().map_err(|_| err(url, "bad port"))?,
            None if after.is_empty() => default_port,
            None => return Err(err(url, "junk after ]")),
        };
        return Ok((h.to_string(), port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Ok((h.to_string(), p.parse().map_err(|_| err(url, format!("bad port {p:?}")))?)),
        None => Ok((s.to_string(), default_port)),
    }
    .and_then(|(h, p)| if h.is_empty() { Err(err(url, "empty host")) } else { Ok((h, p)) })
}

impl TargetUrl {
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| err(url, "missing scheme://"))?;
        match scheme {
            "aoe" => {
                let (iface, addr) = rest.split_once('/').ok_or_else(|| err(url, "expected aoe://IFACE/SHELF.SLOT"))?;
                let (shelf, slot) = addr.split_once('.').ok_or_else(|| err(url, "expected SHELF.SLOT"))?;
                let shelf: u16 = shelf.parse().map_err(|_| err(url, "shelf must be 0..65534"))?;
                let slot: u8 = slot.parse().map_err(|_| err(url, "slot must be 0..254"))?;
                if iface.is_empty() || shelf == 0xFFFF || slot == 0xFF {
                    return Err(err(url, "interface missing or broadcast shelf/slot"));
                }
                Ok(TargetUrl::Aoe { iface: iface.to_string(), shelf, slot })
            }
            "iscsi" => {
                let (auth, rest) = match rest.rsplit_once('@') {
                    Some((a, r)) => (Some(a), r),
                    None => (None, rest),
                };
                let mut parts = rest.splitn(3, '/');
                let hp = parts.next().unwrap_or_default();
                let iqn = parts.next().filter(|s| !s.is_empty()).ok_or_else(|| err(url, "missing target IQN"))?;
                let lun = parts.next().unwrap_or("0");
                let lun: u64 = lun.parse().map_err(|_| err(url, "LUN must be a number"))?;
                // The largest LUN the SAM extended flat space format holds.
                if lun >= 1 << 24 {
                    return Err(err(url, "LUN must be below 16777216"));
                }
                let (host, port) = host_port(url, hp, 3260)?;
                let (user, secret) = match auth {
                    Some(a) => match a.split_once('%') {
                        Some((u, s)) => (Some(u.to_string()), Some(s.to_string())),
                        None => (Some(a.to_string()), None),
                    },
                    None => (None, None),
                };
                Ok(TargetUrl::Iscsi { host, port, iqn: iqn.to_string(), lun, user, secret })
            }
            "nvme+tcp" | "nvme-tcp" | "nvme" | "nvme+rdma" | "nvme-rdma" => {
                let (rest, tls) = match rest.split_once('?') {
                    None => (rest, None),
                    Some((r, q)) if !scheme.ends_with("rdma") => {
                        let choice = match q {
                            "tls" => "auto",
                            q => q.strip_prefix("tls=").ok_or_else(|| err(url, format!("unknown option {q:?} (tls, tls=auto|kernel|user)")))?,
                        };
                        let c = bw_tls::RecordChoice::parse(choice).ok_or_else(|| err(url, format!("tls={choice}: the record layer is auto, kernel or user")))?;
                        (r, Some(c))
                    }
                    Some((_, q)) => return Err(err(url, format!("unknown option {q:?} (NVMe/RDMA has no TLS)"))),
                };
                let mut parts = rest.splitn(3, '/');
                let hp = parts.next().unwrap_or_default();
                let subnqn = parts.next().filter(|s| !s.is_empty()).ok_or_else(|| err(url, "missing subsystem NQN"))?.to_string();
                let nsid: u32 = parts.next().unwrap_or("1").parse().map_err(|_| err(url, "NSID must be a number"))?;
                if nsid == 0 || nsid == u32::MAX {
                    return Err(err(url, "NSID must be between 1 and 0xFFFFFFFE"));
                }
                let (host, port) = host_port(url, hp, 4420)?;
                Ok(if scheme.ends_with("rdma") {
                    TargetUrl::NvmeRdma { host, port, subnqn, nsid }
                } else {
                    TargetUrl::Nvme { host, port, subnqn, nsid, tls }
                })
            }
            "nfs" => {
                let (rest, sync) = match rest.split_once('?') {
                    None => (rest, false),
                    Some((r, "sync")) => (r, true),
                    Some((_, q)) => return Err(err(url, format!("unknown option {q:?} (sync)"))),
                };
                let (hp, path) = rest.split_once('/').ok_or_else(|| err(url, "expected nfs://HOST[:PORT]/EXPORT/FILE"))?;
                let (export, file) = path.rsplit_once('/').ok_or_else(|| err(url, "expected nfs://HOST[:PORT]/EXPORT/FILE"))?;
                if file.is_empty() {
                    return Err(err(url, "missing file name after the export"));
                }
                let (host, port) = host_port(url, hp, 2049)?;
                Ok(TargetUrl::Nfs { host, port, export: format!("/{export}"), file: file.to_string(), sync })
            }
            other => Err(err(url, format!("unknown scheme {other:?} (aoe, iscsi, nvme+tcp, nvme+rdma, nfs)"))),
        }
    }

    pub fn protocol(&self) -> &'static str {
        match self {
            TargetUrl::Aoe { .. } => "aoe",
            TargetUrl::Iscsi { .. } => "iscsi",
            TargetUrl::Nvme { .. } => "nvme",
            TargetUrl::NvmeRdma { .. } => "nvme-rdma",
            TargetUrl::Nfs { .. } => "nfs",
        }
    }
}

impl fmt::Display for TargetUrl {
    /// Prints the URL without the CHAP secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = |h: &str| if h.contains(':') { format!("[{h}]") } else { h.to_string() };
        match self {
            TargetUrl::Aoe { iface, shelf, slot } => write!(f, "aoe://{iface}/{shelf}.{slot}"),
            TargetUrl::Iscsi { host: h, port, iqn, lun, user, .. } => {
                let u = user.as_ref().map(|u| format!("{u}@")).unwrap_or_default();
                write!(f, "iscsi://{u}{}:{port}/{iqn}/{lun}", host(h))
            }
            TargetUrl::Nvme { host: h, port, subnqn, nsid, tls } => {
                let q = match tls {
                    None => "",
                    Some(bw_tls::RecordChoice::Auto) => "?tls",
                    Some(bw_tls::RecordChoice::Kernel) => "?tls=kernel",
                    Some(bw_tls::RecordChoice::User) => "?tls=user",
                };
                write!(f, "nvme+tcp://{}:{port}/{subnqn}/{nsid}{q}", host(h))
            }
            TargetUrl::NvmeRdma { host: h, port, subnqn, nsid } => write!(f, "nvme+rdma://{}:{port}/{subnqn}/{nsid}", host(h)),
            TargetUrl::Nfs { host: h, port, export, file, sync } => {
                write!(f, "nfs://{}:{port}{export}/{file}{}", host(h), if *sync { "?sync" } else { "" })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_scheme() {
        assert_eq!(
            TargetUrl::parse("aoe://veth0/1.2").unwrap(),
            TargetUrl::Aoe { iface: "veth0".into(), shelf: 1, slot: 2 }
        );
        assert_eq!(
            TargetUrl::parse("iscsi://bob%s3cret@10.0.0.1:3261/iqn.2026-11.org.example:t/3").unwrap(),
            TargetUrl::Iscsi {
                host: "10.0.0.1".into(),
                port: 3261,
                iqn: "iqn.2026-11.org.example:t".into(),
                lun: 3,
                user: Some("bob".into()),
                secret: Some("s3cret".into())
            }
        );
        assert_eq!(
            TargetUrl::parse("nvme+tcp://[::1]/nqn.2026-11.org.example:s/2").unwrap(),
            TargetUrl::Nvme { host: "::1".into(), port: 4420, subnqn: "nqn.2026-11.org.example:s".into(), nsid: 2, tls: None }
        );
        for (q, want) in [("?tls", bw_tls::RecordChoice::Auto), ("?tls=user", bw_tls::RecordChoice::User), ("?tls=kernel", bw_tls::RecordChoice::Kernel)] {
            let u = TargetUrl::parse(&format!("nvme+tcp://h/nqn.x:s/1{q}")).unwrap();
            assert!(matches!(u, TargetUrl::Nvme { tls: Some(c), .. } if c == want));
            assert_eq!(u.to_string(), format!("nvme+tcp://h:4420/nqn.x:s/1{q}"));
        }
        assert!(TargetUrl::parse("nvme+tcp://h/nqn.x:s/1?tls=maybe").is_err());
        assert!(TargetUrl::parse("nvme+tcp://h/nqn.x:s/1?sync").is_err());
        assert!(TargetUrl::parse("nvme+rdma://h/nqn.x:s/1?tls").is_err());
        let u = TargetUrl::parse("nvme+rdma://10.0.0.1/nqn.2026-11.org.example:s/1").unwrap();
        assert_eq!(u, TargetUrl::NvmeRdma { host: "10.0.0.1".into(), port: 4420, subnqn: "nqn.2026-11.org.example:s".into(), nsid: 1 });
        assert_eq!(u.to_string(), "nvme+rdma://10.0.0.1:4420/nqn.2026-11.org.example:s/1");
        assert_eq!(u.protocol(), "nvme-rdma");
        assert_eq!(
            TargetUrl::parse("nfs://10.0.0.1/srv/vm/disk.img?sync").unwrap(),
            TargetUrl::Nfs { host: "10.0.0.1".into(), port: 2049, export: "/srv/vm".into(), file: "disk.img".into(), sync: true }
        );
        assert_eq!(TargetUrl::parse("nfs://h:2050/e/f").unwrap().to_string(), "nfs://h:2050/e/f");
        for bad in ["nfs://h/f", "nfs://h/e/", "nfs://h/e/f?x", "aoe://veth0/1", "aoe://x/65535.1", "iscsi://h", "nvme+tcp://h/n/0", "http://x/y", "iscsi://:1/iqn/0"] {
            assert!(TargetUrl::parse(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn display_hides_secret() {
        let u = TargetUrl::parse("iscsi://bob%s3cret@h/iqn.x:y/0").unwrap();
        assert_eq!(u.to_string(), "iscsi://bob@h:3260/iqn.x:y/0");
        assert!(!format!("{u:?}").contains("s3cret"));
    }

    #[test]
    fn errors_hide_secret() {
        for bad in ["iscsi://bob%s3cret@h", "iscsi://bob%s3cret@h/iqn.x:y/zz", "iscsi://bob%s3cret@h:99999/iqn.x:y/0"] {
            let e = TargetUrl::parse(bad).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("s3cret") && shown.contains("bob%***@h"), "{shown}");
        }
        assert_eq!(redact_url("iscsi://h/iqn.x:y/0"), "iscsi://h/iqn.x:y/0");
        assert_eq!(redact_url("iscsi://u@h/i/0"), "iscsi://u@h/i/0");
    }
}
