package discover

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
)

// zone is a DNS server's records, changed by the tests while it serves.
type zone struct {
	mu       sync.Mutex
	rrs      map[string][]string // lower-case FQDN → records in zone-file form
	servfail map[string]bool     // names answered SERVFAIL
}

func (z *zone) set(name string, rrs ...string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.rrs[dns.Fqdn(name)] = rrs
}

func (z *zone) drop(name string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	delete(z.rrs, dns.Fqdn(name))
}

func (z *zone) fail(name string, on bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.servfail[dns.Fqdn(name)] = on
}

// ServeDNS answers from the zone: the records of the question's type, NXDOMAIN
// for a name with none of any type.
func (z *zone) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	z.mu.Lock()
	defer z.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	name := strings.ToLower(q.Question[0].Name)
	rrs, ok := z.rrs[name]
	switch {
	case z.servfail[name]:
		m.Rcode = dns.RcodeServerFailure
	case !ok:
		m.Rcode = dns.RcodeNameError
	}
	for _, s := range rrs {
		rr, err := dns.NewRR(name + " 5 IN " + s)
		if err != nil {
			panic(err) // a test's typo
		}
		if rr.Header().Rrtype == q.Question[0].Qtype {
			m.Answer = append(m.Answer, rr)
		}
	}
	w.WriteMsg(m)
}

// startDNS serves z on a UDP socket on loopback and returns a resolver
// that asks it, and nothing else.
func startDNS(t *testing.T, z *zone) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &dns.Server{PacketConn: pc, Handler: z, NotifyStartedFunc: func() { close(started) }}
	go srv.ActivateAndServe()
	<-started
	t.Cleanup(func() { srv.Shutdown() })
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func newZone() *zone { return &zone{rrs: map[string][]string{}, servfail: map[string]bool{}} }

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want Target
		err  string
	}{
		{"dns://vllm.llm.svc.cluster.local:8000", Target{Name: "vllm.llm.svc.cluster.local", Port: 8000, Scheme: "http"}, ""},
		{"dns+srv://_http._tcp.vllm.llm.svc", Target{Name: "_http._tcp.vllm.llm.svc", SRV: true, Scheme: "http"}, ""},
		{"dns://vllm:8443?scheme=https", Target{Name: "vllm", Port: 8443, Scheme: "https"}, ""},
		{"dns://vllm-decode:8000?role=decode", Target{Name: "vllm-decode", Port: 8000, Scheme: "http", Role: route.RoleDecode}, ""},
		{"dns+srv://_http._tcp.vllm-prefill?scheme=https&role=prefill", Target{Name: "_http._tcp.vllm-prefill", SRV: true, Scheme: "https", Role: route.RolePrefill}, ""},
		{"dns://vllm:80?role=prefil", Target{}, `unknown role "prefil"`},
		{"dns://vllm", Target{}, "want dns://name:port"},
		{"dns://vllm:0", Target{}, "1..65535"},
		{"dns://vllm:99999", Target{}, "1..65535"},
		{"dns+srv://_http._tcp.vllm:80", Target{}, "carries its port"},
		{"http://vllm:8000", Target{}, "want dns, dns+srv, k8s or inferencepool"},
		{"k8s://llm/app=vllm,tier=a?port=8000", Target{Kube: KindPods, Namespace: "llm", Selector: "app=vllm,tier=a", Port: 8000, Scheme: "http"}, ""},
		{"k8s:///app=vllm?port=8000&role=decode", Target{Kube: KindPods, Selector: "app=vllm", Port: 8000, Scheme: "http", Role: route.RoleDecode}, ""},
		{"inferencepool://llm/vllm-pool", Target{Kube: KindPool, Namespace: "llm", Pool: "vllm-pool", Scheme: "http"}, ""},
		{"inferencepool://llm/vllm-pool?scheme=https", Target{Kube: KindPool, Namespace: "llm", Pool: "vllm-pool", Scheme: "https"}, ""},
		{"k8s://llm/app=vllm", Target{}, "port="},
		{"k8s://llm/?port=8000", Target{}, "label selector"},
		{"k8s://llm/app.kubernetes.io/name=vllm?port=8000", Target{Kube: KindPods, Namespace: "llm", Selector: "app.kubernetes.io/name=vllm", Port: 8000, Scheme: "http"}, ""},
		{"k8s://llm/tier in (a,b),!canary,app?port=8000", Target{Kube: KindPods, Namespace: "llm", Selector: "tier in (a,b),!canary,app", Port: 8000, Scheme: "http"}, ""},
		{"k8s://llm/tier%20notin%20(a)?port=8000", Target{Kube: KindPods, Namespace: "llm", Selector: "tier notin (a)", Port: 8000, Scheme: "http"}, ""},
		{"k8s://llm/app=vllm,?port=8000", Target{}, "want a key after ','"},
		{"k8s://llm/Example.com/name=vllm?port=8000", Target{}, "DNS subdomain"},
		{"k8s://llm/tier in a?port=8000", Target{}, "want '('"},
		{"inferencepool://llm/pool?port=80", Target{}, "the pool gives the ports"},
		{"inferencepool://llm/", Target{}, "want inferencepool://NAMESPACE/NAME"},
		{"inferencepool://llm:80/pool", Target{}, "want k8s://"},
		{"dns://vllm:80/path", Target{}, "nothing else"},
		{"dns://vllm:80?scheme=ftp", Target{}, "want http or https"},
		{"dns://:80", Target{}, "no name"},
	}
	for _, tt := range tests {
		got, err := Parse(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Parse(%q) error %v, want one containing %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
		if back, _ := Parse(got.String()); back != got {
			t.Errorf("Parse(%q).String() = %q does not parse back", tt.in, got.String())
		}
	}
}

// recorder is an OnChange that keeps every list.
type recorder struct {
	mu    sync.Mutex
	lists [][]string
}

func (r *recorder) onChange(urls []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists = append(r.lists, urls)
}

func (r *recorder) all() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]string(nil), r.lists...)
}

func TestAddressRecords(t *testing.T) {
	z := newZone()
	name := "vllm-headless.llm.svc.cluster.local"
	z.set(name, "A 10.0.0.2", "A 10.0.0.1", "AAAA fd00::7")
	var rec recorder
	d, err := New(Config{Target: Target{Name: name, Port: 8000, Scheme: "http"}, Resolver: startDNS(t, z), OnChange: rec.onChange})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	steps := []struct {
		name   string
		change func()
		err    bool
	}{
		{"first", func() {}, false},
		{"unchanged", func() {}, false},
		{"pod gone, pod added", func() { z.set(name, "A 10.0.0.1", "A 10.0.0.3", "AAAA fd00::7") }, false},
		{"server failure keeps the list", func() { z.fail(name, true) }, true},
		{"back", func() { z.fail(name, false) }, false},
		{"no such name: empty", func() { z.drop(name) }, false},
	}
	for _, s := range steps {
		s.change()
		if err := d.Once(ctx); (err != nil) != s.err {
			t.Errorf("%s: error %v, want error %v", s.name, err, s.err)
		}
	}
	want := [][]string{
		{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::7]:8000"},
		{"http://10.0.0.1:8000", "http://10.0.0.3:8000", "http://[fd00::7]:8000"},
		{},
	}
	if diff := cmp.Diff(want, rec.all()); diff != "" {
		t.Errorf("lists (-want +got):\n%s", diff)
	}
}

func TestSRVRecords(t *testing.T) {
	z := newZone()
	z.set("_http._tcp.vllm.llm.svc", "SRV 0 50 8001 pod-a.vllm.llm.svc.", "SRV 0 50 8002 pod-b.vllm.llm.svc.")
	z.set("pod-a.vllm.llm.svc", "A 10.1.0.1")
	z.set("pod-b.vllm.llm.svc", "A 10.1.0.2", "AAAA fd00::2")
	tg, err := Parse("dns+srv://_http._tcp.vllm.llm.svc?scheme=https")
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Target: tg, Resolver: startDNS(t, z), OnChange: func([]string) {}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.Resolve(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"https://10.1.0.1:8001", "https://10.1.0.2:8002", "https://[fd00::2]:8002"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("urls (-want +got):\n%s", diff)
	}
}

// TestRunResolvesAgain runs the loop: a change in DNS reaches OnChange
// within an interval or two, and Run ends with its context.
func TestRunResolvesAgain(t *testing.T) {
	z := newZone()
	z.set("vllm.test", "A 10.0.0.1")
	var rec recorder
	d, err := New(Config{Target: Target{Name: "vllm.test", Port: 80, Scheme: "http"}, Interval: 20 * time.Millisecond,
		Resolver: startDNS(t, z), OnChange: rec.onChange})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	wait.For(t, "one backend list", func() bool { return len(rec.all()) == 1 })
	z.set("vllm.test", "A 10.0.0.1", "A 10.0.0.9")
	wait.For(t, "two backend lists", func() bool { return len(rec.all()) == 2 })
	cancel()
	if err := <-done; err != context.Canceled {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}
	if got := rec.all()[1]; len(got) != 2 || got[1] != "http://10.0.0.9:80" {
		t.Errorf("second list %v, want 10.0.0.1 and 10.0.0.9", got)
	}
}
