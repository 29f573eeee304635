//! Fuzzes option haggling: client flags, then options, then (once an export
//! is chosen) requests, through the decoders and state machine the server
//! runs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_nbd::fuzzing::handshake(data);
});
