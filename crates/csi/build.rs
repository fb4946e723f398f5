//! The CSI messages and services from the specification's csi.proto
//! (vendored in proto/, see proto/README.md): parsed by protox, which
//! carries the protobuf well-known types, so no protoc is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds = protox::compile(["proto/csi.proto"], ["proto"])?;
    // Default stubs: the services' methods this plugin does not offer
    // (volume health, group snapshots) answer UNIMPLEMENTED, as CSI asks.
    tonic_prost_build::configure().build_client(true).build_server(true).generate_default_stubs(true).compile_fds(fds)?;
    Ok(())
}
