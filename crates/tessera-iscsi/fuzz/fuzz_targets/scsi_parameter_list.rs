//! Fuzzes the parameter-list parsers (UNMAP, PERSISTENT RESERVE OUT, MODE
//! SELECT 6/10, EXTENDED COPY): the first byte picks the parser.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    tessera_iscsi::scsi::fuzzing::parameter_list(data);
});
