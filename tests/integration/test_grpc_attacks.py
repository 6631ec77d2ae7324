"""The gRPC port under three HTTP/2 attacks (issue 29, items 1-3), each
from a raw HTTP/2 client written here (no h2 package: frames by hand,
HPACK literals without indexing and without Huffman coding), against a
real `ferry serve` of the tiny model:

- rapid reset (CVE-2023-44487): HEADERS + RST_STREAM pairs on one
  connection;
- a compressed-message bomb: 1 GiB of zeros gzipped to ~1 MiB, sent as
  one compressed gRPC message with grpc-encoding: gzip;
- a header block that never ends: HEADERS without END_HEADERS, then
  CONTINUATION frames without end.

Each asserts behaviour, never time: the server ends the attacking
connection with GOAWAY ENHANCE_YOUR_CALM (the bomb: the call fails), its
memory stays bounded (VmHWM from /proc), and a well-behaved client's calls
(KServe's stubs through grpcio, as test_grpc.py) are answered during and
after the attack. Timeouts are hang guards only.
"""

import re
import socket
import struct
import threading
import time
import zlib

import pytest

import refdata

grpc = refdata.client("grpc")
refdata.client("grpc_tools.protoc")

from test_grpc import GRPC_LISTEN_RE, TIMEOUT, grpc_port, infer_request, output_rows, pb  # noqa: E402,F401 (pb: a fixture)
from test_http import serve  # noqa: E402

MIB = 1 << 20
HWM_BOUND = 100 * MIB  # what an attack may add to the server's peak RSS
GUARD = 30             # seconds: a hang guard for one socket operation

# ---- a raw HTTP/2 client ----------------------------------------------------------

MAGIC = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
ENHANCE_YOUR_CALM = 0xB
INFER = "/inference.GRPCInferenceService/ModelInfer"


def frame(ftype, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ftype, flags]) + struct.pack(">I", sid) + payload


def hpack_int(v, prefix_bits, first=0):
    top = (1 << prefix_bits) - 1
    if v < top:
        return bytes([first | v])
    out = [first | top]
    v -= top
    while v >= 128:
        out.append(v % 128 + 128)
        v //= 128
    out.append(v)
    return bytes(out)


def literal(name, value):
    """A header as a literal without indexing, new name, neither string Huffman-coded."""
    name, value = name.encode(), value if isinstance(value, bytes) else value.encode()
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value


def call_headers(path=INFER, extra=()):
    fields = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "localhost"),
              ("content-type", "application/grpc"), ("te", "trailers")] + list(extra)
    return b"".join(literal(n, v) for n, v in fields)


class H2:
    """One HTTP/2 connection with prior knowledge. send() says False once the
    server has closed it; frames() reads what the server sends, keeping the
    windows and answering SETTINGS."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=GUARD)
        self.buf = b""
        self.closed = False      # EOF or reset from the server
        self.goaway = None       # the error code of a GOAWAY received
        self.conn_window = 65535
        self.initial_window = 65535
        self.windows = {}        # stream -> send window
        self.ended = {}          # stream -> "trailers" / "rst"
        self.got_data = set()    # streams a DATA frame came on
        self.trailers = {}       # stream -> header block bytes
        self.ping_acks = 0
        self.send(MAGIC + frame(SETTINGS, 0, 0))

    def send(self, data):
        if self.closed:
            return False
        self.s.settimeout(GUARD)
        try:
            self.s.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            self.closed = True
            return False
        except socket.timeout:  # the server stopped reading
            return False

    def _recv(self, timeout):
        self.s.settimeout(timeout)
        try:
            b = self.s.recv(1 << 16)
        except (socket.timeout, BlockingIOError):
            return False
        except ConnectionResetError:
            b = b""
        if not b:
            self.closed = True
            return False
        self.buf += b
        return True

    def frames(self, timeout):
        """Reads and handles the frames that arrive within timeout (at least
        one read); returns False once the connection is closed."""
        got = self._recv(timeout)
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            ftype, flags, sid = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
            self._handle(ftype, flags, sid, payload)
        return got or not self.closed

    def _handle(self, ftype, flags, sid, payload):
        if ftype == GOAWAY:
            self.last_stream = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        if ftype == SETTINGS and not flags & ACK:
            for k in range(0, len(payload) - 5, 6):
                ident, value = struct.unpack(">HI", payload[k:k + 6])
                if ident == 4:  # SETTINGS_INITIAL_WINDOW_SIZE
                    for s in self.windows:
                        self.windows[s] += value - self.initial_window
                    self.initial_window = value
            self.send(frame(SETTINGS, ACK, 0))
        elif ftype == WINDOW_UPDATE:
            inc = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if sid == 0:
                self.conn_window += inc
            elif sid in self.windows:
                self.windows[sid] += inc
        elif ftype == GOAWAY:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif ftype == RST_STREAM:
            self.ended[sid] = "rst"
        elif ftype == DATA:
            self.got_data.add(sid)
        elif ftype == HEADERS:
            self.trailers[sid] = self.trailers.get(sid, b"") + payload
            if flags & END_STREAM:
                self.ended[sid] = "trailers"
        elif ftype == PING and not flags & ACK:
            self.send(frame(PING, ACK, 0, payload))
        elif ftype == PING:
            self.ping_acks += 1

    def wait(self, until, guard=GUARD):
        """Reads until until() holds or the connection closes; hang guard `guard`."""
        for _ in range(int(guard * 10)):
            if until() or not self.frames(0.1) and self.closed:
                break
        return until()

    def ended_by_server(self):
        """Reads until the server closes the connection or sends GOAWAY;
        False if neither happens within the guard."""
        self.wait(lambda: self.closed or self.goaway is not None)
        return self.closed or self.goaway is not None

    def send_data(self, sid, data, end=True):
        """DATA frames within the windows; False if the stream or the
        connection ended first (the server refused the call)."""
        self.windows.setdefault(sid, self.initial_window)
        off = 0
        while off < len(data):
            room = min(self.conn_window, self.windows[sid], 16384, len(data) - off)
            if room <= 0:
                if not self.frames(GUARD) and self.closed or sid in self.ended:
                    return False
                continue
            last = off + room == len(data)
            if not self.send(frame(DATA, END_STREAM if last and end else 0, sid, data[off:off + room])):
                return False
            self.conn_window -= room
            self.windows[sid] -= room
            off += room
            if sid in self.ended:
                return False
            self.frames(0)  # take what came without waiting
        return True

    def close(self):
        self.s.close()


# ---- the server and a well-behaved client ---------------------------------------------

def vm(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no %s for %d" % (key, pid))


@pytest.fixture(scope="module")
def tiny(models):
    return models.get("llama", "tiny", seed=71)


def wait_log(srv, needle, guard=10):
    """Whether a line of the server's log holds needle (a str or a compiled
    regex), waiting for the log reader thread up to guard seconds."""
    found = needle.search if hasattr(needle, "search") else (lambda ln: needle in ln)
    for _ in range(int(guard * 20)):
        if any(found(ln) for ln in srv.log):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def srv(ferry_bin, tiny):
    for s in serve(ferry_bin, tiny, "--batch", 4):
        wait_log(s, GRPC_LISTEN_RE)  # ready over HTTP can come before the reader has the gRPC line
        yield s


class Bystander:
    """Another client's calls, one after another on its own channel, while
    the attack runs: each must be answered."""

    def __init__(self, srv, pb):
        self.msgs, self.srv = pb[0], srv
        self.ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv))
        self.stub = pb[1](self.ch)
        self.answered, self.errors = 0, []
        self.stop = threading.Event()
        self.call()  # the channel is up before the attack starts
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def call(self):
        resp = self.stub.ModelInfer(infer_request(self.msgs, self.srv.name, [[1, 2, 3]], 2), timeout=TIMEOUT)
        assert len(output_rows(resp, 1)[0]) >= 1

    def _run(self):
        while not self.stop.is_set():
            try:
                self.call()
                self.answered += 1
            except Exception as e:  # noqa: BLE001 (reported by finish)
                self.errors.append(repr(e))
                return

    def finish(self):
        """Stops; every call made during the attack was answered, and one more now."""
        self.stop.set()
        self.t.join(TIMEOUT + 5)
        assert not self.t.is_alive(), "a bystander's call hung"
        assert not self.errors, "a bystander's call failed during the attack: %s" % self.errors[0]
        self.call()
        self.ch.close()


def attack_setup(srv, pb):
    by = Bystander(srv, pb)
    return by, vm(srv.proc.pid, "VmHWM")


def assert_bounded(srv, hwm0, what):
    grown = vm(srv.proc.pid, "VmHWM") - hwm0
    assert grown < HWM_BOUND, "%s: peak RSS grew by %d MiB (bound %d MiB)\n%s" % (
        what, grown // MIB, HWM_BOUND // MIB, srv.logtail())


# ---- 1. rapid reset -------------------------------------------------------------------

def test_rapid_reset_closes_the_connection(srv, pb):
    """10,000 HEADERS + RST_STREAM pairs on one connection (50 times
    --grpc-max-resets' burst): the server ends the connection with GOAWAY
    ENHANCE_YOUR_CALM (core 1.51 alone takes them all, ~13 KiB of RSS a
    pair, and holds on), its peak RSS stays within 100 MiB of what it was,
    and another client's calls are answered throughout. The attacker then
    stops and reads: one that sends on past the server's 1 s drain gets
    the close's reset, which may overtake the GOAWAY."""
    by, hwm0 = attack_setup(srv, pb)
    c = H2(grpc_port(srv))
    block = call_headers()
    sent = 0
    for batch in range(10):
        pairs = b"".join(frame(HEADERS, END_HEADERS, sid, block) + frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
                         for sid in range(2 * 1000 * batch + 1, 2 * 1000 * (batch + 1), 2))
        if not c.send(pairs):
            break
        sent += 1000
        c.frames(0)
        if c.closed or c.goaway is not None:
            break
    assert c.ended_by_server(), "the server still holds a connection that sent %d reset streams" % sent
    assert c.goaway == ENHANCE_YOUR_CALM, "GOAWAY with code %r (closed: %s)" % (c.goaway, c.closed)
    c.close()
    assert_bounded(srv, hwm0, "rapid reset")
    by.finish()


def reset_pairs(first, n):
    block = call_headers()
    return b"".join(frame(HEADERS, END_HEADERS, sid, block) + frame(RST_STREAM, 0, sid, struct.pack(">I", 8))
                    for sid in range(first, first + 2 * n, 2))


def test_resets_within_the_limit_are_served(ferry_bin, tiny):
    """--grpc-max-resets 50: 40 calls opened and cancelled at once keep
    the connection (it answers a PING after them); 200 more end it with
    GOAWAY ENHANCE_YOUR_CALM naming the last stream opened, whatever the
    bucket refilled meanwhile."""
    for srv in serve(ferry_bin, tiny, "--grpc-max-resets", 50):
        wait_log(srv, GRPC_LISTEN_RE)
        c = H2(grpc_port(srv))
        assert c.send(reset_pairs(1, 40) + frame(PING, 0, 0, b"ferry-01"))
        assert c.wait(lambda: c.ping_acks), "no PING answer after 40 resets (goaway %r)" % c.goaway
        assert c.goaway is None and not c.closed
        c.send(reset_pairs(81, 200))
        assert c.ended_by_server()
        assert c.goaway == ENHANCE_YOUR_CALM, c.goaway
        assert 81 <= c.last_stream < 81 + 400, c.last_stream
        c.close()
        assert wait_log(srv, "--grpc-max-resets"), srv.logtail()


def test_resets_are_counted_per_address(ferry_bin, tiny):
    """--grpc-max-resets 50: ten connections from one address that each
    reset 40 calls - each under the limit alone - pass it together, and
    the connection that does gets GOAWAY ENHANCE_YOUR_CALM: a client gets
    no fresh allowance by opening connection after connection (with one
    bucket a connection, 10,000 connections of 200 resets in 7 s took RSS
    from 32 to 123 MiB)."""
    for srv in serve(ferry_bin, tiny, "--grpc-max-resets", 50):
        wait_log(srv, GRPC_LISTEN_RE)
        conns = []
        for first in range(10):
            c = H2(grpc_port(srv))
            c.send(reset_pairs(1, 40))
            conns.append(c)
        told = 0
        for c in conns:
            c.send(frame(PING, 0, 0, b"ferry-02"))
            assert c.wait(lambda: c.ping_acks or c.goaway is not None or c.closed), "no answer to a PING"
            told += c.goaway == ENHANCE_YOUR_CALM
            c.close()
        assert told >= 1, "400 resets from one address in 10 connections, none told to calm down"


# ---- 2. compressed-message bomb ----------------------------------------------------------

def gzip_zeros(total=1 << 30, chunk=MIB):
    """total zero bytes, gzipped a chunk at a time (the 1 GiB never exists)."""
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    zeros = bytes(chunk)
    out = [z.compress(zeros) for _ in range(total // chunk)]
    out.append(z.flush())
    return b"".join(out)


@pytest.mark.slow
def test_gzip_bomb_is_refused_before_inflation(srv, pb):
    """1 GiB of zeros as one gzip-compressed gRPC message (~1 MiB on the
    wire, under --max-body): the call ends with an error status (trailers
    without a response message, or RST_STREAM), the server's peak RSS
    stays within 100 MiB, and another client's calls are answered."""
    bomb = gzip_zeros()
    assert len(bomb) < 2 * MIB
    by, hwm0 = attack_setup(srv, pb)
    c = H2(grpc_port(srv))
    c.windows[1] = c.initial_window
    assert c.send(frame(HEADERS, END_HEADERS, 1, call_headers(extra=[("grpc-encoding", "gzip"),
                                                                      ("grpc-accept-encoding", "identity")])))
    c.send_data(1, b"\x01" + struct.pack(">I", len(bomb)) + bomb)
    assert c.wait(lambda: 1 in c.ended), "the call did not end (closed=%s)" % c.closed
    assert 1 not in c.got_data, "the bomb got a response message"
    m = re.search(rb"grpc-status.([0-9]+)", c.trailers.get(1, b""))
    if c.ended[1] == "trailers" and m:  # core writes it as a plain literal
        assert m.group(1) != b"0", c.trailers[1]
    c.close()
    assert_bounded(srv, hwm0, "gzip bomb")
    by.finish()


# ---- 3. a header block without end ------------------------------------------------------

def test_endless_continuation_closes_the_connection(srv, pb):
    """HEADERS without END_HEADERS that starts a header whose value is said
    to be 64 MiB long, then CONTINUATION frames of 16 KiB carrying it, up to
    4 MiB (128 times --max-header; the attacker stops then, as above): the
    server ends the connection, its
    peak RSS stays within 100 MiB, and another client's calls are answered
    throughout. Core 1.51 alone takes megabytes of it and then drops the
    connection without a word; the server says ENHANCE_YOUR_CALM."""
    by, hwm0 = attack_setup(srv, pb)
    c = H2(grpc_port(srv))
    assert c.send(frame(HEADERS, 0, 1, call_headers() + b"\x00" + hpack_int(5, 7) + b"x-pad" + hpack_int(64 * MIB, 7)))
    cont = frame(CONTINUATION, 0, 1, b"a" * 16384) * 4  # 64 KiB
    sent = 0
    while sent < 4 * MIB and c.send(cont):
        sent += len(cont)
        c.frames(0)
        if c.goaway is not None or c.closed:
            break
    assert c.ended_by_server(), "the server still holds a header block of %d MiB" % (sent // MIB)
    assert c.goaway == ENHANCE_YOUR_CALM, "GOAWAY with code %r (closed: %s, %d KiB sent)" % (
        c.goaway, c.closed, sent >> 10)
    c.close()
    assert_bounded(srv, hwm0, "endless CONTINUATION")
    by.finish()


def test_compressing_client_is_refused_by_name(srv, pb):
    """A well-behaved client told to compress (grpcio's gzip) gets
    UNIMPLEMENTED naming the algorithm (gRPC core's answer for a disabled
    one), before its message is read; a client that does not compress is
    served."""
    msgs = pb[0]
    ch = grpc.insecure_channel("127.0.0.1:%d" % grpc_port(srv), compression=grpc.Compression.Gzip)
    try:
        stub = pb[1](ch)
        req = infer_request(msgs, srv.name, [[1, 2, 3]], 2)
        with pytest.raises(grpc.RpcError) as ei:
            stub.ModelInfer(req, timeout=TIMEOUT)
        assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED, (ei.value.code(), ei.value.details())
        assert "gzip" in ei.value.details(), ei.value.details()
    finally:
        ch.close()
    by = Bystander(srv, pb)
    by.finish()
