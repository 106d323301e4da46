//! Running the `lbkit` binary in the black-box tests.
#![allow(dead_code)] // not every test binary uses both

use std::process::{Command, Output};

/// `lbkit ARGS`, its status and output.
pub fn lbkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lbkit"))
        .args(args)
        .output()
        .expect("run lbkit")
}

/// `lbkit ARGS`, which must succeed: its standard output.
pub fn ok(args: &[&str]) -> String {
    let out = lbkit(args);
    assert!(
        out.status.success(),
        "lbkit {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}
