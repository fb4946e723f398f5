//! What volume capabilities (access type and mode, file system) the
//! plugin accepts: the controller checks them at create and validate, the
//! node again at stage and publish.

use crate::proto;

/// File systems NodeStage makes and mounts.
pub const FILE_SYSTEMS: [&str; 2] = ["ext4", "xfs"];

/// Checks the capabilities a volume is asked to have; the reason one
/// cannot be given.
pub fn check(caps: &[proto::VolumeCapability]) -> Result<(), String> {
    use proto::volume_capability::access_mode::Mode;
    use proto::volume_capability::AccessType;
    if caps.is_empty() {
        return Err("volume_capabilities is required".into());
    }
    for c in caps {
        let mode = c.access_mode.as_ref().map(|m| m.mode()).unwrap_or(Mode::Unknown);
        let block = match &c.access_type {
            Some(AccessType::Block(_)) => true,
            Some(AccessType::Mount(m)) => {
                if !m.fs_type.is_empty() && !FILE_SYSTEMS.contains(&m.fs_type.as_str()) {
                    return Err(format!("fs_type {:?} is not one of {}", m.fs_type, FILE_SYSTEMS.join(", ")));
                }
                false
            }
            None => return Err("a capability without access_type".into()),
        };
        match mode {
            Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly | Mode::SingleNodeSingleWriter | Mode::SingleNodeMultiWriter | Mode::MultiNodeReaderOnly => {}
            // Several writers on one local file system would corrupt it;
            // on a raw block device the application coordinates them.
            Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter if block => {}
            Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => return Err(format!("access mode {} needs block access (a file system is mounted by one node)", mode.as_str_name())),
            Mode::Unknown => return Err("a capability without access_mode".into()),
        }
    }
    Ok(())
}
