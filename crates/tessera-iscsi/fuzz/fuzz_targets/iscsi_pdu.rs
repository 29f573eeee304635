//! Fuzzes the PDU decoder: the first byte picks the digests, the rest is PDUs;
//! each decoded PDU must survive a re-encoding unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::fuzzing::pdu(data);
});
