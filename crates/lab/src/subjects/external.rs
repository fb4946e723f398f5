//! The user's own storage as a subject: `--subject NAME=URL` (an iSCSI
//! LUN or NVMe namespace on an array, an AoE shelf, a NAS's NFS export).
//! A row of the same registry as the peers, with two properties of its
//! own: the lab never starts or stops it, and it writes to it only where
//! allowed ([`External::writes_allowed`]). What the target says it is
//! (`blockwire identify`) goes into the results.
//!
//! External subjects are made once from the command line and live for the
//! whole process, so a [`Subject`](super::Subject) holds a `&'static` one
//! (leaked on purpose, like the strings of the peers' addresses).

use super::target::{Address, KernelAddress};

/// One `--subject NAME=URL`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct External {
    /// Its name in subject keys (`nas` gives `nas-iscsi`, `kernel-iscsi@nas`).
    pub name: &'static str,
    /// The URL blockwire's clients use (for NFS: the lab's own image file
    /// under the export).
    pub url: &'static str,
    /// Where it is, in its protocol's terms (the LUN, the namespace...).
    pub address: Address,
    /// The host its URL names (a kernel initiator's portal or address).
    pub host: &'static str,
    /// `--allow-writes NAME`: write workloads run on a block subject (its
    /// contents are destroyed).
    pub allow_writes: bool,
}

/// Names the registry uses already: an external subject must not take one.
const TAKEN: [&str; 4] = ["blockwire", "local", "kernel", "iperf3"];

/// Parse `NAME=URL`. `file` is the image the lab makes under an `nfs://`
/// export (`nfs://HOST[:PORT]/EXPORT`, no file: the lab's own goes there).
pub fn parse(s: &str, taken: &[&str], file: &str) -> Result<External, String> {
    let (name, url) = s.split_once('=').ok_or_else(|| format!("{s:?}: a subject is NAME=URL"))?;
    let name = name.trim();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) {
        return Err(format!("subject name {name:?}: lowercase letters and digits only (it becomes part of subject keys such as {name}-iscsi)"));
    }
    if TAKEN.contains(&name) || taken.contains(&name) {
        return Err(format!("subject name {name:?} is taken (blockwire, its peers, local and kernel name subjects already)"));
    }
    let url = url.trim();
    let full = if url.starts_with("nfs://") {
        let u = url.trim_end_matches('/');
        check_nfs_export(u)?;
        format!("{u}/{file}")
    } else {
        url.to_string()
    };
    let parsed = bw_initiator::TargetUrl::parse(&full).map_err(|e| format!("--subject {name}: {e}"))?;
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    use bw_initiator::TargetUrl as U;
    let (address, host) = match parsed {
        U::Aoe { shelf, slot, .. } => (Address::Aoe { shelf, slot }, String::new()),
        U::Iscsi { host, port, iqn, lun, .. } => (Address::Iscsi { iqn: leak(iqn), port, lun: lun as u32 }, host),
        U::Nvme { host, port, subnqn, .. } => (Address::Nvme { nqn: leak(subnqn), port }, host),
        U::NvmeRdma { host, port, subnqn, .. } => (Address::NvmeRdma { nqn: leak(subnqn), port }, host),
        U::Nfs { host, port, export, file, .. } => (Address::NfsFile { port, export: leak(export), file: leak(file) }, host),
    };
    Ok(External { name: leak(name.to_string()), url: leak(full), address, host: leak(host), allow_writes: false })
}

/// `nfs://HOST[:PORT]/EXPORT`: the export only (the lab adds its file).
fn check_nfs_export(u: &str) -> Result<(), String> {
    let rest = &u["nfs://".len()..];
    match rest.split_once('/') {
        Some((h, e)) if !h.is_empty() && !e.is_empty() => Ok(()),
        _ => Err(format!("{u:?}: an NFS subject is nfs://HOST[:PORT]/EXPORT (the lab makes its own image file there)")),
    }
}

impl External {
    /// Whether the lab may run write workloads on it: on an NFS export
    /// always (only its own image file is written), on a block subject
    /// with `--allow-writes NAME` only.
    pub fn writes_allowed(&self) -> bool {
        self.address.serves_files() || self.allow_writes
    }

    /// How a kernel initiator reaches it (None: it serves files).
    pub fn kernel(&self) -> Option<KernelAddress> {
        self.address.kernel_at(self.host)
    }

    /// Why write cases are skipped on it, naming them (None: none are).
    pub fn skipped_writes(&self, cases: &[String]) -> Option<String> {
        if self.writes_allowed() || cases.is_empty() {
            return None;
        }
        Some(format!(
            "read workloads only: {} skipped (an external block subject is never written unless --allow-writes {})",
            cases.join(", "),
            self.name
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_become_addresses() {
        let e = parse("nas=iscsi://10.0.0.5:3260/iqn.2000-01.com.example:lun7/3", &[], "x.img").unwrap();
        assert_eq!((e.name, e.host), ("nas", "10.0.0.5"));
        assert_eq!(e.address, Address::Iscsi { iqn: "iqn.2000-01.com.example:lun7", port: 3260, lun: 3 });
        assert!(!e.writes_allowed());
        assert_eq!(e.kernel().unwrap().b, "10.0.0.5:3260");
        let n = parse("arr=nvme+tcp://10.0.0.6/nqn.2014-08.org.example:a/1", &[], "x.img").unwrap();
        assert_eq!(n.address, Address::Nvme { nqn: "nqn.2014-08.org.example:a", port: 4420 });
        assert_eq!(n.kernel().unwrap().b, "10.0.0.6 4420");
        let f = parse("nas=nfs://10.0.0.7/srv/vm/", &[], "bwlab-1.img").unwrap();
        assert_eq!(f.url, "nfs://10.0.0.7/srv/vm/bwlab-1.img");
        assert_eq!(f.address, Address::NfsFile { port: 2049, export: "/srv/vm", file: "bwlab-1.img" });
        assert!(f.writes_allowed(), "the lab writes only its own file on an export");
        assert_eq!(f.kernel(), None);
    }

    #[test]
    fn bad_subjects_are_refused() {
        for bad in ["nas", "Nas=iscsi://h/iqn.x:y/0", "n-a=iscsi://h/iqn.x:y/0", "blockwire=iscsi://h/iqn.x:y/0", "tgt=iscsi://h/iqn.x:y/0", "nas=http://x", "nas=nfs://h", "nas=nfs://h/"] {
            assert!(parse(bad, &["tgt"], "x.img").is_err(), "{bad}");
        }
        let e = parse("nas=iscsi://h/iqn.x:y/0", &[], "x").unwrap();
        let why = e.skipped_writes(&["randwrite-4k-qd32".into()]).unwrap();
        assert!(why.contains("randwrite-4k-qd32") && why.contains("--allow-writes nas"), "{why}");
        assert_eq!(External { allow_writes: true, ..e }.skipped_writes(&["randwrite-4k-qd32".into()]), None);
    }
}
