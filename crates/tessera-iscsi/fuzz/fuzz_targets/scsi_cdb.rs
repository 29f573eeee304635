//! Fuzzes CDB decoding: every operation code, field and usage-mask check
//! (and the data-out length each decoded CDB announces).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::scsi::fuzzing::cdb(data);
});
