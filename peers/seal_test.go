package peers

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestSeal: a sealed value opens under its key with the secret it was
// sealed with, and under no other key, writer, payload or secret; an
// unsealed value is refused with a secret and taken without one, as is a
// sealed one (its seal unchecked).
func TestSeal(t *testing.T) {
	s := sealer{keys: [][]byte{[]byte("0123456789abcdef0123")}}
	v := s.seal("kvrouter:load:a", "a", `{"router":"a"}`)
	if p, w, ok := s.open("kvrouter:load:a", v); !ok || p != `{"router":"a"}` || w != "a" {
		t.Fatalf("open(seal) = %q, %q, %v", p, w, ok)
	}
	other := sealer{keys: [][]byte{[]byte("another secret of 20")}}
	forged := []struct{ name, key, v string }{
		{"other key", "kvrouter:load:b", v},
		{"other writer", "kvrouter:load:a", strings.Replace(v, " a ", " b ", 1)},
		{"other payload", "kvrouter:load:a", strings.TrimSuffix(v, "}") + `,"x":1}`},
		{"other secret", "kvrouter:load:a", other.seal("kvrouter:load:a", "a", `{"router":"a"}`)},
		{"unsealed", "kvrouter:load:a", `{"router":"a"}`},
		{"truncated", "kvrouter:load:a", v[:len(sealTag)+10]},
		{"bad hex", "kvrouter:load:a", sealTag + "zz a {}"},
	}
	for _, f := range forged {
		if p, _, ok := s.open(f.key, f.v); ok {
			t.Errorf("%s: opened as %q, want refused", f.name, p)
		}
	}
	// Rotation: a router with the new secret first and the old second
	// opens what one with the old alone sealed, and seals with the new.
	rotating := sealer{keys: [][]byte{other.keys[0], s.keys[0]}}
	if p, _, ok := rotating.open("kvrouter:load:a", v); !ok || p != `{"router":"a"}` {
		t.Errorf("rotating: open(old seal) = %q, %v; want the payload", p, ok)
	}
	if _, _, ok := other.open("k", rotating.seal("k", "a", "x")); !ok {
		t.Error("rotating: its seal does not open with the new secret")
	}
	var none sealer
	for _, in := range []string{v, `{"router":"a"}`} {
		if p, _, ok := none.open("kvrouter:load:a", in); !ok || p != `{"router":"a"}` {
			t.Errorf("without a secret, open(%q) = %q, %v; want the payload", in, p, ok)
		}
	}
	if got := none.seal("k", "a", "x"); got != "x" {
		t.Errorf("without a secret, seal = %q, want the bare payload", got)
	}
}

// TestReadKeyFile: a file holds secrets one a line; one shorter than
// MinKeyBytes, none at all, a directory and a missing file are refused;
// surrounding white space is not the secret's.
func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keys, err := readKeyFile(write("ok", "  0123456789abcdef0123\n\n  the next secret, second\n"))
	if err != nil || len(keys) != 2 || string(keys[0]) != "0123456789abcdef0123" || string(keys[1]) != "the next secret, second" {
		t.Errorf("got %q, %v; want the two secrets", keys, err)
	}
	for _, p := range []string{write("short", "short\n"), write("blank", "\n \n"), write("second short", "0123456789abcdef0123\nshort\n"), dir, filepath.Join(dir, "missing"), write("big", strings.Repeat("k", maxKeyFileBytes+1))} {
		if _, err := readKeyFile(p); err == nil {
			t.Errorf("readKeyFile(%s) accepted", p)
		}
	}
}

// value returns a counter's count.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

// sealedSyncer is a Syncer of router on url whose values are sealed with
// the secret in keyFile ("": none).
func sealedSyncer(t *testing.T, url, router, keyFile string, apply func([]Member) error) *Syncer {
	t.Helper()
	s, err := New(Config{Settings: Settings{URL: url, Router: router, Interval: 20 * time.Millisecond, TTL: 400 * time.Millisecond, KeyFile: keyFile},
		Registry: prometheus.NewRegistry(), ApplyMembers: apply}, newFleet(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestForgedSharedState: with a secret, what a writer of Redis puts there
// without it (a member, a session binding, a router's load, a stream
// entry: the reproduction, HSET kvrouter:members plus INCR
// kvrouter:members:version) is ignored and counted by kind, while what
// another router with the secret writes is taken.
func TestForgedSharedState(t *testing.T) {
	rs := redisserver.Start(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("fleet secret 0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	applied := map[string]Member{}
	apply := func(ms []Member) error {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range ms {
			applied[m.URL] = m
		}
		return nil
	}
	seen := func(url string) bool {
		mu.Lock()
		defer mu.Unlock()
		_, ok := applied[url]
		return ok
	}
	sa := sealedSyncer(t, rs.URL(), "a", keyFile, apply)
	sb := sealedSyncer(t, rs.URL(), "b", keyFile, nil)
	rejected := func(kind string) float64 { return value(sa.m.rejected.WithLabelValues(kind)) }
	run(t, sa)
	run(t, sb)
	wait.For(t, "both up", func() bool { return sa.Up() && sb.Up() })

	attacker := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer attacker.Close()
	ctx := context.Background()
	const evil = "http://127.0.0.1:9/evil"
	for _, err := range []error{
		attacker.HSet(ctx, "kvrouter:members", evil, `{"url":"`+evil+`","state":"serving"}`).Err(),
		attacker.Incr(ctx, "kvrouter:members:version").Err(),
		attacker.Set(ctx, "kvrouter:session:"+fleet.SessionKey("victim"), "1800000000000000000 0 0 b "+evil, time.Minute).Err(),
		attacker.Set(ctx, "kvrouter:load:mallory", `{"router":"mallory","load":[{"replica":"http://r0","in_flight":1000}]}`, time.Minute).Err(),
		attacker.SAdd(ctx, "kvrouter:routers", "mallory").Err(),
		attacker.XAdd(ctx, &redis.XAddArgs{Stream: "kvrouter:events", Values: []any{"r", "mallory", "d", `{"sessions":[{"key":"s","replica":"http://r0"}]}`}}).Err(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A change b makes with the secret reaches a: the check can pass.
	const good = "http://127.0.0.1:10/good"
	if err := sb.PublishMember(ctx, Member{URL: good, State: MemberServing}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a applies b's sealed member", func() bool { return seen(good) })
	if seen(evil) {
		t.Errorf("a applied the forged member %s", evil)
	}
	// A read may time out (5 ms) on a loaded machine: read until one
	// returns the forged value, which must be refused.
	wait.For(t, "the forged binding read", func() bool {
		if p, ok := sa.ReadSession(ctx, fleet.SessionKey("victim")); ok {
			t.Fatalf("a took the forged session binding %+v", p)
		}
		return rejected(KindSession) > 0
	})
	wait.For(t, "the forged load and stream entry counted", func() bool {
		return rejected(KindLoad) > 0 && rejected(KindEvent) > 0
	})
	if got := sa.f.PeerLoad("http://r0").InFlight; got != 0 {
		t.Errorf("a counts %d requests of the forged router on r0, want 0", got)
	}
	for _, k := range []string{KindMember, KindSession, KindLoad, KindEvent} {
		n := rejected(k)
		if n == 0 {
			t.Errorf("rejected{kind=%s} = 0, want the forged value counted", k)
		}
		t.Logf("rejected{kind=%s} = %v", k, n)
	}
	// b, not the forged router (whose key a round reads and rejects).
	wait.For(t, "a sees one peer", func() bool { return sa.Peers() == 1 })
}

// TestStalledRedis: with Redis stopped (SIGSTOP), a session's read waits
// at most ReadTimeout and its write is off the caller's path: the caller's
// bounded wait (WriteWait) ends while the write is still pending (no
// result counted), and the write lands once Redis resumes.
func TestStalledRedis(t *testing.T) {
	rs := redisserver.Start(t)
	// A 2 s interval makes the syncer's own timeout 4 s: the write's bound,
	// far past the caller's 5 ms.
	s, err := New(Config{Settings: Settings{URL: rs.URL(), Router: "a", Interval: 2 * time.Second, TTL: 40 * time.Second}}, newFleet(t))
	if err != nil {
		t.Fatal(err)
	}
	run(t, s)
	wait.For(t, "up", s.Up)
	count := func(v *prometheus.CounterVec, result string) float64 { return value(v.WithLabelValues(result)) }
	writes := func() float64 {
		return count(s.sm.writes, "ok") + count(s.sm.writes, "error") + count(s.sm.writes, "dropped")
	}
	rs.Stop()
	defer rs.Continue()
	ctx := context.Background()
	if p, ok := s.ReadSession(ctx, "k"); ok {
		t.Fatalf("read %+v from a stopped Redis", p)
	}
	if n := count(s.sm.reads, "timeout"); n != 1 {
		t.Errorf("reads{result=timeout} = %v, want 1", n)
	}
	p := fleet.PeerSession{Replica: "http://r1", Router: "a", At: time.Now()}
	done := s.WriteSession("k", p, time.Minute)
	bound := time.NewTimer(s.WriteWait())
	select {
	case <-done:
		t.Fatal("the write to a stopped Redis reported done")
	case <-bound.C: // the caller's bounded wait ends, the write is pending
	}
	if n := writes(); n != 0 {
		t.Errorf("%v write results counted while Redis is stopped and the write pending, want 0", n)
	}
	rs.Continue()
	<-done
	if n := count(s.sm.writes, "ok"); n != 1 {
		t.Errorf("writes{result=ok} = %v after Redis resumed, want 1", n)
	}
	// The first reads after SIGCONT may time out while Redis works
	// through the commands queued meanwhile.
	wait.For(t, "the binding reads back", func() bool {
		got, ok := s.ReadSession(ctx, "k")
		return ok && got.Replica == p.Replica
	})
}

// TestRedisACLUser: a Redis whose default user may only PING, and an ACL
// user kvrouter with a password: a router with the user and password in
// its URL shares state, one without them does not reach it.
func TestRedisACLUser(t *testing.T) {
	rs := redisserver.Start(t, "--user", "default", "on", "nopass", "-@all", "+ping",
		"--user", "kvrouter", "on", ">s3cret-pass", "~kvrouter:*", "&*", "+@all")
	withUser := newSyncer(t, "redis://kvrouter:s3cret-pass@"+rs.Addr, "a", newFleet(t))
	anonymous := newSyncer(t, rs.URL(), "b", newFleet(t))
	admitted(t, withUser, anonymous)
}

// admitted runs both syncers and checks that ok's rounds reach Redis while
// refused's fail.
func admitted(t *testing.T, ok, refused *Syncer) {
	t.Helper()
	run(t, ok)
	run(t, refused)
	wait.For(t, "the admitted router's rounds reach Redis", ok.Up)
	wait.For(t, "the refused router's rounds fail", func() bool { return refused.m.errors.get() > 0 })
	if refused.Up() {
		t.Error("the refused router is up")
	}
}
