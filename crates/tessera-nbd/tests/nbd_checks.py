#!/usr/bin/python3
"""Protocol checks of Tessera's NBD server with libnbd (strict mode unless a
check needs to send what strict mode forbids) and raw sockets.

Usage: nbd_checks.py HOST PORT
Exports expected: "vol" (16 MiB, writable), "ro" (read-only), "faulty"
(16 MiB; reads touching 1 MiB + 4096 fail with a checksum error; writes
beyond 2 MiB of allocation fail as a full datastore).
Prints one line per check and "N passed, N failed"; exits 1 on failure.
"""

import errno
import os
import socket
import struct
import sys

import nbd

HOST, PORT = sys.argv[1], int(sys.argv[2])
MIB = 1 << 20
results = []


def uri(export):
    return "nbd://%s:%d/%s" % (HOST, PORT, export)


def check(name):
    def wrap(fn):
        try:
            fn()
            results.append((name, None))
            print("ok   %s" % name)
        except Exception as e:  # noqa: BLE001 - report every failure
            results.append((name, e))
            print("FAIL %s: %r" % (name, e))
        return fn
    return wrap


def connect(export, strict=True, meta=True):
    h = nbd.NBD()
    if meta:
        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if not strict:
        h.set_strict_mode(0)
    h.connect_uri(uri(export))
    return h


def expect_errno(fn, code):
    try:
        fn()
    except nbd.Error as e:
        assert e.errnum == code, "errno %s, expected %s (%s)" % (e.errnum, code, e.string)
        return
    raise AssertionError("no error, expected errno %d" % code)


def extents(h, count, offset, flags=0):
    got = []

    def cb(context, off, entries, err):
        assert context == nbd.CONTEXT_BASE_ALLOCATION
        got.extend(zip(entries[0::2], entries[1::2]))
        return 0
    h.block_status(count, offset, cb, flags)
    return got


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise AssertionError("server closed the connection")
        buf += chunk
    return buf


def raw_option(s, option, data=b""):
    s.sendall(struct.pack(">QII", 0x49484156454F5054, option, len(data)) + data)


def raw_reply(s):
    magic, option, kind, length = struct.unpack(">QIII", recv_exact(s, 20))
    assert magic == 0x3E889045565A9, hex(magic)
    return option, kind, recv_exact(s, length)


@check("raw: unknown option -> NBD_REP_ERR_UNSUP, session continues with LIST and ABORT")
def _():
    s = socket.create_connection((HOST, PORT), timeout=10)
    hello = recv_exact(s, 18)
    assert hello[:16] == b"NBDMAGICIHAVEOPT"
    s.sendall(struct.pack(">I", 1))
    raw_option(s, 0x7777, b"whatever")
    option, kind, _ = raw_reply(s)
    assert (option, kind) == (0x7777, 0x80000001), (option, hex(kind))
    raw_option(s, 3)
    names = []
    while True:
        option, kind, data = raw_reply(s)
        if kind == 1:
            break
        assert kind == 2
        (n,) = struct.unpack(">I", data[:4])
        names.append(data[4:4 + n].decode())
    assert sorted(names) == ["faulty", "ro", "vol"], names
    raw_option(s, 2)
    option, kind, _ = raw_reply(s)
    assert kind == 1
    s.close()


@check("raw: LIST with data -> NBD_REP_ERR_INVALID, STARTTLS without TLS configured -> ERR_POLICY")
def _():
    s = socket.create_connection((HOST, PORT), timeout=10)
    recv_exact(s, 18)
    s.sendall(struct.pack(">I", 3))
    raw_option(s, 3, b"junk")
    assert raw_reply(s)[1] == 0x80000003
    raw_option(s, 5)
    assert raw_reply(s)[1] == 0x80000002
    raw_option(s, 2)
    assert raw_reply(s)[1] == 1
    s.close()


@check("opt mode: list exports, info on a missing export fails, list meta contexts, go")
def _():
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(uri("vol"))
    names = []
    h.opt_list(lambda name, desc: names.append(name))
    assert sorted(names) == ["faulty", "ro", "vol"], names
    h.set_export_name("missing")
    try:
        h.opt_info()
        raise AssertionError("info on a missing export succeeded")
    except nbd.Error:
        pass
    h.set_export_name("vol")
    h.opt_info()
    assert h.get_size() == 16 * MIB
    contexts = []
    h.opt_list_meta_context(lambda name: contexts.append(name))
    assert contexts == [nbd.CONTEXT_BASE_ALLOCATION], contexts
    h.opt_go()
    assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    assert h.get_structured_replies_negotiated()
    h.shutdown()


@check("default export: empty name is refused when there are several exports")
def _():
    h = nbd.NBD()
    try:
        h.connect_uri(uri(""))
        raise AssertionError("connected to an ambiguous default export")
    except nbd.Error:
        pass


h = connect("vol")
payload = os.urandom(MIB)


@check("WRITE then READ returns the data; FUA write; FLUSH")
def _():
    h.pwrite(payload, 0)
    assert h.pread(MIB, 0) == payload
    h.pwrite(payload[:4096], 2 * MIB, nbd.CMD_FLAG_FUA)
    h.flush()
    assert h.pread(4096, 2 * MIB) == payload[:4096]


@check("READ with DF returns one chunk of the right data")
def _():
    chunks = []
    buf = h.pread_structured(
        65536, 4096,
        lambda sub, off, status, err: chunks.append((off, status, len(sub))) or 0,
        nbd.CMD_FLAG_DF)
    assert chunks == [(4096, nbd.READ_DATA, 65536)], chunks
    assert buf == payload[4096:69632]


@check("BLOCK_STATUS: data where written, holes elsewhere, REQ_ONE gives one extent")
def _():
    ext = extents(h, 4 * MIB, 0)
    assert ext[0] == (MIB, 0), ext
    assert ext[1] == (MIB, nbd.STATE_HOLE | nbd.STATE_ZERO), ext
    assert ext[2] == (4096, 0), ext
    assert sum(n for n, _ in ext) <= 4 * MIB
    one = extents(h, 4 * MIB, 0, nbd.CMD_FLAG_REQ_ONE)
    assert one == [(MIB, 0)], one


@check("TRIM makes a hole that reads zero; TRIM with FUA")
def _():
    h.trim(65536, 0)
    assert h.pread(65536, 0) == bytes(65536)
    assert extents(h, 65536, 0)[0] == (65536, nbd.STATE_HOLE | nbd.STATE_ZERO)
    h.trim(4096, 65536, nbd.CMD_FLAG_FUA)
    assert extents(h, 65536 + 4096, 0)[0] == (65536 + 4096, 3)


@check("WRITE_ZEROES: hole by default, allocated zero with NO_HOLE, FAST_ZERO accepted")
def _():
    h.zero(65536, 131072)
    assert extents(h, 65536, 131072)[0] == (65536, nbd.STATE_HOLE | nbd.STATE_ZERO)
    h.zero(65536, 262144, nbd.CMD_FLAG_NO_HOLE)
    assert extents(h, 65536, 262144)[0] == (65536, nbd.STATE_ZERO)
    h.zero(65536, 393216, nbd.CMD_FLAG_FAST_ZERO)
    for start in (131072, 262144, 393216):
        assert h.pread(65536, start) == bytes(65536), start
    assert h.pread(65536, 196608) == payload[196608:262144]
    assert h.pread(65536, 458752) == payload[458752:524288]


@check("CACHE succeeds")
def _():
    h.cache(MIB, 0)


@check("multi-conn: a flush on a second connection covers writes acknowledged on the first")
def _():
    assert h.can_multi_conn()
    h2 = connect("vol")
    h.pwrite(b"\x42" * 4096, 3 * MIB)
    h2.flush()
    assert h2.pread(4096, 3 * MIB) == b"\x42" * 4096
    h2.shutdown()


@check("concurrent requests on one connection all complete")
def _():
    buffers = [nbd.Buffer(4096) for _ in range(64)]
    cookies = [h.aio_pread(buffers[i], MIB + i * 4096) for i in range(64)]
    while cookies:
        h.poll(-1)
        cookies = [c for c in cookies if not h.aio_command_completed(c)]
    assert all(bytes(b.to_bytearray()) == bytes(4096) for b in buffers)


loose = connect("vol", strict=False)


@check("WRITE past the end -> ENOSPC; WRITE_ZEROES past the end -> ENOSPC")
def _():
    expect_errno(lambda: loose.pwrite(b"\x01" * 1024, 16 * MIB - 512), errno.ENOSPC)
    expect_errno(lambda: loose.zero(1024, 16 * MIB - 512), errno.ENOSPC)


@check("READ, TRIM, BLOCK_STATUS past the end -> EINVAL")
def _():
    expect_errno(lambda: loose.pread(1024, 16 * MIB - 512), errno.EINVAL)
    expect_errno(lambda: loose.trim(1024, 16 * MIB - 512), errno.EINVAL)
    expect_errno(lambda: extents(loose, 1024, 16 * MIB - 512), errno.EINVAL)


@check("unknown flag -> EINVAL and the connection keeps working")
def _():
    expect_errno(lambda: loose.pwrite(b"\x01" * 512, 0, nbd.CMD_FLAG_NO_HOLE), errno.EINVAL)
    assert loose.pread(512, 2 * MIB) == payload[:512]


ro = connect("ro", strict=False)


@check("read-only export: WRITE, TRIM, WRITE_ZEROES -> EPERM; READ works")
def _():
    assert ro.is_read_only()
    expect_errno(lambda: ro.pwrite(b"\x01" * 512, 0), errno.EPERM)
    expect_errno(lambda: ro.trim(512, 0), errno.EPERM)
    expect_errno(lambda: ro.zero(512, 0), errno.EPERM)
    assert ro.pread(512, 0) == bytes(512)


faulty = connect("faulty", strict=False)


@check("failed READ -> EIO error chunk; the session continues")
def _():
    expect_errno(lambda: faulty.pread(65536, MIB), errno.EIO)
    chunks = []

    def record(sub, off, status, err):
        chunks.append((off, status, err.get() if hasattr(err, "get") else err))
        return 0
    expect_errno(lambda: faulty.pread_structured(65536, MIB, record), errno.EIO)
    assert [(o, s) for o, s, _ in chunks] == [(MIB + 4096, nbd.READ_ERROR)], chunks
    assert faulty.pread(4096, 0) == bytes(4096)


@check("full datastore -> ENOSPC; writes that fit still succeed")
def _():
    faulty.pwrite(b"\x07" * MIB, 0)
    expect_errno(lambda: faulty.pwrite(b"\x07" * (2 * MIB), 4 * MIB), errno.ENOSPC)
    faulty.pwrite(b"\x08" * 4096, 0)
    assert faulty.pread(4096, 0) == b"\x08" * 4096


for handle in (h, loose, ro, faulty):
    handle.shutdown()

failed = sum(1 for _, e in results if e is not None)
print("%d passed, %d failed" % (len(results) - failed, failed))
sys.exit(1 if failed else 0)
