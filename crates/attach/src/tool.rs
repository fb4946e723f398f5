//! Running the system tools the lifecycle needs (losetup, mkfs, mount).

use anyhow::{bail, Context};
use std::process::{Command, Stdio};

/// Run `cmd` to completion; its stdout, trimmed, or its first line of
/// complaint as the error.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        // One line for the user: tools append usage text after the reason.
        let reason = err
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no message");
        bail!(
            "{} failed: {}",
            cmd.get_program().to_string_lossy(),
            reason.trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
