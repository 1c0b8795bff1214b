"""A vLLM-shaped KV-event publisher on libzmq (pyzmq) for cross-checking.

Usage: vllm_pub.py [FIRST_SEQ [offload]]. Binds a PUB and a ROUTER on random loopback
ports and publishes 50 legacy-encoded batches numbered from FIRST_SEQ
(default 0, as vLLM; llm-d-inference-sim starts at 1). Batch i stores 2
blocks of 4 tokens (tokens i*8 .. i*8+7, hashes 2i+1 and 2i+2: ints for
even i, 32-byte bin for odd i) chained onto batch i-1's last block. The
first 10 go out before the ports are printed, so that a subscriber joins
late and must rebuild them from the replay; the rest follow every 10 ms.
Replay requests are answered like vLLM >= 0.26, until killed or 20 s pass.
With "offload", every batch also stores its blocks on medium "CPU" (as
vLLM's CPU offloading writes computed blocks through), and batches 25 and
later remove theirs from "GPU" again: the GPU holds the chain's first 50
blocks, the CPU tier all 100.
"""
import struct
import sys
import time

import msgpack
import zmq

first = int(sys.argv[1]) if len(sys.argv) > 1 else 0
offload = len(sys.argv) > 2 and sys.argv[2] == "offload"
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pport = pub.bind_to_random_port("tcp://127.0.0.1")
rtr = ctx.socket(zmq.ROUTER)
rport = rtr.bind_to_random_port("tcp://127.0.0.1")
topic = b"kv@127.0.0.1:8000@m"
buf, i, end = [], 0, time.time() + 20


def publish(i):
    hs = [i * 2 + 1, i * 2 + 2]
    if i % 2:
        hs = [h.to_bytes(32, "big") for h in hs]
    parent = i * 2 if i > 0 else None
    evs = [["BlockStored", hs, parent, list(range(i * 8, i * 8 + 8)), 4, None, "GPU", None]]
    if offload:
        evs.append(["BlockStored", hs, parent, list(range(i * 8, i * 8 + 8)), 4, None, "CPU", None])
        if i >= 25:
            evs.append(["BlockRemoved", hs, "GPU"])
    payload = msgpack.packb([time.time(), evs])
    seq = first + i
    pub.send_multipart([topic, struct.pack(">Q", seq), payload])
    buf.append((seq, payload))


for i in range(10):
    publish(i)
i = 10
print(pport, rport, flush=True)
poller = zmq.Poller()
poller.register(rtr, zmq.POLLIN)
while time.time() < end:
    if i < 50:
        publish(i)
        i += 1
    for _ in poller.poll(10):
        ident, _empty, start = rtr.recv_multipart()
        lo = struct.unpack(">Q", start)[0]
        for q, p in buf:
            if q >= lo:
                rtr.send_multipart([ident, b"", topic, struct.pack(">Q", q), p])
        rtr.send_multipart([ident, b"", b"", struct.pack(">Q", 2**64 - 1), b""])
sys.exit(0)
