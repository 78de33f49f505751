//! Compiles `proto/` (at the workspace root) into Rust with protox, a pure
//! Rust protobuf compiler, so no system `protoc` is needed.

use std::path::PathBuf;

const PROTO_FILE: &str = "gantry/worker/v1/worker.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    println!("cargo:rerun-if-changed={}", proto_root.join(PROTO_FILE).display());

    let descriptors = protox::compile([PROTO_FILE], [&proto_root])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
