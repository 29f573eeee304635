//! Fuzzes the full-feature phase: CmdSN window, R2T and Data-Out
//! checks, Data-In splitting, task management, text and logout.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::fuzzing::full_feature(data);
});
