//! Compiles the BPF datapath (bpf/mpls.bpf.c) with clang into
//! OUT_DIR/mpls.bpf.o, which src/bpf.rs embeds. Without clang (or the
//! libbpf headers) the crate still builds, and `blockwire router --datapath
//! bpf` says what to install; `make deps` installs both (DEB_PACKAGES).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/mpls.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=BLOCKWIRE_CLANG");
    println!("cargo::rustc-check-cfg=cfg(bpf_object)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("mpls.bpf.o");
    let clang = std::env::var("BLOCKWIRE_CLANG").unwrap_or_else(|_| "clang".into());
    // linux/bpf.h includes asm/types.h, which Debian keeps per architecture.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let result = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .output();
    match result {
        Ok(o) if o.status.success() => println!("cargo:rustc-cfg=bpf_object"),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            // A compile error in our own program must not pass silently.
            if err.contains("error:") && !err.contains("file not found") {
                panic!("{clang} failed on {src}:\n{err}");
            }
            println!(
                "cargo:warning=the BPF datapath is not built ({clang}: {}): install clang and libbpf-dev",
                err.lines().next().unwrap_or("").trim()
            );
        }
        Err(e) => println!(
            "cargo:warning=the BPF datapath is not built ({clang}: {e}): install clang and libbpf-dev"
        ),
    }
}
