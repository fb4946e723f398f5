//! `blockwire generate`: man pages and shell completions from the CLI
//! definition itself, so they never drift from `--help` (`make install`
//! and the Debian package run it; hidden from `--help`).

use clap::Subcommand;
use std::path::PathBuf;

#[derive(Subcommand)]
pub enum GenerateCmd {
    /// Write blockwire.1 and one page per subcommand (blockwire-serve.1, ...) to DIR.
    Man { dir: PathBuf },
    /// Print the completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

/// `cli`: the definition of the whole command line (main.rs's, passed in).
pub fn run(cmd: GenerateCmd, cli: clap::Command) -> anyhow::Result<()> {
    match cmd {
        GenerateCmd::Man { dir } => {
            std::fs::create_dir_all(&dir)?;
            clap_mangen::generate_to(cli, &dir)?;
        }
        GenerateCmd::Completions { shell } => {
            let mut cli = cli;
            clap_complete::generate(shell, &mut cli, "blockwire", &mut std::io::stdout());
        }
    }
    Ok(())
}
