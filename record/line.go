// Package record writes a router's completed requests as a trace the
// simulator and the replay load generator read (trace.ReadFile): one JSON
// line per request, in the Mooncake format (timestamp, input_length,
// output_length, hash_ids) with optional fields for what kvrouter knows
// and Mooncake's format lacks (block_size, session, model, priority,
// cached_tokens, outcome, tokens_estimated, and the request's SLO:
// slo_ttft_ms, slo_itl_ms, slo_class).
//
// A recording holds no prompt text and no raw session or user id: block
// hashes and session ids pass through a keyed pseudo-random function
// (Keys), so that a recording reveals nothing of the prompts and two
// recordings made with different keys share no id. Writing happens on a
// goroutine of its own behind a bounded queue: Recorder.Add never blocks.
package record

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Entry is one completed request as the router hands it over, before any
// keyed hashing. The recorder owns it once added.
type Entry struct {
	// At is the request's arrival.
	At time.Time
	// InputTokens is the prompt length in tokens: the engine's count when
	// its usage reported one, else the router's estimate.
	InputTokens int
	// OutputTokens is the completion length the engine reported; -1 when
	// it reported none.
	OutputTokens int
	// CachedTokens is the prompt tokens the engine reported cached; -1
	// when it reported none.
	CachedTokens int
	// BlockTokens is the prompt tokens one hash stands for.
	BlockTokens int
	// Estimated says BlockTokens is the router's estimate (text mode:
	// characters / 4), not the engine's block size.
	Estimated bool
	// Hashes are the prompt's chained block hashes, block 0 first.
	Hashes []uint64
	// Session is the request's raw session id; the recorder writes only
	// its keyed hash.
	Session string
	// Model is the requested model.
	Model string
	// Priority is the request's priority header (0: none).
	Priority int
	// Outcome is how the request ended (ok, error, canceled,
	// upstream_error).
	Outcome string
	// SLOTTFT and SLOITL are the request's SLO bounds on its time to
	// first token and its mean inter-token latency (0: none), and
	// SLOClass its class ("" for the fleet's default, as route.SLO.Class):
	// written as slo_ttft_ms, slo_itl_ms (in
	// milliseconds) and slo_class.
	SLOTTFT, SLOITL time.Duration
	SLOClass        string
}

// MaxHashID bounds the recorded hash ids: they are below 2^53, so that
// every JSON reader (JavaScript, pandas) reads them exactly.
const MaxHashID = 1<<53 - 1

// keyBytes is the length of a random per-recording key.
const keyBytes = 32

// Keys is a recording's keyed hashing: block hashes through AES-128 (a
// pseudo-random permutation, truncated to 53 bits) and session ids
// through HMAC-SHA256, both keyed from one secret. Without the secret the
// ids say nothing of the hashes or sessions behind them, and a different
// secret gives unrelated ids.
type Keys struct {
	block  cipher.Block
	mac    []byte // HMAC key of sessions
	sample uint64 // seed of the sampling hash
}

// NewKeys derives a recording's keys from secret; an empty secret means a
// random one (ids then match no other recording, not even the next one of
// the same router).
func NewKeys(secret []byte) (*Keys, error) {
	if len(secret) == 0 {
		secret = make([]byte, keyBytes)
		rand.Read(secret)
	}
	sub := func(label string) []byte {
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(label))
		return m.Sum(nil)
	}
	b, err := aes.NewCipher(sub("kvrouter record blocks")[:16])
	if err != nil {
		return nil, err
	}
	return &Keys{block: b, mac: sub("kvrouter record sessions"),
		sample: binary.LittleEndian.Uint64(sub("kvrouter record sampling"))}, nil
}

// maxKeyFileBytes bounds what ReadKeyFile reads: a key is tens of bytes,
// and a path the admin API was given may name anything (/dev/zero).
const maxKeyFileBytes = 4096

// ReadKeyFile reads a key file: its bytes, surrounding white space
// trimmed, are the secret. It must hold at least 16 bytes, and the file at
// most maxKeyFileBytes.
func ReadKeyFile(path string) ([]byte, error) {
	f, err := openRegular(path, os.O_RDONLY, 0) // file.go
	if err != nil {
		return nil, fmt.Errorf("record key: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("record key: %w", err)
	}
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("record key %s: longer than %d bytes, want a key (e.g. openssl rand -hex 32)", path, maxKeyFileBytes)
	}
	b = trimSpace(b)
	if len(b) < 16 {
		return nil, fmt.Errorf("record key %s: %d bytes, want at least 16 (e.g. openssl rand -hex 32)", path, len(b))
	}
	return b, nil
}

func trimSpace(b []byte) []byte {
	isSpace := func(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }
	for len(b) > 0 && isSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

// Block returns the recorded id of block hash h: below 2^53, equal for
// equal hashes under one key.
func (k *Keys) Block(h uint64) uint64 {
	var in, out [16]byte
	binary.LittleEndian.PutUint64(in[:], h)
	k.block.Encrypt(out[:], in[:])
	return binary.LittleEndian.Uint64(out[:]) & MaxHashID
}

// Session returns the recorded session: "s" and 16 hex digits of the
// keyed hash of id; "" for an empty id.
func (k *Keys) Session(id string) string {
	if id == "" {
		return ""
	}
	m := hmac.New(sha256.New, k.mac)
	m.Write([]byte(id))
	var sum [sha256.Size]byte
	return "s" + hex.EncodeToString(m.Sum(sum[:0])[:8])
}

// Sampled reports whether session id is in a sample of rate (0..1) of
// all sessions: the same answer for every request of a session, so that
// conversations stay whole. Rates ≥ 1 keep everything.
func (k *Keys) Sampled(id string, rate float64) bool {
	if !(rate < 1) {
		return true
	}
	var d xxhash.Digest
	d.ResetWithSeed(k.sample)
	d.WriteString(id)
	return float64(d.Sum64()>>11)/(1<<53) < rate
}

// appendLine appends e's JSON line (with a newline) to dst, its ids keyed
// by k, its timestamp in milliseconds since start; with head it carries
// start_unix_ms, which the first line of every file does.
func (k *Keys) appendLine(dst []byte, e *Entry, start time.Time, head bool) []byte {
	dst = append(dst, '{')
	if head {
		dst = append(dst, `"start_unix_ms":`...)
		dst = strconv.AppendInt(dst, start.UnixMilli(), 10)
		dst = append(dst, ',')
	}
	ms := float64(e.At.Sub(start).Microseconds()) / 1000
	dst = append(dst, `"timestamp":`...)
	dst = strconv.AppendFloat(dst, max(ms, 0), 'f', -1, 64)
	dst = append(dst, `,"input_length":`...)
	dst = strconv.AppendInt(dst, int64(max(e.InputTokens, 1)), 10)
	dst = append(dst, `,"output_length":`...)
	dst = strconv.AppendInt(dst, int64(max(e.OutputTokens, 0)), 10)
	dst = append(dst, `,"hash_ids":[`...)
	for i, h := range e.Hashes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, k.Block(h), 10)
	}
	dst = append(dst, `],"block_size":`...)
	dst = strconv.AppendInt(dst, int64(e.BlockTokens), 10)
	if e.Estimated {
		dst = append(dst, `,"tokens_estimated":true`...)
	}
	if s := k.Session(e.Session); s != "" {
		dst = append(dst, `,"session":"`...)
		dst = append(dst, s...)
		dst = append(dst, '"')
	}
	if e.Model != "" {
		dst = append(dst, `,"model":`...)
		dst = appendJSONString(dst, e.Model)
	}
	if e.Priority != 0 {
		dst = append(dst, `,"priority":`...)
		dst = strconv.AppendInt(dst, int64(e.Priority), 10)
	}
	if e.CachedTokens >= 0 {
		dst = append(dst, `,"cached_tokens":`...)
		dst = strconv.AppendInt(dst, int64(e.CachedTokens), 10)
	}
	if e.Outcome != "" {
		dst = append(dst, `,"outcome":`...)
		dst = appendJSONString(dst, e.Outcome)
	}
	return append(appendSLO(dst, e), "}\n"...)
}

// appendSLO appends the entry's SLO fields, those it has.
func appendSLO(dst []byte, e *Entry) []byte {
	for _, f := range [...]struct {
		key string
		v   time.Duration
	}{{`,"slo_ttft_ms":`, e.SLOTTFT}, {`,"slo_itl_ms":`, e.SLOITL}} {
		if f.v > 0 {
			dst = append(dst, f.key...)
			dst = strconv.AppendFloat(dst, float64(f.v.Microseconds())/1000, 'f', -1, 64)
		}
	}
	if e.SLOClass != "" {
		dst = append(dst, `,"slo_class":`...)
		dst = appendJSONString(dst, e.SLOClass)
	}
	return dst
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals
	return append(dst, b...)
}
