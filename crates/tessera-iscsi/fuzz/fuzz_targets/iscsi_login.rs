//! Fuzzes the login state machine (CHAP, access lists, stages) with Login
//! Requests, then the full-feature phase with what follows a completed login.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::fuzzing::login(data);
});
