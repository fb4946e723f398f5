//! Compiles the AF_XDP redirect program (bpf/xsk_redirect.bpf.c) with clang
//! into OUT_DIR/xsk_redirect.bpf.o, which src/xdp.rs embeds. Without clang
//! (or the libbpf headers) the crate still builds and AF_XDP reports itself
//! unavailable, so `auto` datapaths fall back to AF_PACKET; `make deps`
//! installs both (DEB_PACKAGES).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = "bpf/xsk_redirect.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=BLOCKWIRE_CLANG");
    println!("cargo::rustc-check-cfg=cfg(xdp_object)");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("xsk_redirect.bpf.o");
    let clang = std::env::var("BLOCKWIRE_CLANG").unwrap_or_else(|_| "clang".into());
    // linux/bpf.h includes asm/types.h, which Debian keeps per architecture.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let result = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I/usr/include/{arch}-linux-gnu"))
        .args(["-c", src, "-o"])
        .arg(&out)
        .output();
    let missing = match result {
        Ok(o) if o.status.success() => {
            println!("cargo:rustc-cfg=xdp_object");
            return;
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            // A compile error in our own program must not pass silently.
            if err.contains("error:") && !err.contains("file not found") {
                panic!("{clang} failed on {src}:\n{err}");
            }
            err.lines().next().unwrap_or("").trim().to_string()
        }
        Err(e) => e.to_string(),
    };
    println!("cargo:warning=AF_XDP is not built ({clang}: {missing}): install clang and libbpf-dev");
}
