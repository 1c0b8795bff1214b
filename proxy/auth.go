package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
)

// Limits of a key file: it is read once at start, but a wrong path (a
// log file, /dev/zero) must not exhaust memory.
const (
	maxKeyFileBytes = 1 << 20
	maxKeys         = 10_000
)

// Keys is a set of API keys held as their SHA-256 digests, never in the
// clear. The zero value (no keys) lets every request through.
type Keys struct {
	sums  [][sha256.Size]byte
	names []string // the key's name in the file, else "key-<line>"
	prios []int    // the key's default X-Priority (priority=N), else 0
	// headers is the key's routing-header setting (headers=on|off): +1
	// shown, −1 hidden, 0 as Config.ClientHeaders.
	headers []int8
	// classes is the key's SLO class (class=NAME, one of
	// Config.SLO.Classes), else "": the fleet's default SLO.
	classes []string
}

// ReadKeys reads a key file: one key per line, optionally followed by
// white space and a name for logs (e.g. "sk-3f9a... team-a"), then
// optionally by "priority=N", the admission priority of the key's
// requests that do not send HeaderPriority (e.g. "sk-7c1e... batch
// priority=-1" makes a key's traffic sheddable); blank lines and lines
// starting with # are skipped. "headers=on" (or "headers=off") after the
// name decides whether the key's clients get the X-Kvrouter-* response
// headers whatever --client-headers says; "class=NAME" gives the key's
// requests the SLO of class NAME (Config.SLO.Classes; slo.go). The file
// must hold at least one key, at most 10,000, in at most 1 MiB.
func ReadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	k, err := parseKeys(io.LimitReader(f, maxKeyFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

func parseKeys(r io.Reader) (*Keys, error) {
	k := &Keys{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxKeyFileBytes)
	read, line := 0, 0
	for sc.Scan() {
		line++
		read += len(sc.Bytes()) + 1
		if read > maxKeyFileBytes {
			return nil, fmt.Errorf("larger than %d bytes", maxKeyFileBytes)
		}
		f := strings.Fields(sc.Text())
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		prio, headers, class := 0, int8(0), ""
		for len(f) > 1 {
			opt := f[len(f)-1]
			if v, ok := strings.CutPrefix(opt, "priority="); ok {
				p, err := strconv.Atoi(v)
				if err != nil || p < -maxPriority || p > maxPriority {
					return nil, fmt.Errorf("line %d: priority %q: want an integer within ±%d", line, v, maxPriority)
				}
				prio = p
			} else if v, ok := strings.CutPrefix(opt, "class="); ok {
				if !validClassName(v) {
					return nil, fmt.Errorf("line %d: class %q: want a name of 1 to %d letters, digits, - or _", line, v, maxClassName)
				}
				class = v
			} else if v, ok := strings.CutPrefix(opt, "headers="); ok {
				if headers, ok = parseHeadersOption(v); !ok {
					return nil, fmt.Errorf("line %d: headers %q: want on or off", line, v)
				}
			} else {
				break
			}
			f = f[:len(f)-1]
		}
		if len(f) > 2 {
			return nil, fmt.Errorf("line %d: want KEY [NAME] [priority=N] [headers=on|off] [class=NAME], got %d fields", line, len(f))
		}
		if len(k.sums) == maxKeys {
			return nil, fmt.Errorf("more than %d keys", maxKeys)
		}
		name := fmt.Sprintf("key-%d", line)
		if len(f) == 2 {
			name = f[1]
		}
		k.sums = append(k.sums, sha256.Sum256([]byte(f[0])))
		k.names = append(k.names, name)
		k.prios = append(k.prios, prio)
		k.headers = append(k.headers, headers)
		k.classes = append(k.classes, class)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(k.sums) == 0 {
		return nil, errors.New("no keys")
	}
	return k, nil
}

// Len returns the number of keys.
func (k *Keys) Len() int { return len(k.sums) }

// match returns the index of the key whose digest is that of key, or −1.
// Every digest is compared, in constant time, whatever matches.
func (k *Keys) match(key string) int {
	sum := sha256.Sum256([]byte(key))
	found := -1
	for i := range k.sums {
		if subtle.ConstantTimeCompare(sum[:], k.sums[i][:]) == 1 {
			found = i
		}
	}
	return found
}

// presented returns the key a request carries: the bearer token of its
// Authorization header, or with basic (browsers, for the admin surface)
// the password.
func presented(r *http.Request, basic bool) string {
	h := r.Header.Get("Authorization")
	if scheme, tok, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok)
	}
	if basic {
		if _, pw, ok := r.BasicAuth(); ok {
			return pw
		}
	}
	return ""
}

// keyNameKey is the context key of the key a request authenticated
// with: a keyInfo.
type keyNameKey struct{}

// keyInfo is the name and default priority of a request's key.
type keyInfo struct {
	name     string
	priority int
	headers  int8   // Keys.headers
	class    string // Keys.classes
}

// keyOf returns the API key the request carrying ctx authenticated
// with, and false without keys.
func keyOf(ctx context.Context) (keyInfo, bool) {
	k, ok := ctx.Value(keyNameKey{}).(keyInfo)
	return k, ok
}

// gate asks for a key on every request but probes (/livez, /readyz,
// /health). A request without one, or with a wrong one, is answered
// 401 in OpenAI's shape and counted by count. With strip the
// Authorization header is removed before next sees the request (the
// key is the router's, not the replicas'); basic also accepts the key
// as a basic-authentication password and asks browsers for it.
type gate struct {
	keys  *Keys
	strip bool
	basic bool
	count func(code string)
	next  http.Handler
}

// ServeHTTP implements http.Handler.
func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r, ok := g.admit(w, r); ok {
		g.next.ServeHTTP(w, r)
	}
}

// admit checks r's key: it returns r carrying its key's keyInfo, or
// answers w and returns false.
func (g *gate) admit(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if g.keys == nil || isProbe(r.URL.Path) {
		return r, true
	}
	key := presented(r, g.basic)
	i := -1
	if key != "" {
		i = g.keys.match(key)
	}
	if i < 0 {
		g.reject(w, key == "")
		return nil, false
	}
	if g.strip {
		r.Header.Del("Authorization")
	}
	info := keyInfo{name: g.keys.names[i], priority: g.keys.prios[i], headers: g.keys.headers[i], class: g.keys.classes[i]}
	return r.WithContext(context.WithValue(r.Context(), keyNameKey{}, info)), true
}

func (g *gate) reject(w http.ResponseWriter, missing bool) {
	g.count(codeInvalidKey)
	w.Header().Add("WWW-Authenticate", `Bearer realm="kvrouter"`)
	if g.basic {
		w.Header().Add("WWW-Authenticate", `Basic realm="kvrouter admin"`)
	}
	msg := "Incorrect API key provided."
	if missing {
		msg = "You didn't provide an API key. Provide it in the Authorization header as \"Bearer YOUR_KEY\"."
	}
	writeError(w, http.StatusUnauthorized, errInvalidRequest, codeInvalidKey, msg)
}

// isProbe reports whether path is a health probe, answered without a key.
func isProbe(path string) bool {
	return path == "/livez" || path == "/readyz" || path == "/health"
}

var _ http.Handler = (*gate)(nil)
