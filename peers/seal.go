package peers

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
)

// Sealed shared state. Whoever can write Redis could otherwise steer every
// router: add any URL as a backend (a members entry and a version bump),
// bind sessions to it, or fake load. With a shared secret (Settings.KeyFile)
// every value a router writes is sealed, "kvrs1 MAC WRITER PAYLOAD", where
// MAC is the hex HMAC-SHA256 (RFC 2104) under the secret of the Redis key
// (with the hash field, for the members hash), the writer's router id and
// the payload, each length-prefixed so that no two inputs share a MAC. A
// value whose MAC does not check, or that is not sealed, is ignored and
// counted by kind in kvrouter_shared_state_rejected_total. Without a
// secret a router writes bare payloads, as before, and reads both forms
// (a sealed value's seal unchecked), so that a fleet can turn the secret
// on router by router.
//
// The seal does not stop replay: a writer of Redis may put back a value a
// router wrote earlier under the same key (an older membership entry of
// the same backend, a session's earlier binding). A router applies a
// backend's entry only when it is not older than the last it applied
// (members.go); a binding is taken only when newer than the router's own
// (fleet.Fleet.BindPeer).

// Kinds of shared values, the label of kvrouter_shared_state_rejected_total.
const (
	KindMember  = "member"
	KindSession = "session"
	KindLoad    = "load"
	KindEvent   = "event"
)

// sealTag starts every sealed value.
const sealTag = "kvrs1 "

// Bounds of the key file.
const (
	// MinKeyBytes is the shortest secret accepted: 128 bits.
	MinKeyBytes = 16
	// maxKeyFileBytes is the most of the key file read.
	maxKeyFileBytes = 4 << 10
)

// sealer seals and opens shared values with the secrets of the key file:
// the first seals, any opens (a secret is rotated by adding the new one
// second on every router, then moving it first, then removing the old).
// A zero sealer (no key) writes bare payloads and reads both forms
// unchecked.
type sealer struct{ keys [][]byte }

// seal returns the value to store under key for payload written by writer.
func (s sealer) seal(key, writer, payload string) string {
	if s.keys == nil {
		return payload
	}
	return sealTag + hex.EncodeToString(mac(s.keys[0], key, writer, payload)) + " " + writer + " " + payload
}

// open returns the payload of v read under key and its writer ("" when v
// is not sealed), or ok false when a key is set and v is not sealed with
// it.
func (s sealer) open(key, v string) (payload, writer string, ok bool) {
	rest, sealed := strings.CutPrefix(v, sealTag)
	if !sealed {
		return v, "", s.keys == nil
	}
	sum, rest, ok1 := strings.Cut(rest, " ")
	writer, payload, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return "", "", false
	}
	if s.keys == nil {
		return payload, writer, true
	}
	got, err := hex.DecodeString(sum)
	if err != nil {
		return "", "", false
	}
	for _, k := range s.keys {
		if hmac.Equal(got, mac(k, key, writer, payload)) {
			return payload, writer, true
		}
	}
	return "", "", false
}

// mac is HMAC-SHA256 under secret over key, writer and payload, each
// preceded by its length.
func mac(secret []byte, key, writer, payload string) []byte {
	h := hmac.New(sha256.New, secret)
	var n [binary.MaxVarintLen64]byte
	for _, part := range []string{key, writer, payload} {
		h.Write(binary.AppendUvarint(n[:0], uint64(len(part))))
		io.WriteString(h, part)
	}
	return h.Sum(nil)
}

// readKeyFile returns the secrets in path, one a line (less surrounding
// white space; blank lines skipped), each at least MinKeyBytes, from a
// regular file of at most maxKeyFileBytes.
func readKeyFile(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("redis key file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("redis key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("redis key file %s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("redis key file: %w", err)
	}
	if len(b) > maxKeyFileBytes {
		return nil, fmt.Errorf("redis key file %s: larger than %d bytes", path, maxKeyFileBytes)
	}
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		key := strings.TrimSpace(line)
		if key == "" {
			continue
		}
		if len(key) < MinKeyBytes {
			return nil, fmt.Errorf("redis key file %s, line %d: %d bytes, want at least %d (e.g. openssl rand -hex 32)", path, i+1, len(key), MinKeyBytes)
		}
		keys = append(keys, []byte(key))
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("redis key file %s: no secret", path)
	}
	return keys, nil
}
