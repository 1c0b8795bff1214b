package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// The side channel: how a decode worker reads the blocks a prefill worker
// holds for it. In vLLM the decode instance's NixlConnector reads them by
// RDMA from the prefill instance, after a handshake on its NIXL side
// channel (remote_host:remote_port), and notifies it when done so that it
// frees them. An emulator serves its side channel on its HTTP API:
//
//	POST /kv_transfer/blocks
//	{"request_id": "<remote_request_id>", "block_ids": [<remote_block_ids>]}
//
// The engine loop finds the blocks held for that request (engine.Read),
// queues the leading ones asked for that are the request's, in order, on
// its outbound link, and answers
//
//	200 {"request_id": "…", "hashes": [<chained hash of each block sent>], "sent_in_ns": N}
//
// where sent_in_ns is when the last one leaves its link, in engine
// nanoseconds from the answer (the two engines' clocks differ). The read
// frees the hold once the blocks are sent. Errors are OpenAI-shaped: 400
// for a malformed ask (bad JSON, no request_id, an empty list or more ids
// than a prompt of the model length has blocks, an id out of range), 413
// for a body larger than such an ask, 404 when no blocks are held for the
// request (never, expired, or read already), 409 when the first id is not
// the request's first block, 503 when the engine is not running.

// TransferPath is the side-channel endpoint.
const TransferPath = "/kv_transfer/blocks"

// maxRequestIDBytes bounds a side-channel ask's request_id.
const maxRequestIDBytes = 256

// readAsk is the body of POST TransferPath.
type readAsk struct {
	// RequestID is the prefill leg's id (its remote_request_id).
	RequestID string `json:"request_id"`
	// BlockIDs are the engine block ids to read, in order (its
	// remote_block_ids, or their leading part).
	BlockIDs []int64 `json:"block_ids"`
}

// readAnswer is the source's answer to a readAsk.
type readAnswer struct {
	RequestID string `json:"request_id"`
	// Hashes are the chained hashes of the blocks sent, one per leading
	// id asked for that is the request's: the reader checks they are its
	// own prompt's leading blocks.
	Hashes []prefix.Hash `json:"hashes"`
	// SentInNS is when the last of them leaves the source's outbound link
	// (shared with the other reads it serves), in engine nanoseconds from
	// the answer.
	SentInNS int64 `json:"sent_in_ns"`
}

// readOrder asks the engine loop to serve a read.
type readOrder struct {
	id    string
	ids   []int32
	reply chan readReply // capacity 1
}

type readReply struct {
	hashes []prefix.Hash
	sentIn time.Duration
	held   bool // the request holds blocks
}

// read serves o from the engine goroutine, at now.
func (l *loop) read(o *readOrder) {
	l.t = max(l.t, l.now())
	hashes, sent, held := l.s.eng.Read(l.t, o.id, o.ids)
	o.reply <- readReply{hashes: slices.Clone(hashes), sentIn: max(sent-l.t, 0), held: held}
}

// maxBlocks is the most blocks a prompt of the model length has, which
// bounds a side-channel ask and a decode leg's remote_block_ids.
func (s *Server) maxBlocks() int { return s.ecfg.MaxModelLen/s.ecfg.BlockSize + 1 }

// serveTransfer is the side channel: POST TransferPath with a readAsk.
func (s *Server) serveTransfer(w http.ResponseWriter, r *http.Request) {
	// A peer that trickles its ask or does not read the answer holds the
	// connection no longer than a reader waits for it (errors: a
	// connection without deadlines, as in tests on a recorder).
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(transferTimeout))
	rc.SetWriteDeadline(time.Now().Add(transferTimeout))
	ask, err := s.readAsk(w, r)
	if err != nil {
		fail(w, err)
		return
	}
	ids := make([]int32, len(ask.BlockIDs))
	for i, id := range ask.BlockIDs {
		ids[i] = int32(id)
	}
	o := &readOrder{id: ask.RequestID, ids: ids, reply: make(chan readReply, 1)}
	if !toLoop(s, w, r, s.reads, o) {
		return
	}
	rep := <-o.reply
	switch {
	case !rep.held:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no KV blocks held for request %q: never held, expired, or read already", ask.RequestID))
		return
	case len(rep.hashes) == 0:
		writeError(w, http.StatusConflict, fmt.Sprintf("block_ids are not the blocks held for request %q", ask.RequestID))
		return
	}
	s.tm.sent.Add(float64(len(rep.hashes)))
	writeJSON(w, readAnswer{RequestID: ask.RequestID, Hashes: rep.hashes, SentInNS: int64(rep.sentIn)})
}

// readAsk reads and checks a side-channel ask. The body is bounded before
// it is read: a request_id and maxBlocks ids of up to 11 characters each.
func (s *Server) readAsk(w http.ResponseWriter, r *http.Request) (*readAsk, error) {
	maxBlocks := s.maxBlocks()
	limit := int64(1<<10 + maxRequestIDBytes + 12*maxBlocks)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, &httpError{status: http.StatusRequestEntityTooLarge, msg: fmt.Sprintf("side-channel ask exceeds %d bytes", limit)}
		}
		return nil, badRequest("read body: %v", err)
	}
	var ask readAsk
	if err := json.Unmarshal(body, &ask); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	switch {
	case ask.RequestID == "" || len(ask.RequestID) > maxRequestIDBytes:
		return nil, &httpError{status: http.StatusBadRequest, param: "request_id",
			msg: fmt.Sprintf("request_id: want 1..%d bytes, got %d", maxRequestIDBytes, len(ask.RequestID))}
	case len(ask.BlockIDs) == 0 || len(ask.BlockIDs) > maxBlocks:
		return nil, &httpError{status: http.StatusBadRequest, param: "block_ids",
			msg: fmt.Sprintf("block_ids: want 1..%d ids, got %d", maxBlocks, len(ask.BlockIDs))}
	}
	for i, id := range ask.BlockIDs {
		if id < 0 || id >= int64(s.ecfg.NumBlocks) {
			return nil, &httpError{status: http.StatusBadRequest, param: "block_ids",
				msg: fmt.Sprintf("block_ids[%d]: %d is not a block id (0..%d)", i, id, s.ecfg.NumBlocks-1)}
		}
	}
	return &ask, nil
}
