package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/kube"
	"github.com/kvrouter/kvrouter/proxy"
)

// DefaultEPPListen is the endpoint picker's gRPC address when --listen is
// not given: GIE's conventional ext_proc port.
const DefaultEPPListen = ":9002"

// eppFlags are the flags only `kvrouter epp` has, beside serve's
// (backends, policy, KV events, limits, admin surface), with --listen the
// gRPC address. Like serve's, each is also a KVROUTER_* variable and a
// key of the --config file.
type eppFlags struct {
	bodyMode    epp.BodyMode
	idleTimeout time.Duration
	fallbacks   int
	// poolName and poolNamespace name the InferencePool followed (GIE's
	// EPP flags); empty name: none, empty namespace: the pod's own.
	poolName, poolNamespace string
	// leaderElect runs leader election over the Lease leaseName.
	leaderElect bool
	leaseName   string
}

// bind binds f's flags on fs, each set to its default.
func (f *eppFlags) bind(fs *flag.FlagSet) {
	f.bodyMode = epp.FullDuplex
	fs.Var((*bodyModeFlag)(&f.bodyMode), "body-mode",
		"the ext_proc filter's request_body_mode when Envoy does not send its protocol_config, a `mode`: full-duplex (FULL_DUPLEX_STREAMED, the default) or buffered")
	fs.DurationVar(&f.idleTimeout, "epp-idle-timeout", epp.DefaultIdleTimeout,
		"the longest a routed request's stream may be silent once its response started before it is ended (before the response headers: --ttft-timeout)")
	fs.Var(nonNegative{&f.fallbacks}, "fallbacks",
		"`n` endpoints named after the picked one in x-gateway-destination-endpoint (GIE's list, primary first), for a data plane that tries them in order when it cannot reach the first; 0: none, as an Envoy ORIGINAL_DST cluster reading the header takes one address")
	fs.StringVar(&f.poolName, "pool-name", "",
		"the InferencePool (inference.networking.k8s.io/v1) whose ready pods are the backends, at its target ports, watched in the Kubernetes API (--kube-api, or in-cluster); instead of --discover and --backend")
	fs.StringVar(&f.poolNamespace, "pool-namespace", "", "the InferencePool's namespace (empty: the pod's own)")
	fs.Var(poolGroupFlag{}, "pool-group", "the InferencePool's API `group`, accepted for GIE's picker's command line; only InferencePool v1 ("+kube.PoolGroup+") is followed")
	fs.BoolVar(&f.leaderElect, "leader-elect", false,
		"elect a leader among the picker's replicas over a coordination.k8s.io/v1 Lease: only the leader reports ready (readiness, inference-extension, ext_proc and \"\" health services), followers keep their state warm")
	fs.BoolVar(&f.leaderElect, "ha-enable-leader-election", false, "GIE's picker's name of --leader-elect")
	fs.StringVar(&f.leaseName, "lease-name", "",
		"the Lease of --leader-elect, in the pool's namespace (empty: kvrouter-epp-POOL, or kvrouter-epp without a pool); the identity is $POD_NAME (else the host name) with a random suffix")
}

// apply checks f's flags together and sets what they mean in cfg: the
// pool is the discovery.
func (f *eppFlags) apply(cfg *proxy.Config) error {
	if f.poolName == "" && f.poolNamespace != "" {
		return errors.New("--pool-namespace needs --pool-name")
	}
	if f.poolName != "" {
		if cfg.Discover != "" {
			return errors.New("--pool-name and --discover: give one (the pool is the discovery)")
		}
		cfg.Discover = "inferencepool://" + f.poolNamespace + "/" + f.poolName
	}
	return nil
}

// bodyModeFlag is --body-mode.
type bodyModeFlag epp.BodyMode

func (b *bodyModeFlag) String() string {
	if b == nil || epp.BodyMode(*b) == epp.FullDuplex {
		return "full-duplex"
	}
	return "buffered"
}

func (b *bodyModeFlag) Set(s string) error {
	m, err := parseBodyMode(s)
	*b = bodyModeFlag(m)
	return err
}

// nonNegative is an int flag that refuses negative values.
type nonNegative struct{ n *int }

func (v nonNegative) String() string {
	if v.n == nil {
		return "0"
	}
	return strconv.Itoa(*v.n)
}

func (v nonNegative) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err == nil && n < 0 {
		err = fmt.Errorf("must not be negative, got %d", n)
	}
	if err == nil {
		*v.n = n
	}
	return err
}

// poolGroupFlag is --pool-group: GIE's picker's, whose only value here is
// the v1 API's group.
type poolGroupFlag struct{}

func (poolGroupFlag) String() string { return kube.PoolGroup }

func (poolGroupFlag) Set(s string) error {
	if s != kube.PoolGroup {
		return fmt.Errorf("only %s (InferencePool v1) is supported, got %q", kube.PoolGroup, s)
	}
	return nil
}

func parseBodyMode(s string) (epp.BodyMode, error) {
	switch strings.ToLower(s) {
	case "full-duplex", "full_duplex_streamed", "streamed":
		return epp.FullDuplex, nil
	case "buffered":
		return epp.Buffered, nil
	}
	return 0, fmt.Errorf("unknown body mode %q (full-duplex or buffered)", s)
}

var eppHelp = help{
	synopsis: "kvrouter epp (--pool-name NAME | --backend URL ... | --discover URL) [flags]",
	about: "Runs the router as a Gateway API Inference Extension endpoint picker: an Envoy\n" +
		"ext_proc gRPC server on --listen (default " + DefaultEPPListen + ") that reads each request's body,\n" +
		"picks the replica with the same policy and fleet code as serve, and answers with\n" +
		"the x-gateway-destination-endpoint header and envoy.lb metadata (the picked\n" +
		"endpoint, then --fallbacks others); Envoy forwards. Its own flags are listed\n" +
		"first; it takes serve's too (backends, policy, KV events, admin surface). Every\n" +
		"flag can also be set as KVROUTER_<FLAG> or as a key of the --config YAML file.\n" +
		"Precedence: flags > environment > file > defaults.",
	examples: []string{
		"kvrouter epp --pool-name vllm --pool-namespace llm --leader-elect",
		"kvrouter epp --backend http://10.0.0.1:8000 --backend http://10.0.0.2:8000",
		"kvrouter epp --listen :9002 --policy kv-aware --config kvrouter.yaml",
	},
}

// flagGiven reports whether args set the flag name.
func flagGiven(args []string, name string) bool {
	for _, a := range args {
		if n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && n == name {
			return true
		}
	}
	return false
}

// listenGiven reports whether the gRPC address was set on the command
// line or in the environment.
func listenGiven(args []string) bool {
	return flagGiven(args, "listen") || os.Getenv(envName("listen")) != ""
}

// runEPP runs the endpoint picker (Envoy ext_proc, Gateway API Inference
// Extension protocol) until SIGINT or SIGTERM: the same router state as
// serve (backends, scrapes, health, KV events), no HTTP API, the admin
// surface on --admin-listen.
func runEPP(ctx context.Context, args []string) error {
	var ef eppFlags
	cfg, err := loadConfig("epp", eppHelp, args, osGetenv, os.Stderr, &ef)
	if err != nil {
		return err
	}
	if !listenGiven(args) && cfg.Listen == proxy.DefaultListen {
		cfg.Listen = DefaultEPPListen
	}
	level, _ := proxy.ParseLogLevel(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tlsCfg, err := proxy.ServerTLS(cfg)
	if err != nil {
		return err
	}
	rt, err := proxy.New(cfg, proxy.Deps{Registry: reg, Logger: log})
	if err != nil {
		return err
	}
	s, err := epp.New(rt, epp.Config{MaxBodyBytes: cfg.MaxBodyBytes, BodyTimeout: cfg.BodyTimeout,
		IdleTimeout: ef.idleTimeout, BodyMode: ef.bodyMode, Fallbacks: ef.fallbacks, Elected: ef.leaderElect}, reg, log)
	if err != nil {
		return err
	}
	dm, err := newDynMetrics(reg)
	if err != nil {
		return err
	}
	disc, err := newDiscoverer(cfg, rt, dm, log)
	if err != nil {
		return err
	}
	elect, err := newElection(cfg, ef, s, log)
	if err != nil {
		return err
	}
	if elect != nil { // the admin listener's /readyz follows leadership too, as the gRPC health service does
		rt.SetReadyGate(func() string {
			if !s.Leader() {
				return "another endpoint picker leads (--leader-elect)"
			}
			return ""
		})
	}
	objectives, err := followObjectives(cfg, ef, s, log)
	if err != nil {
		return err
	}
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	g := s.NewGRPCServer(opts...)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	admin, adminLn, err := adminServer(cfg, rt, tlsCfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	attrs := []any{"listen", ln.Addr().String(), "tls", tlsCfg != nil, "policy", rt.Policy(), "backends", rt.Replicas()}
	if adminLn != nil {
		attrs = append(attrs, "admin", adminLn.Addr().String())
	}
	log.Info("kvrouter endpoint picker serving", attrs...)

	bg, stopBg := context.WithCancel(context.Background())
	defer stopBg()
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = rt.Run(bg) })
	wg.Go(func() { s.Run(bg) })
	if disc != nil {
		wg.Go(func() { _ = disc.Run(bg) })
	}
	electCtx, stopElect := context.WithCancel(context.Background())
	defer stopElect()
	if elect != nil {
		wg.Go(func() { _ = elect.Run(electCtx) })
	}
	if objectives != nil {
		wg.Go(func() { _ = objectives(bg) })
	}
	serveErr := make(chan error, 2)
	wg.Go(func() { serveErr <- g.Serve(ln) })
	if admin != nil {
		wg.Go(func() { serveErr <- serve(admin, adminLn) })
	}
	select {
	case <-ctx.Done():
		log.Info("kvrouter endpoint picker stopping", "cause", context.Cause(ctx).Error())
	case err = <-serveErr:
		log.Error("kvrouter endpoint picker serving failed", "err", err)
	}
	stopElect() // hand the lease over at once: a follower becomes ready while this one drains
	stopGRPC(g, cfg.DrainTimeout)
	if admin != nil {
		admin.Close()
	}
	stopBg()
	wg.Wait()
	if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return runErr
}

// newElection returns the --leader-elect campaign (nil without it) over
// the Lease --lease-name (default kvrouter-epp, with the pool's name
// when there is one) in the pool's namespace (default the pod's), as
// POD_NAME (else the host name) with a suffix of its own; it makes s the leader while it holds the
// lease.
func newElection(cfg proxy.Config, ef eppFlags, s *epp.Server, log *slog.Logger) (*kube.Election, error) {
	if !ef.leaderElect {
		return nil, nil
	}
	kc, err := kubeClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("--leader-elect: %w", err)
	}
	ns := cmp.Or(ef.poolNamespace, kube.Namespace())
	if ns == "" {
		return nil, errors.New("--leader-elect: no namespace for the lease: give --pool-namespace")
	}
	name := ef.leaseName
	if name == "" {
		name = "kvrouter-epp"
		if ef.poolName != "" {
			name += "-" + ef.poolName
		}
	}
	id := os.Getenv("POD_NAME")
	if id == "" {
		if id, err = os.Hostname(); err != nil {
			return nil, fmt.Errorf("--leader-elect: identity: %w", err)
		}
	}
	id += "_" + rand.Text()[:8] // client-go's habit: one identity per run
	return &kube.Election{Client: kc, Namespace: ns, Name: name, Identity: id, OnChange: s.SetLeader, Logger: log}, nil
}

// followObjectives returns the loop that follows the pool's
// InferenceObjectives into s (nil without --pool-name).
func followObjectives(cfg proxy.Config, ef eppFlags, s *epp.Server, log *slog.Logger) (func(context.Context) error, error) {
	if ef.poolName == "" {
		return nil, nil
	}
	kc, err := kubeClient(cfg)
	if err != nil {
		return nil, err
	}
	ns := cmp.Or(ef.poolNamespace, kube.Namespace())
	return func(ctx context.Context) error {
		return kc.FollowObjectives(ctx, ns, ef.poolName, s.SetObjectives, log)
	}, nil
}

// stopGRPC lets the streams in flight (requests Envoy is forwarding) end
// for up to timeout, then closes the rest.
func stopGRPC(g *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
		g.Stop()
		<-done
	}
}
