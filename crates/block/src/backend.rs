//! The device a [`BackendSpec`] names. (Above the devices, which use the
//! crate root's trait and types.)

use crate::file::FileDevice;
use crate::rbd::RbdDevice;
use crate::spec::{BackendKind, BackendSpec};
use crate::{BlockDevice, Result};

/// Open a backend from its spec.
pub fn open(spec: &BackendSpec) -> Result<Box<dyn BlockDevice>> {
    match &spec.kind {
        BackendKind::Rbd(t) => Ok(Box::new(RbdDevice::open(spec, t)?)),
        BackendKind::Ram { .. } | BackendKind::File { .. } => Ok(Box::new(FileDevice::open(spec)?)),
    }
}
