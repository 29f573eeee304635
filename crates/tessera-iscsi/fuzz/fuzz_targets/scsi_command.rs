//! Fuzzes whole SCSI commands (CDB and data-out) run against an in-memory
//! logical unit.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::scsi::fuzzing::command(data);
});
