//! Round trips of every message and robustness of the decoder against any
//! byte string: what a peer sends can be wrong, never fatal.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tessera_types::checksum::{crc32c, crc32c_append};
use tessera_types::{ComponentId, Epoch, HostId, Lba, VolumeId};
use tessera_wire::{
    decode_frame, encode_frame, ComponentRef, Extent, ExtentKind, Frame, Message, MessageKind,
    QueueClass, Request, Response, VersionRange, WireError, WireErrorKind, WireVersion,
    HEADER_BYTES, MAX_FRAME_BYTES,
};

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9._-]{0,63}"
}

fn host() -> impl Strategy<Value = HostId> {
    name().prop_map(|n| HostId::new(n).unwrap())
}

fn volume() -> impl Strategy<Value = VolumeId> {
    name().prop_map(|n| VolumeId::new(n).unwrap())
}

fn component() -> impl Strategy<Value = ComponentRef> {
    (volume(), any::<u64>()).prop_map(|(volume, id)| ComponentRef {
        volume,
        id: ComponentId(id),
    })
}

/// Small buffers and buffers past the zero-copy threshold.
fn data() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::collection::vec(any::<u8>(), 1024..9000),
    ]
    .prop_map(Bytes::from)
}

fn request() -> impl Strategy<Value = Request> {
    let lba = any::<u64>().prop_map(Lba);
    let epoch = any::<u64>().prop_map(Epoch);
    prop_oneof![
        (any::<u16>(), any::<u16>(), host()).prop_map(|(min, max, host)| Request::Hello {
            versions: VersionRange { min, max },
            host
        }),
        Just(Request::Ping),
        (component(), any::<u64>(), any::<u64>()).prop_map(|(component, s, r)| {
            Request::CreateComponent {
                component,
                size_bytes: s,
                reserve_bytes: r,
            }
        }),
        component().prop_map(|component| Request::DeleteComponent { component }),
        (component(), any::<u64>()).prop_map(|(component, size_bytes)| {
            Request::ResizeComponent {
                component,
                size_bytes,
            }
        }),
        (component(), lba.clone(), epoch.clone(), data()).prop_map(
            |(component, lba, epoch, data)| Request::Write {
                component,
                lba,
                epoch,
                data
            }
        ),
        (component(), lba.clone(), any::<u32>()).prop_map(|(component, lba, blocks)| {
            Request::Read {
                component,
                lba,
                blocks,
            }
        }),
        (component(), lba.clone(), any::<u64>(), epoch.clone()).prop_map(
            |(component, lba, blocks, epoch)| Request::Unmap {
                component,
                lba,
                blocks,
                epoch
            }
        ),
        (component(), lba.clone(), any::<u64>(), epoch.clone()).prop_map(
            |(component, lba, blocks, epoch)| Request::WriteZeroes {
                component,
                lba,
                blocks,
                epoch
            }
        ),
        component().prop_map(|component| Request::Flush { component }),
        (component(), epoch).prop_map(|(component, epoch)| Request::Fence { component, epoch }),
        (component(), lba, any::<u64>()).prop_map(|(component, from, blocks)| {
            Request::Allocated {
                component,
                from,
                blocks,
            }
        }),
        component().prop_map(|component| Request::ComponentStatus { component }),
        component().prop_map(|component| Request::HeldSpace { component }),
        (
            component(),
            any::<u64>(),
            component(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(source, s, target, t, blocks, e)| Request::CloneBlocks {
                source,
                source_lba: Lba(s),
                target,
                target_lba: Lba(t),
                blocks,
                epoch: Epoch(e),
            }),
        (component(), any::<u64>(), any::<u64>()).prop_map(|(component, s, e)| {
            Request::SnapshotComponent {
                component,
                snapshot: ComponentId(s),
                epoch: Epoch(e),
            }
        }),
        (component(), any::<u64>(), any::<u64>()).prop_map(|(snapshot, c, e)| {
            Request::CloneSnapshot {
                snapshot,
                clone: ComponentId(c),
                epoch: Epoch(e),
            }
        }),
        (component(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(
            |(component, base, from, blocks)| Request::Changed {
                component,
                base: ComponentId(base),
                from: Lba(from),
                blocks,
            }
        ),
        (volume(), any::<u64>(), any::<u32>()).prop_map(|(volume, offset, len)| {
            Request::VolumeRead {
                volume,
                offset,
                len,
            }
        }),
        (volume(), any::<u64>(), data(), any::<bool>()).prop_map(|(volume, offset, data, fua)| {
            Request::VolumeWrite {
                volume,
                offset,
                data,
                fua,
            }
        }),
        volume().prop_map(|volume| Request::VolumeFlush { volume }),
        (volume(), any::<u64>(), any::<u64>()).prop_map(|(volume, offset, len)| {
            Request::VolumeUnmap {
                volume,
                offset,
                len,
            }
        }),
        (volume(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
            |(volume, offset, len, may_unmap)| Request::VolumeWriteZeroes {
                volume,
                offset,
                len,
                may_unmap
            }
        ),
        (volume(), any::<u64>(), data(), data()).prop_map(|(volume, offset, expected, new)| {
            Request::VolumeCompareAndWrite {
                volume,
                offset,
                expected,
                new,
            }
        }),
        (volume(), any::<u64>(), any::<u64>()).prop_map(|(volume, offset, len)| {
            Request::VolumeBlockStatus {
                volume,
                offset,
                len,
            }
        }),
        (volume(), any::<u64>(), any::<u64>(), any::<u32>()).prop_map(
            |(volume, component, lba, blocks)| Request::VolumeRepairCopy {
                volume,
                component: ComponentId(component),
                lba: Lba(lba),
                blocks,
            }
        ),
        (volume(), "[a-z0-9._-]{1,64}", any::<u64>(), any::<u64>()).prop_map(
            |(volume, name, snapshot, created_ms)| Request::VolumeSnapshot {
                volume,
                name,
                snapshot,
                created_ms,
            }
        ),
        (volume(), any::<u64>(), any::<u64>()).prop_map(|(volume, hold, ttl_ms)| {
            Request::VolumeHoldWrites {
                volume,
                hold,
                ttl_ms,
            }
        }),
        (volume(), any::<u64>())
            .prop_map(|(volume, hold)| Request::VolumeReleaseWrites { volume, hold }),
        (
            volume(),
            any::<u64>(),
            "[a-z0-9._-]{1,64}",
            any::<u64>(),
            any::<u64>()
        )
            .prop_map(|(volume, hold, name, snapshot, created_ms)| {
                Request::VolumeSnapshotHeld {
                    volume,
                    hold,
                    name,
                    snapshot,
                    created_ms,
                }
            }),
    ]
}

fn error_kind() -> impl Strategy<Value = WireErrorKind> {
    prop_oneof![
        any::<u64>().prop_map(|e| WireErrorKind::StaleEpoch { highest: Epoch(e) }),
        any::<u64>().prop_map(|l| WireErrorKind::Checksum { lba: Lba(l) }),
        Just(WireErrorKind::NoSpace),
        Just(WireErrorKind::NotFound),
        Just(WireErrorKind::OutOfRange),
        any::<u64>().prop_map(|offset| WireErrorKind::Miscompare { offset }),
        Just(WireErrorKind::Io),
        Just(WireErrorKind::Unavailable),
        Just(WireErrorKind::NotOwner),
        Just(WireErrorKind::ReadOnly),
        Just(WireErrorKind::Invalid),
        (any::<u16>(), any::<u16>()).prop_map(|(min, max)| WireErrorKind::NoCommonVersion {
            supported: VersionRange { min, max }
        }),
        Just(WireErrorKind::NotColocated),
    ]
}

fn response() -> impl Strategy<Value = Response> {
    let extent_kind = prop_oneof![
        Just(ExtentKind::Data),
        Just(ExtentKind::Zero),
        Just(ExtentKind::Hole)
    ];
    prop_oneof![
        host().prop_map(|host| Response::HelloOk {
            version: WireVersion::CURRENT,
            host
        }),
        Just(Response::Pong),
        Just(Response::Ok),
        data().prop_map(Response::Data),
        proptest::collection::vec((any::<u64>().prop_map(Lba), any::<u64>()), 0..40)
            .prop_map(Response::Ranges),
        proptest::collection::vec(
            (any::<u64>(), any::<u64>(), extent_kind).prop_map(|(offset, len, kind)| Extent {
                offset,
                len,
                kind
            }),
            0..40
        )
        .prop_map(Response::Extents),
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(s, e, a, p)| {
            Response::Status {
                size_bytes: s,
                epoch: Epoch(e),
                allocated_bytes: a,
                physical_bytes: p,
            }
        }),
        (any::<u64>(), any::<u64>()).prop_map(|(a, s)| Response::Held {
            alone_bytes: a,
            shared_bytes: s,
        }),
        (error_kind(), ".{0,200}").prop_map(|(kind, message)| Response::Error { kind, message }),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        request().prop_map(Message::Request),
        response().prop_map(Message::Response),
    ]
}

fn class() -> impl Strategy<Value = QueueClass> {
    prop_oneof![Just(QueueClass::Guest), Just(QueueClass::Resync)]
}

/// A frame with a valid header and CRC around an arbitrary payload, so that
/// the payload decoder itself is exercised (random bytes rarely pass the CRC).
fn frame_around(kind: u16, version: u16, class: u8, payload: &[u8]) -> BytesMut {
    let mut header = [0u8; HEADER_BYTES];
    header[0..4].copy_from_slice(b"TSWR");
    header[4..6].copy_from_slice(&version.to_le_bytes());
    header[6..8].copy_from_slice(&kind.to_le_bytes());
    header[8..16].copy_from_slice(&7u64.to_le_bytes());
    header[16] = class;
    header[20..24].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    // The CRC32C itself is checked against a bitwise reference where it
    // is computed (`tessera_types::checksum`); here it only frames bytes.
    let crc = crc32c_append(crc32c(&header[..24]), payload);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
    let mut out = BytesMut::from(&header[..]);
    out.extend_from_slice(payload);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn every_message_round_trips(message in message(), id in any::<u64>(), class in class()) {
        let encoded = encode_frame(WireVersion::CURRENT, id, class, &message).unwrap();
        let mut buf = BytesMut::from(&encoded.to_bytes()[..]);
        prop_assert_eq!(buf.len(), encoded.len());
        let frame = decode_frame(&mut buf).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        prop_assert_eq!(frame.header.request_id, id);
        prop_assert_eq!(frame.header.class, class);
        prop_assert_eq!(frame.header.version, WireVersion::CURRENT.number());
        prop_assert_eq!(frame.header.kind, message.kind());
        prop_assert_eq!(frame.message, message);
    }

    #[test]
    fn frames_decode_from_any_split(message in message(), cut in any::<prop::sample::Index>()) {
        // A socket delivers a frame in arbitrary pieces: nothing is consumed
        // until all of it is there.
        let bytes = encode_frame(WireVersion::CURRENT, 1, QueueClass::Guest, &message)
            .unwrap()
            .to_bytes();
        let at = cut.index(bytes.len());
        let mut buf = BytesMut::from(&bytes[..at]);
        prop_assert_eq!(decode_frame(&mut buf).unwrap(), None);
        prop_assert_eq!(buf.len(), at);
        buf.extend_from_slice(&bytes[at..]);
        let frame: Frame = decode_frame(&mut buf).unwrap().unwrap();
        prop_assert_eq!(frame.message, message);
    }

    #[test]
    fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = decode_frame(&mut buf);
    }

    #[test]
    fn any_payload_decodes_or_fails_cleanly(
        kind in prop_oneof![0u16..0x40, 0x80u16..0x100],
        // Every version this build speaks, and one on either side.
        version in 0u16..=WireVersion::CURRENT.number() + 1,
        class in 0u8..3,
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let mut buf = frame_around(kind, version, class, &payload);
        match decode_frame(&mut buf) {
            Ok(Some(frame)) => {
                // Whatever decodes must encode back to the same bytes.
                let again = encode_frame(
                    WireVersion::from_number(frame.header.version).unwrap_or(WireVersion::CURRENT),
                    frame.header.request_id,
                    frame.header.class,
                    &frame.message,
                );
                if (1..=WireVersion::CURRENT.number()).contains(&frame.header.version) {
                    prop_assert_eq!(&again.unwrap().to_bytes()[HEADER_BYTES..], &payload[..]);
                }
            }
            Ok(None) => prop_assert!(false, "a whole frame was reported incomplete"),
            Err(_) => {}
        }
    }

    #[test]
    fn corrupted_frames_are_refused(message in message(), at in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let bytes = encode_frame(WireVersion::CURRENT, 3, QueueClass::Resync, &message)
            .unwrap()
            .to_bytes();
        let mut corrupt = BytesMut::from(&bytes[..]);
        let i = at.index(corrupt.len());
        corrupt[i] ^= flip;
        // A flipped length may make the frame look incomplete; anything else
        // must be caught by the magic or the CRC.
        match decode_frame(&mut corrupt) {
            Ok(None) => prop_assert!((20..24).contains(&i)),
            Ok(Some(_)) => prop_assert!(false, "corrupted byte {} went unnoticed", i),
            Err(_) => {}
        }
    }
}

#[test]
fn oversized_length_is_refused_before_buffering() {
    let mut buf = frame_around(MessageKind::Ping.number(), 1, 0, &[]);
    buf[20..24].copy_from_slice(&(MAX_FRAME_BYTES as u32).to_le_bytes());
    assert!(matches!(
        decode_frame(&mut buf),
        Err(WireError::FrameTooLarge { .. })
    ));
}

#[test]
fn forged_list_count_is_refused_without_allocating() {
    let mut payload = Vec::new();
    payload.extend_from_slice(&u32::MAX.to_le_bytes());
    let mut buf = frame_around(MessageKind::Ranges.number(), 1, 0, &payload);
    assert!(matches!(
        decode_frame(&mut buf),
        Err(WireError::Truncated { .. })
    ));
}

#[test]
fn unknown_version_is_refused_except_in_the_handshake() {
    let ping = frame_around(MessageKind::Ping.number(), 9, 0, &[]);
    assert!(matches!(
        decode_frame(&mut ping.clone()),
        Err(WireError::UnsupportedVersion { version: 9, .. })
    ));
    let mut payload = Vec::new();
    payload.extend_from_slice(&9u16.to_le_bytes());
    payload.extend_from_slice(&12u16.to_le_bytes());
    payload.push(2);
    payload.extend_from_slice(b"h9");
    let mut hello = frame_around(MessageKind::Hello.number(), 9, 0, &payload);
    let frame = decode_frame(&mut hello).unwrap().unwrap();
    assert_eq!(
        frame.message,
        Message::Request(Request::Hello {
            versions: VersionRange { min: 9, max: 12 },
            host: HostId::new("h9").unwrap(),
        })
    );
}

#[test]
fn large_data_is_not_copied_by_the_encoder() {
    let data = Bytes::from(vec![0xabu8; 1 << 20]);
    let message = Message::Request(Request::Write {
        component: ComponentRef {
            volume: VolumeId::new("vol").unwrap(),
            id: ComponentId(1),
        },
        lba: Lba(0),
        epoch: Epoch(1),
        data: data.clone(),
    });
    let encoded = encode_frame(WireVersion::CURRENT, 1, QueueClass::Guest, &message).unwrap();
    assert!(
        encoded
            .chunks()
            .iter()
            .any(|c| c.as_ptr() == data.as_ptr() && c.len() == data.len()),
        "the 1 MiB buffer should travel as its own chunk"
    );
    // And the decoder hands it out as a slice of the received frame.
    let mut buf = BytesMut::from(&encoded.to_bytes()[..]);
    let base = buf.as_ptr() as usize;
    let end = base + buf.len();
    let frame = decode_frame(&mut buf).unwrap().unwrap();
    let Message::Request(Request::Write { data: got, .. }) = frame.message else {
        panic!("decoded {:?}", frame.header.kind);
    };
    let at = got.as_ptr() as usize;
    assert!(
        at >= base && at + got.len() <= end,
        "decoder copied the data"
    );
}

#[test]
fn long_error_messages_are_cut_not_refused() {
    let message = Message::Response(Response::error(WireErrorKind::Io, "é".repeat(5000)));
    let bytes = encode_frame(WireVersion::CURRENT, 1, QueueClass::Guest, &message)
        .unwrap()
        .to_bytes();
    let frame = decode_frame(&mut BytesMut::from(&bytes[..]))
        .unwrap()
        .unwrap();
    let Message::Response(Response::Error { message, .. }) = frame.message else {
        panic!("not an error");
    };
    assert!(message.len() <= tessera_wire::ERROR_MESSAGE_BYTES_MAX);
    assert!(message.chars().all(|c| c == 'é'));
}

#[test]
fn too_large_message_is_refused_when_encoding() {
    let message = Message::Response(Response::Data(Bytes::from(vec![0u8; MAX_FRAME_BYTES])));
    assert!(matches!(
        encode_frame(WireVersion::CURRENT, 1, QueueClass::Guest, &message),
        Err(WireError::FrameTooLarge { .. })
    ));
}

#[test]
fn requests_name_what_they_address() {
    let c = ComponentRef {
        volume: VolumeId::new("v1").unwrap(),
        id: ComponentId(4),
    };
    let write = Request::Fence {
        component: c.clone(),
        epoch: Epoch(2),
    };
    assert_eq!(write.component(), Some(&c));
    assert_eq!(write.volume(), Some(&c.volume));
    let forwarded = Request::VolumeFlush {
        volume: VolumeId::new("v2").unwrap(),
    };
    assert_eq!(forwarded.component(), None);
    assert_eq!(forwarded.volume().map(VolumeId::as_str), Some("v2"));
    assert_eq!(Request::Ping.volume(), None);
    assert_eq!(
        Response::error(WireErrorKind::NotOwner, "moved").error_kind(),
        Some(WireErrorKind::NotOwner)
    );
    assert_eq!(Response::Ok.error_kind(), None);
}

#[test]
fn compare_and_write_with_two_largest_buffers_fits_one_frame() {
    let message = Message::Request(Request::VolumeCompareAndWrite {
        volume: VolumeId::new("v").unwrap(),
        offset: 0,
        expected: Bytes::from(vec![1u8; tessera_wire::MAX_DATA_BYTES]),
        new: Bytes::from(vec![2u8; tessera_wire::MAX_DATA_BYTES]),
    });
    let encoded = encode_frame(WireVersion::CURRENT, 1, QueueClass::Guest, &message).unwrap();
    let frame = decode_frame(&mut BytesMut::from(&encoded.to_bytes()[..]))
        .unwrap()
        .unwrap();
    assert_eq!(frame.message, message);
}

fn clone_blocks() -> Request {
    let component = |volume: &str, id| ComponentRef {
        volume: VolumeId::new(volume).unwrap(),
        id: ComponentId(id),
    };
    Request::CloneBlocks {
        source: component("gold", 3),
        source_lba: Lba(4096),
        target: component("vm-17", 9),
        target_lba: Lba(0),
        blocks: 4096,
        epoch: Epoch(5),
    }
}

#[test]
fn clone_blocks_round_trips_and_names_its_target() {
    let request = clone_blocks();
    let Request::CloneBlocks { target, .. } = &request else {
        unreachable!()
    };
    // The replica service routes on the component that changes.
    assert_eq!(request.component(), Some(target));
    assert_eq!(request.volume().map(VolumeId::as_str), Some("vm-17"));
    for message in [
        Message::Request(request.clone()),
        Message::Response(Response::Ok),
        Message::Response(Response::error(
            WireErrorKind::NotColocated,
            "component 9 of volume vm-17 is on disk group dg1, the source on dg0",
        )),
    ] {
        let encoded = encode_frame(WireVersion::V2, 11, QueueClass::Guest, &message).unwrap();
        let frame = decode_frame(&mut BytesMut::from(&encoded.to_bytes()[..]))
            .unwrap()
            .unwrap();
        assert_eq!(frame.header.kind, message.kind());
        assert_eq!(frame.message, message);
    }
}

#[test]
fn clone_blocks_is_neither_sent_nor_accepted_in_wire_v1() {
    // A host that negotiated v1 with an older peer must not send it a kind
    // the peer cannot read (the peer would close the connection, failing
    // every other request in flight on it).
    let message = Message::Request(clone_blocks());
    let err = encode_frame(WireVersion::V1, 1, QueueClass::Guest, &message).unwrap_err();
    assert_eq!(
        err,
        WireError::KindNotInVersion {
            kind: "CloneBlocks",
            version: 1,
            since: 2,
        }
    );
    assert!(err.to_string().contains("older release"), "{err}");
    // The same payload in a frame that claims v1 is refused on receipt.
    let v2 = encode_frame(WireVersion::V2, 1, QueueClass::Guest, &message)
        .unwrap()
        .to_bytes();
    let mut v1 = frame_around(MessageKind::CloneBlocks.number(), 1, 0, &v2[HEADER_BYTES..]);
    assert!(matches!(
        decode_frame(&mut v1),
        Err(WireError::KindNotInVersion { since: 2, .. })
    ));
    // Every v1 kind still goes out in v1.
    let write = Message::Request(Request::Flush {
        component: ComponentRef {
            volume: VolumeId::new("v").unwrap(),
            id: ComponentId(1),
        },
    });
    assert!(encode_frame(WireVersion::V1, 1, QueueClass::Guest, &write).is_ok());
}

fn snapshot_requests() -> [Request; 2] {
    let component = |volume: &str, id| ComponentRef {
        volume: VolumeId::new(volume).unwrap(),
        id: ComponentId(id),
    };
    [
        Request::SnapshotComponent {
            component: component("vm-17", 9),
            snapshot: ComponentId(21),
            epoch: Epoch(5),
        },
        Request::CloneSnapshot {
            snapshot: component("vm-17", 21),
            clone: ComponentId(22),
            epoch: Epoch(6),
        },
    ]
}

#[test]
fn snapshot_requests_round_trip_and_name_what_they_are_made_from() {
    let [snapshot, clone] = snapshot_requests();
    // The answering host must hold the component the new one is made from:
    // that is what the request addresses.
    assert_eq!(snapshot.component().map(|c| c.id), Some(ComponentId(9)));
    assert_eq!(clone.component().map(|c| c.id), Some(ComponentId(21)));
    assert_eq!(clone.volume().map(VolumeId::as_str), Some("vm-17"));
    assert_eq!(snapshot.kind().number(), 0x1c);
    assert_eq!(clone.kind().number(), 0x1d);
    assert_eq!(snapshot.kind().name(), "SnapshotComponent");
    assert_eq!(clone.kind().name(), "CloneSnapshot");
    for request in [snapshot, clone] {
        let message = Message::Request(request);
        let encoded = encode_frame(WireVersion::V4, 11, QueueClass::Guest, &message).unwrap();
        let frame = decode_frame(&mut BytesMut::from(&encoded.to_bytes()[..]))
            .unwrap()
            .unwrap();
        assert_eq!(frame.header.kind, message.kind());
        assert_eq!(frame.header.version, 4);
        assert_eq!(frame.message, message);
    }
}

#[test]
fn snapshot_requests_are_neither_sent_nor_accepted_before_wire_v4() {
    for request in snapshot_requests() {
        let message = Message::Request(request);
        let name = message.kind().name();
        // An older peer is never sent what it cannot read...
        for version in [WireVersion::V1, WireVersion::V2, WireVersion::V3] {
            let err = encode_frame(version, 1, QueueClass::Guest, &message).unwrap_err();
            assert_eq!(
                err,
                WireError::KindNotInVersion {
                    kind: name,
                    version: version.number(),
                    since: 4,
                }
            );
            assert!(err.to_string().contains("older release"), "{err}");
        }
        // ...and a frame that claims an older version is refused on receipt.
        let v4 = encode_frame(WireVersion::V4, 1, QueueClass::Guest, &message)
            .unwrap()
            .to_bytes();
        let mut v3 = frame_around(message.kind().number(), 3, 0, &v4[HEADER_BYTES..]);
        assert!(matches!(
            decode_frame(&mut v3),
            Err(WireError::KindNotInVersion { since: 4, .. })
        ));
    }
}

#[test]
fn malformed_snapshot_requests_are_refused_naming_the_field() {
    for request in snapshot_requests() {
        let message = Message::Request(request);
        let kind = message.kind();
        let payload = encode_frame(WireVersion::V4, 1, QueueClass::Guest, &message)
            .unwrap()
            .to_bytes()
            .slice(HEADER_BYTES..);
        // Cut anywhere: a truncation error, never a panic or a message.
        for cut in 0..payload.len() {
            let mut frame = frame_around(kind.number(), 4, 0, &payload[..cut]);
            match decode_frame(&mut frame) {
                Err(WireError::Truncated { kind: k, .. })
                | Err(WireError::BadName { kind: k, .. }) => {
                    assert_eq!(k, kind.name())
                }
                other => panic!("{} cut at {cut} decoded as {other:?}", kind.name()),
            }
        }
        // A byte too many.
        let mut long = payload.to_vec();
        long.push(0);
        let mut frame = frame_around(kind.number(), 4, 0, &long);
        assert!(matches!(
            decode_frame(&mut frame),
            Err(WireError::TrailingBytes { extra: 1, .. })
        ));
    }
}

#[test]
fn a_changed_query_round_trips_in_v5_and_is_never_sent_to_an_older_peer() {
    let message = Message::Request(Request::Changed {
        component: ComponentRef {
            volume: VolumeId::new("db-1").unwrap(),
            id: ComponentId(40),
        },
        base: ComponentId(41),
        from: Lba(8),
        blocks: 1 << 20,
    });
    assert_eq!(message.kind().number(), 0x1e);
    assert_eq!(message.kind().name(), "Changed");
    let encoded = encode_frame(WireVersion::V5, 3, QueueClass::Resync, &message).unwrap();
    let frame = decode_frame(&mut BytesMut::from(&encoded.to_bytes()[..]))
        .unwrap()
        .unwrap();
    assert_eq!(frame.header.version, 5);
    assert_eq!(frame.message, message);
    for version in [WireVersion::V1, WireVersion::V4] {
        assert!(matches!(
            encode_frame(version, 1, QueueClass::Resync, &message),
            Err(WireError::KindNotInVersion { since: 5, .. })
        ));
    }
    let payload = encoded.to_bytes().slice(HEADER_BYTES..);
    for cut in 0..payload.len() {
        let mut frame = frame_around(0x1e, 5, 0, &payload[..cut]);
        assert!(
            matches!(decode_frame(&mut frame), Err(WireError::Truncated { .. })),
            "cut at {cut}"
        );
    }
}
