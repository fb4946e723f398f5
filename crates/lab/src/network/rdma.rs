//! Whether NVMe over RDMA can be measured on a link: both hosts need an
//! RDMA device (RoCE, iWARP, InfiniBand with IPoIB, or soft-RoCE) on the
//! link's interface, or blockwire's RDMA listener has no address to bind
//! and the kernel's nvme-rdma no device to reach it through. A host
//! without any (most machines, this lab's own) makes the RDMA subjects
//! unavailable with one line saying so, before any target starts.

use crate::hosts::host::Host;

/// One line per (RDMA device, network interface it carries): RoCE and
/// soft-RoCE devices name theirs in the GID table, InfiniBand and iWARP
/// devices are under their interface's PCI device. A device with no
/// interface found is listed alone.
const LIST: &str = r#"for d in /sys/class/infiniband/*; do [ -e "$d" ] || continue; echo "${d##*/}"; done
for p in /sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*; do
  n=$(cat "$p" 2>/dev/null) || continue
  [ -n "$n" ] || continue
  d=${p#/sys/class/infiniband/}; echo "${d%%/*} $n"
done
for d in /sys/class/net/*/device/infiniband/*; do
  [ -e "$d" ] || continue
  i=${d#/sys/class/net/}; echo "${d##*/} ${i%%/*}"
done
true"#;

/// An RDMA device and the network interfaces it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub interfaces: Vec<String>,
}

/// The devices [`LIST`] printed, in the order first named.
fn parse(out: &str) -> Vec<Device> {
    let mut v: Vec<Device> = vec![];
    for line in out.lines() {
        let mut w = line.split_whitespace();
        let Some(name) = w.next() else { continue };
        let i = match v.iter().position(|d| d.name == name) {
            Some(i) => i,
            None => {
                v.push(Device { name: name.into(), interfaces: vec![] });
                v.len() - 1
            }
        };
        if let Some(iface) = w.next() {
            if !v[i].interfaces.iter().any(|x| x == iface) {
                v[i].interfaces.push(iface.into());
            }
        }
    }
    v
}

/// Why `host` (named `host_name`) cannot carry NVMe/RDMA on interface
/// `iface`, given its RDMA devices; None if one of them serves `iface`.
pub fn unavailable(host_name: &str, iface: &str, devices: &[Device]) -> Option<String> {
    if devices.is_empty() {
        return Some(format!("no RDMA device on {host_name}: /sys/class/infiniband is empty"));
    }
    if devices.iter().any(|d| d.interfaces.iter().any(|i| i == iface)) {
        return None;
    }
    let have: Vec<String> = devices
        .iter()
        .map(|d| if d.interfaces.is_empty() { d.name.clone() } else { format!("{} on {}", d.name, d.interfaces.join(", ")) })
        .collect();
    Some(format!("no RDMA device on {iface} of {host_name} (it has {})", have.join("; ")))
}

/// [`unavailable`] for the live `host` (a reason too when its devices
/// cannot be listed).
pub fn check(host: &Host, iface: &str) -> Option<String> {
    match host.run("sh", &["-c", LIST]) {
        Ok(out) => unavailable(host.name(), iface, &parse(&out)),
        Err(e) => Some(format!("cannot list the RDMA devices of {}: {e:#}", host.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_read_from_the_listing() {
        let out = "mlx5_0\nrxe0\nrxe0 eth0\nrxe0 eth0\nmlx5_0 ens1f0np0\n";
        assert_eq!(
            parse(out),
            vec![
                Device { name: "mlx5_0".into(), interfaces: vec!["ens1f0np0".into()] },
                Device { name: "rxe0".into(), interfaces: vec!["eth0".into()] },
            ]
        );
        assert!(parse("").is_empty());
    }

    #[test]
    fn availability_needs_a_device_on_the_link() {
        let none = unavailable("this machine", "bwl1at", &[]).unwrap();
        assert_eq!(none, "no RDMA device on this machine: /sys/class/infiniband is empty");
        let devs = parse("mlx5_0\nmlx5_0 ens1f0np0\nirdma0\n");
        assert_eq!(unavailable("t1", "ens1f0np0", &devs), None);
        assert_eq!(unavailable("t1", "bwl1at", &devs).unwrap(), "no RDMA device on bwl1at of t1 (it has mlx5_0 on ens1f0np0; irdma0)");
    }

    /// The rule on this machine, whatever it has: a reason or none, one
    /// line, never a hang.
    #[test]
    fn this_machine_gives_one_line() {
        if let Some(why) = check(&Host::Local, "lo") {
            assert!(!why.contains('\n') && why.contains("RDMA"), "{why}");
        }
    }
}
