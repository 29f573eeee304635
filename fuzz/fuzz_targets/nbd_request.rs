//! Fuzzes the transmission request parser and its checks: the first byte
//! picks the session (read-only, structured replies, base:allocation), the
//! rest is request headers and write payloads.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_nbd::fuzzing::requests(data);
});
