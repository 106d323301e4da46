//! The gRPC example's generated code (examples/proto/echo.rs) is what tonic-prost-build makes
//! from proto/echo.proto, compiled by protox (no protoc). Regenerate with
//! `LBKIT_BLESS=1 cargo test -p lbkit-tower --test codegen`.

use std::path::Path;

fn generate(out: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile([root.join("proto/echo.proto")], [root.join("proto")])
        .expect("the proto compiles");
    tonic_prost_build::configure()
        .out_dir(out)
        .compile_fds(fds)
        .expect("code is generated");
    std::fs::read_to_string(out.join("echo.rs")).expect("echo.rs is written")
}

/// The text without whitespace: rustfmt may lay the checked-in copy out differently.
fn tokens(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

#[test]
fn generated_grpc_code_is_up_to_date() {
    let out = tempfile::Builder::new()
        .prefix("lbkit-tower-codegen-")
        .tempdir()
        .unwrap();
    let fresh = generate(out.path());
    drop(out);
    let checked_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/proto/echo.rs");
    if std::env::var_os("LBKIT_BLESS").is_some() {
        std::fs::write(&checked_in, &fresh).unwrap();
    }
    let current = std::fs::read_to_string(&checked_in).unwrap_or_default();
    assert!(
        tokens(&current) == tokens(&fresh),
        "examples/proto/echo.rs is stale: run LBKIT_BLESS=1 cargo test -p lbkit-tower --test codegen"
    );
}
