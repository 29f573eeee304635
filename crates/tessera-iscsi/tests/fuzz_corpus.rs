//! Replays the cargo-fuzz corpus (`fuzz/corpus/<target>/` of this crate)
//! through the same entry points the fuzz targets call, on stable Rust,
//! plus seeded mutations of every corpus file (bit flips, truncations,
//! splices, extreme 32-bit fields), so the parsers are exercised on every
//! `cargo test` even without nightly. The SCSI targets' corpus
//! (`fuzz/corpus/scsi_*`) goes through `tessera_iscsi::scsi::fuzzing` the
//! same way, with fewer mutations (CDBs and parameter lists) or none
//! (whole commands, each of which runs a unit).

use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use tessera_iscsi::{fuzzing, scsi};

/// Mutated variants tried per corpus file.
const MUTATIONS_PER_FILE: usize = 10_000;
/// Mutated variants per file for the SCSI targets.
const SCSI_MUTATIONS_PER_FILE: usize = 1_000;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .map(|p| {
            let data = std::fs::read(&p).expect("corpus file");
            (p, data)
        })
        .collect();
    files.sort();
    files
}

fn mutate(rng: &mut rand::rngs::StdRng, data: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    match rng.gen_range(0..4) {
        0 if !out.is_empty() => {
            for _ in 0..rng.gen_range(1..8) {
                let at = rng.gen_range(0..out.len());
                out[at] ^= 1 << rng.gen_range(0..8);
            }
        }
        1 if !out.is_empty() => out.truncate(rng.gen_range(0..out.len())),
        2 if !out.is_empty() => {
            let at = rng.gen_range(0..out.len());
            out.splice(at..at, other.iter().copied());
        }
        _ => {
            if out.len() >= 4 {
                let at = rng.gen_range(0..out.len() - 3);
                let v: u32 = [0, 1, u32::MAX, 0x8000_0000, 512, 8192][rng.gen_range(0..6)];
                out[at..at + 4].copy_from_slice(&v.to_be_bytes());
            }
        }
    }
    out
}

fn replay(target: &str, run: fn(&[u8])) {
    replay_with(target, run, MUTATIONS_PER_FILE);
}

fn replay_with(target: &str, run: fn(&[u8]), mutations: usize) {
    let files = corpus(target);
    assert!(
        files.len() >= 5,
        "corpus of {target} has {} files",
        files.len()
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x6953_4353);
    for (i, (path, data)) in files.iter().enumerate() {
        run(data);
        let other = &files[(i + 1) % files.len()].1;
        for _ in 0..mutations {
            let mutated = mutate(&mut rng, data, other);
            let outcome = std::panic::catch_unwind(|| run(&mutated));
            assert!(
                outcome.is_ok(),
                "{target}: a mutation of {} panicked; input {:02x?}",
                path.display(),
                mutated
            );
        }
    }
}

#[test]
fn pdu_corpus_replays_clean() {
    replay("iscsi_pdu", fuzzing::pdu);
}

#[test]
fn login_corpus_replays_clean() {
    replay("iscsi_login", fuzzing::login);
}

#[test]
fn text_corpus_replays_clean() {
    replay("iscsi_text", fuzzing::text_keys);
}

#[test]
fn session_corpus_replays_clean() {
    replay("iscsi_session", fuzzing::full_feature);
}

#[test]
fn scsi_cdb_corpus_replays_clean() {
    replay_with("scsi_cdb", scsi::fuzzing::cdb, SCSI_MUTATIONS_PER_FILE);
}

#[test]
fn scsi_parameter_list_corpus_replays_clean() {
    replay_with(
        "scsi_parameter_list",
        scsi::fuzzing::parameter_list,
        SCSI_MUTATIONS_PER_FILE,
    );
}

#[test]
fn scsi_command_corpus_replays_clean() {
    replay_with(
        "scsi_command",
        scsi::fuzzing::command,
        SCSI_MUTATIONS_PER_FILE,
    );
}
