package kvevents

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/zmtp"
)

// FuzzZMTP feeds arbitrary bytes as a publisher's side of a connection
// to the path every KV-event byte takes: the ZMTP handshake and frame
// reader (as a SUB, with small limits), the message shape, the batch
// decoder. Nothing may panic, a message must respect the limits, and
// every failure must be a clean error. Seeds: a valid handshake followed
// by a message, an oversize claim, and garbage.
//
//	go test -run='^$' -fuzz=FuzzZMTP -fuzztime=30s ./kvevents
func FuzzZMTP(f *testing.F) {
	hs := append(greetingFor(), pubReady()...)
	msg := []byte{0x01, 5, 't', 'o', 'p', 'i', 'c', 0x01, 8, 0, 0, 0, 0, 0, 0, 0, 1, 0x00, 3, 0x93, 0xcb, 0x00}
	f.Add(append(bytes.Clone(hs), msg...))
	f.Add(append(bytes.Clone(hs), 0x02, 0, 0, 1, 0, 0, 0, 0, 0))
	f.Add(append(greetingFor(), 0x06, 0, 0, 1, 0, 0, 0, 0, 0, 5))
	f.Add(append(bytes.Clone(hs), 0x04, 8, 4, 'P', 'I', 'N', 'G', 0, 1, 'x'))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	lim := zmtp.Limits{MaxMessageBytes: 4096, MaxFrames: maxFrames, HandshakeTimeout: time.Second, ReadTimeout: time.Second}
	f.Fuzz(func(t *testing.T, in []byte) {
		server, client := net.Pipe()
		defer server.Close()
		go func() {
			go io.Copy(io.Discard, client) // what the SUB writes: greeting, READY, subscription, PONGs
			client.Write(in)
			client.Close()
		}()
		c, err := zmtp.Handshake(server, zmtp.Sub, lim)
		if err != nil {
			return
		}
		dec := NewDecoder()
		var b Batch
		for {
			frames, err := c.Recv()
			if err != nil {
				if errors.Is(err, zmtp.ErrTooLarge) || errors.Is(err, zmtp.ErrProtocol) || errors.Is(err, io.EOF) ||
					errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.ErrClosedPipe) {
					return
				}
				t.Fatalf("unexpected error %v", err)
			}
			total := 0
			for _, fr := range frames {
				total += len(fr)
			}
			if total > int(lim.MaxMessageBytes) || len(frames) > lim.MaxFrames {
				t.Fatalf("message of %d frames, %d bytes past the limits", len(frames), total)
			}
			if m, ok := parseMsg(frames); ok {
				dec.Decode(m.payload, &b)
			}
		}
	})
}
