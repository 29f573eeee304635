//! Replays the SCSI fuzz corpus on stable Rust: every input under
//! `tests/scsi_corpus/<entry point>/` goes through the entry point of the
//! same name in `tessera_iscsi::scsi::fuzzing` (what the cargo-fuzz targets
//! call), so an input that once crashed stays a test case. Also runs a
//! bounded stream of generated inputs through each entry point.

use std::path::Path;
use tessera_iscsi::scsi::fuzzing;

fn replay(kind: &str, entry: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scsi_corpus")
        .join(kind);
    let mut count = 0;
    for file in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = file.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        entry(&data);
        count += 1;
    }
    count
}

#[test]
fn corpus_replays_without_panics() {
    assert!(replay("cdb", fuzzing::cdb) >= 10);
    assert!(replay("parameter_list", fuzzing::parameter_list) >= 8);
    assert!(replay("command", fuzzing::command) >= 8);
}

#[test]
fn generated_inputs_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5C51);
    for _ in 0..3000 {
        let len = rng.gen_range(0..96);
        let mut data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        fuzzing::cdb(&data);
        fuzzing::parameter_list(&data);
        // Mostly real operation codes, so execution gets past decoding.
        if let Some(first) = data.first_mut() {
            let codes = tessera_iscsi::scsi::cdb::COMMANDS;
            *first = codes[rng.gen_range(0..codes.len())].opcode;
        }
        fuzzing::command(&data);
    }
}
