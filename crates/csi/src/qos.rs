//! QoS as CSI carries it: a VolumeAttributesClass's parameters reach the
//! plugin as `mutable_parameters` (CreateVolume, ControllerModifyVolume),
//! and become the control API's `bdev_set_qos_limit` on every gateway
//! serving the volume. The keys are SPDK's parameter names, so a class
//! written for an SPDK-based driver means the same here; blockwire adds
//! per-direction IOPS (`r_ios_per_sec`, `w_ios_per_sec`), which SPDK lacks.

use serde_json::{Map, Value};
use std::collections::HashMap;
use tonic::Status;

/// The keys, in the order they are reported.
pub const KEYS: [&str; 6] = ["rw_ios_per_sec", "r_ios_per_sec", "w_ios_per_sec", "rw_mbytes_per_sec", "r_mbytes_per_sec", "w_mbytes_per_sec"];

/// The `bdev_set_qos_limit` params (without `name`) for `params`: each
/// key one of [`KEYS`], each value a whole number (0 = unlimited).
/// Anything else is INVALID_ARGUMENT, naming it (CSI: "mutable
/// parameters not supported").
pub fn limits(params: &HashMap<String, String>) -> Result<Map<String, Value>, Status> {
    let mut out = Map::new();
    let mut keys: Vec<_> = params.keys().collect();
    keys.sort();
    for k in keys {
        if !KEYS.contains(&k.as_str()) {
            return Err(Status::invalid_argument(format!("mutable parameter {k:?} is not supported (supported: {})", KEYS.join(", "))));
        }
        let v = &params[k];
        let n: u64 = v.trim().parse().map_err(|_| Status::invalid_argument(format!("mutable parameter {k}: {v:?} is not a whole number (0 = unlimited)")))?;
        out.insert(k.clone(), Value::from(n));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters() {
        let p = |kv: &[(&str, &str)]| limits(&kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        let m = p(&[("rw_ios_per_sec", "2000"), ("w_mbytes_per_sec", "0")]).unwrap();
        assert_eq!(Value::Object(m), serde_json::json!({"rw_ios_per_sec": 2000, "w_mbytes_per_sec": 0}));
        assert_eq!(p(&[("XXX_FakeKey", "1")]).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(p(&[("rw_ios_per_sec", "-1")]).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert_eq!(p(&[("rw_ios_per_sec", "1.5")]).unwrap_err().code(), tonic::Code::InvalidArgument);
        assert!(p(&[]).unwrap().is_empty());
    }
}
