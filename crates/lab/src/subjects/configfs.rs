//! What the kernel's targets (LIO, nvmet) share: a setup script run on the
//! target host through configfs, with no tool of the host's (no targetcli,
//! no nvmetcli), that writes each thing to the host's state file before
//! making it (`lio`, `nvmet`, `modules`, `configfs` lines, undone by
//! `ssh::undo_function`), and a [`TargetProcess::kernel`] whose stop takes
//! it down again with those same lines.
//!
//! A host without configfs targets (this machine's kernel has none) gives
//! one reason, "no configfs target support: ...", and nothing is left.

use crate::cleanup::{registry, Resource, Undo};
use crate::hosts::host::Host;
use crate::subjects::process::TargetProcess;

/// Loading modules and mounting configfs, recording each first: in the
/// state file (`$state`; /dev/null on a host that keeps none) and on
/// stdout as `rec KIND A B`, which the lab undoes when the target stops.
/// `nocfs` ends the script with the reason it cannot run (exit 3).
const PRELUDE: &str = r#"PATH=$PATH:/usr/sbin:/sbin; state=$1; shift
rec() { echo "$*" >> "$state" || fail "cannot record in $state"; echo "rec $*"; }
nocfs() { echo "no configfs target support: $*" >&2; exit 3; }
fail() { echo "$*" >&2; exit 1; }
# A module not loaded yet is recorded before modprobe; at the end, every
# module that came with the setup (dependencies, and the backstores LIO
# loads by itself), for rmmod once the target is gone.
mods0=$(ls /sys/module)
trap 'rec modules $(ls /sys/module | while read -r m; do echo "$mods0" | grep -qx "$m" || echo "$m"; done)' EXIT
load() {
  [ -d "/sys/module/$(echo "$1" | tr - _)" ] && return 0
  rec modules "$(echo "$1" | tr - _)"
  modprobe -q "$1" 2>/dev/null
}
"#;

/// configfs mounted (recorded first) for the configfs targets.
const CONFIGFS: &str = r#"if ! grep -q " /sys/kernel/config configfs " /proc/mounts; then
  [ -d /sys/kernel/config ] || load configfs || nocfs "the kernel of $(uname -n) $(uname -r) has no configfs"
  rec configfs /sys/kernel/config
  mount -t configfs none /sys/kernel/config || nocfs "configfs does not mount on $(uname -n)"
fi
"#;

/// Lines of the setup's output: what it recorded, and the settings the
/// report shows (`settings TEXT`).
#[derive(Debug, Default, PartialEq)]
pub struct SetUp {
    pub records: Vec<[String; 3]>,
    pub settings: String,
}

fn parse(out: &str) -> SetUp {
    let mut s = SetUp::default();
    for l in out.lines() {
        if let Some(r) = l.strip_prefix("rec ") {
            let mut w = r.splitn(3, ' ');
            let mut next = || w.next().unwrap_or_default().trim().to_string();
            let (k, a, b) = (next(), next(), next());
            s.records.push([k, a, b]);
        } else if let Some(t) = l.strip_prefix("settings ") {
            s.settings = t.trim().to_string();
        }
    }
    s
}

/// The lines a setup recorded, undone newest first as a later run would
/// undo them from the state file (`state_file::UNDO_ONE`).
#[derive(Debug)]
struct Recorded {
    host: Host,
    records: Vec<[String; 3]>,
}

impl Undo for Recorded {
    fn undo(&self) -> anyhow::Result<()> {
        let mut first_err = None;
        // Modules last (as the state file's cleanup does): rmmod refuses
        // while the target still uses them.
        let (modules, rest): (Vec<&[String; 3]>, Vec<&[String; 3]>) = self.records.iter().rev().partition(|r| r[0] == "modules");
        for r in rest.into_iter().chain(modules) {
            let run = crate::command::run_undo_script(self.host.name(), crate::hosts::state_file::UNDO_ONE, &r[..], |a| self.host.command_with("sh", a));
            if let Err(e) = run {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Run `script` (after [`PRELUDE`] and configfs mounted) with `args` on
/// `host`; the kernel target it set up, named `name`, with its settings
/// (the script's `settings` line). Err is why it is unavailable; whatever
/// the script made before failing is undone.
pub fn set_up(host: &Host, name: &str, script: &str, args: &[String]) -> Result<TargetProcess, String> {
    set_up_after(host, name, &format!("{CONFIGFS}{script}"), args)
}

/// [`set_up`] for a kernel service that needs no configfs (knfsd): the
/// same recording (`rec`, `load`, `fail`, the modules it loaded) and undo.
pub fn set_up_after(host: &Host, name: &str, script: &str, args: &[String]) -> Result<TargetProcess, String> {
    let state = host.state_file().unwrap_or_else(|| "/dev/null".into());
    let text = format!("{PRELUDE}{script}");
    let mut a: Vec<&str> = vec!["-c", &text, "sh", &state];
    a.extend(args.iter().map(String::as_str));
    let out = host
        .command_with("sh", &a)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run the {name} setup on {}: {e}", host.name()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let set = parse(host.program_output(&stdout).unwrap_or(&stdout));
    let undo = Resource::owned(Recorded { host: host.clone(), records: set.records });
    let token = registry().create(undo, || Ok(())).map_err(|e| format!("{e:#}"))?.0;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let why = crate::command::last_lines(err.trim(), 2).replace('\n', "; ");
        let _ = registry().release(token);
        return Err(if why.is_empty() { format!("the {name} setup failed on {} ({})", host.name(), out.status) } else { why });
    }
    let mut p = TargetProcess::kernel(name, host, token);
    p.settings = Some(set.settings).filter(|s| !s.is_empty());
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_settings_are_read_from_the_output() {
        let out = "rec modules target_core_mod\nrec lio iqn.x:y fileio_7700/bwlab\nnoise\nsettings kernel 6.1.0; fileio\n";
        let s = parse(out);
        assert_eq!(s.records, vec![["modules".to_string(), "target_core_mod".into(), String::new()], ["lio".into(), "iqn.x:y".into(), "fileio_7700/bwlab".into()]]);
        assert_eq!(s.settings, "kernel 6.1.0; fileio");
    }
}
