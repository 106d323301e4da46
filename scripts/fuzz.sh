#!/usr/bin/env bash
# Fuzz lbkit's parsers with cargo-fuzz on the stable toolchain (`--sanitizer none`: libFuzzer's
# coverage guidance without AddressSanitizer, which needs nightly; the code under test has no
# `unsafe`, so what a sanitizer adds here is little).
#
#   scripts/fuzz.sh --runs 1000000 [TARGET...]   # the documented run (RELIABILITY.md)
#   scripts/fuzz.sh --seconds 15 [TARGET...]     # the short run CI does
#
# Installs cargo-fuzz (pinned) when missing, builds every target once, then runs each target
# over a scratch corpus seeded from fuzz/corpus/TARGET (the committed corpus is only read;
# `--keep` merges what the run found back into it). Prints a Markdown table: runs, seconds,
# executions per second, coverage. A failing input stops the run with exit status 1; it is in
# fuzz/artifacts/TARGET/ — fix the bug, then copy the input to fuzz/regressions/TARGET/ so the
# normal test suite (crates/lbkit-fuzz/tests/corpora.rs) replays it for ever.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
limit=(-runs=1000000)
keep=false
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) limit=("-runs=$2"); shift 2 ;;
        --seconds) limit=("-max_total_time=$2"); shift 2 ;;
        --keep) keep=true; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done

# libfuzzer-sys builds libFuzzer from C++.
if ! command -v c++ >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "fuzz.sh: installing g++ (libFuzzer is C++)" >&2
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends g++ >&2
fi
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "fuzz.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked >&2
fi

cd fuzz
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi
echo "fuzz.sh: building ${#targets[@]} targets (release, instrumented)" >&2
cargo fuzz build -s none >&2

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "| target | runs | seconds | exec/s | coverage (edges) | corpus |"
echo "|---|---|---|---|---|---|"
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t"
    log="$scratch/$t.log"
    # The scratch directory first: libFuzzer writes what it finds into the first corpus.
    if ! cargo fuzz run -s none "$t" "$scratch/$t" "corpus/$t" -- \
        "${limit[@]}" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 >"$log" 2>&1; then
        tail -40 "$log" >&2
        echo "fuzz.sh: $t FAILED; the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
    secs=$(grep -oE 'Done [0-9]+ runs in [0-9]+ second' "$log" | grep -oE 'in [0-9]+' | grep -oE '[0-9]+' || true)
    [ -n "$secs" ] || secs=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' | awk -v r="$runs" '$1>0{printf "%d", r/$1}')
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+' || echo '?')
    corp=$(find "$scratch/$t" "corpus/$t" -type f | wc -l)
    echo "| \`$t\` | $runs | ${secs:-?} | $rate | $cov | $corp |"
    if $keep; then
        # What the run found joins the corpus, minimised to the inputs that add coverage.
        cp -n "$scratch/$t"/* "corpus/$t/" 2>/dev/null || true
        cargo fuzz cmin -s none "$t" "corpus/$t" >/dev/null 2>&1 || true
    fi
done
