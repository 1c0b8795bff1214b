"""A vLLM-shaped KV-event publisher on libzmq (pyzmq) for cross-checking.

Binds a PUB and a ROUTER on random loopback ports, prints them, then
publishes 50 legacy-encoded batches (one BlockStored of 2 blocks of 4
tokens each: tokens seq*8 .. seq*8+7; hashes as ints for even seq, 32-byte
bin for odd) every 10 ms, and answers replay requests like vLLM >= 0.26,
until killed or 20 s pass.
"""
import struct
import sys
import time

import msgpack
import zmq

ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pport = pub.bind_to_random_port("tcp://127.0.0.1")
rtr = ctx.socket(zmq.ROUTER)
rport = rtr.bind_to_random_port("tcp://127.0.0.1")
print(pport, rport, flush=True)
topic = b"kv@127.0.0.1:8000@m"
buf, seq, end = [], 0, time.time() + 20
poller = zmq.Poller()
poller.register(rtr, zmq.POLLIN)
while time.time() < end:
    if seq < 50:
        hs = [seq * 2 + 1, seq * 2 + 2]
        if seq % 2:
            hs = [h.to_bytes(32, "big") for h in hs]
        ev = ["BlockStored", hs, None, list(range(seq * 8, seq * 8 + 8)), 4, None, "GPU", None]
        payload = msgpack.packb([time.time(), [ev]])
        pub.send_multipart([topic, struct.pack(">Q", seq), payload])
        buf.append((seq, payload))
        seq += 1
    for _ in poller.poll(10):
        ident, _empty, start = rtr.recv_multipart()
        first = struct.unpack(">Q", start)[0]
        for q, p in buf:
            if q >= first:
                rtr.send_multipart([ident, b"", topic, struct.pack(">Q", q), p])
        rtr.send_multipart([ident, b"", b"", struct.pack(">Q", 2**64 - 1), b""])
sys.exit(0)
