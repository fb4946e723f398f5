// The verbs that post and poll are static inline functions in
// <infiniband/verbs.h> (they call through the provider's ops table), so
// they cannot be linked from Rust directly: src/shim.c wraps them, and
// keeps every rdma-core struct layout on the C side.
fn main() {
    println!("cargo:rerun-if-changed=src/shim.c");
    cc::Build::new().file("src/shim.c").warnings(true).compile("bw_rdma_shim");
    println!("cargo:rustc-link-lib=rdmacm");
    println!("cargo:rustc-link-lib=ibverbs");
}
