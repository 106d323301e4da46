//! Every fuzz target's corpus (`fuzz/corpus/<target>/`: the hand-made seeds and what the
//! fuzzer kept) and its findings (`fuzz/regressions/<target>/`: inputs that once failed, kept
//! after the fix) run through the target's check in the normal test suite, on stable, without
//! cargo-fuzz.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_and_finding_passes_its_check() {
    let fuzz = fuzz_dir();
    for &(target, check) in lbkit_fuzz::TARGETS {
        let seeds = inputs(&fuzz.join("corpus").join(target));
        assert!(!seeds.is_empty(), "{target}: no seed corpus");
        let findings = inputs(&fuzz.join("regressions").join(target));
        for file in seeds.iter().chain(&findings) {
            let data = std::fs::read(file).expect("readable input");
            let run = std::panic::catch_unwind(|| check(&data));
            assert!(run.is_ok(), "{target}: {} fails its check", file.display());
        }
    }
}

#[test]
fn every_target_has_a_fuzz_binary() {
    let fuzz = fuzz_dir();
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for &(target, _) in lbkit_fuzz::TARGETS {
        let source = fuzz.join("fuzz_targets").join(format!("{target}.rs"));
        let text = std::fs::read_to_string(&source)
            .unwrap_or_else(|_| panic!("{} missing", source.display()));
        assert!(
            text.contains(&format!("lbkit_fuzz::{target}(")),
            "{} does not call lbkit_fuzz::{target}",
            source.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{target}\"")),
            "fuzz/Cargo.toml has no [[bin]] {target}"
        );
    }
}
