//! Generates the CSI gRPC services from the vendored spec (proto/csi/csi.proto,
//! CSI v1.12.0, unchanged, with its licence beside it). Needs `protoc` and the
//! protobuf well-known types (Debian: protobuf-compiler, libprotobuf-dev), which
//! scripts/install-deps.sh installs.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi/csi.proto");
    tonic_prost_build::configure()
        .build_client(false)
        .compile_protos(&["proto/csi/csi.proto"], &["proto/csi", "/usr/include"])?;
    Ok(())
}
