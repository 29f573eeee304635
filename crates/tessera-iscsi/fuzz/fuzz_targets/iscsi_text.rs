//! Fuzzes text key parsing and the negotiation of every operational key.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::fuzzing::text_keys(data);
});
