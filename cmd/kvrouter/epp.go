package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/proxy"
)

// DefaultEPPListen is the endpoint picker's gRPC address when --listen is
// not given: GIE's conventional ext_proc port.
const DefaultEPPListen = ":9002"

// eppFlags are the flags only `kvrouter epp` has; every other flag is
// serve's (backends, policy, KV events, limits, admin surface), with
// --listen the gRPC address.
type eppFlags struct {
	bodyMode    epp.BodyMode
	idleTimeout time.Duration
}

// splitEPPFlags takes --body-mode and --epp-idle-timeout (as -name=v,
// --name=v, -name v or --name v) out of args and returns the rest.
func splitEPPFlags(args []string) (eppFlags, []string, error) {
	var f eppFlags
	var rest []string
	for i := 0; i < len(args); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || (name != "body-mode" && name != "epp-idle-timeout") {
			rest = append(rest, args[i])
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return f, nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			val = args[i]
		}
		var err error
		switch name {
		case "body-mode":
			f.bodyMode, err = parseBodyMode(val)
		case "epp-idle-timeout":
			f.idleTimeout, err = time.ParseDuration(val)
		}
		if err != nil {
			return f, nil, fmt.Errorf("--%s: %w", name, err)
		}
	}
	return f, rest, nil
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

// listenGiven reports whether the gRPC address was set on the command
// line or in the environment.
func listenGiven(args []string) bool {
	for _, a := range args {
		if n, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && n == "listen" {
			return true
		}
	}
	return os.Getenv(envName("listen")) != ""
}

// runEPP runs the endpoint picker (Envoy ext_proc, Gateway API Inference
// Extension protocol) until SIGINT or SIGTERM: the same router state as
// serve (backends, scrapes, health, KV events), no HTTP API, the admin
// surface on --admin-listen.
func runEPP(ctx context.Context, args []string) error {
	ef, rest, err := splitEPPFlags(args)
	if err != nil {
		return err
	}
	cfg, err := loadServeConfig(rest, osGetenv, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "\nkvrouter epp also takes --body-mode full-duplex|buffered (the ext_proc filter's request_body_mode when Envoy does not say; default full-duplex)")
			fmt.Fprintln(os.Stderr, "and --epp-idle-timeout (longest a routed request's stream may be silent; default "+epp.DefaultIdleTimeout.String()+"); --listen is the gRPC address (default "+DefaultEPPListen+").")
		}
		return err
	}
	if !listenGiven(rest) && cfg.Listen == proxy.DefaultListen {
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
		IdleTimeout: ef.idleTimeout, BodyMode: ef.bodyMode}, reg, log)
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
