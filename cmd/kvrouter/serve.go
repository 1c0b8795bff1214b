package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/tracing"
)

// cutGrace is how long the requests a drain ended get to unwind (their
// handlers return, their connections close) before the servers close
// every connection.
const cutGrace = 5 * time.Second

// runServe runs the live router until SIGTERM or SIGINT (or ctx is done),
// then drains it: see drain. SIGHUP, or a change of the --config file,
// reloads the backend list (dynamic.go), SIGHUP also reopens the
// --record file; --discover finds backends in DNS.
func runServe(ctx context.Context, args []string) error {
	return serveTo(ctx, args, osGetenv, os.Stderr)
}

// serveTo is runServe with the environment read by getenv and the log
// written to stderr.
func serveTo(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	cfg, err := loadServeConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	log := newLogger(stderr, cfg.LogLevel, cfg.LogFormat)
	tp, err := tracing.Start(ctx, tracing.Config{Endpoint: cfg.OTLPEndpoint, Getenv: getenv, Logger: log})
	if err != nil {
		return err
	}
	defer flushTraces(tp, log) // on early returns; a second flush does nothing
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tlsCfg, err := proxy.ServerTLS(cfg)
	if err != nil {
		return err
	}
	rt, err := proxy.New(cfg, proxy.Deps{Registry: reg, Logger: log, TracerProvider: tp.TracerProvider()})
	if err != nil {
		return err
	}
	dm, err := newDynMetrics(reg)
	if err != nil {
		return err
	}
	reload := newReloader(args, osGetenv, cfg, rt, dm, log)
	disc, err := newDiscoverer(cfg, rt, dm, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := rt.NewServer()
	srv.TLSConfig = tlsCfg
	admin, adminLn, err := adminServer(cfg, rt, tlsCfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	logStart(log, cfg, rt, ln, adminLn, tlsCfg != nil, tp.Endpoint())
	logUnknownEnv(log)

	bg, stopBg := context.WithCancel(context.Background()) // the loops outlive the signal: streams still need them
	defer stopBg()
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = rt.Run(bg) })
	wg.Go(func() { runDynamic(bg, reload, cfg.ConfigPollInterval, disc) })
	serveErr := make(chan error, 2)
	wg.Go(func() { serveErr <- serve(srv, ln) })
	if admin != nil {
		wg.Go(func() { serveErr <- serve(admin, adminLn) })
	}
	err = waitStop(ctx, sigs, serveErr, log, func() {
		rt.ReopenRecording()
		reload.reload("sighup")
	})
	drainErr := drain(srv, rt, cfg.DrainTimeout, sigs, log)
	if admin != nil {
		admin.Close()
	}
	stopBg()
	wg.Wait()
	flushTraces(tp, log)
	log.Info("kvrouter stopped", "drained", drainErr == nil)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	if drainErr != nil {
		return drainErr
	}
	return runErr
}

// serve serves srv on ln, over TLS when srv has a TLS configuration.
func serve(srv *http.Server, ln net.Listener) error {
	if srv.TLSConfig != nil {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}

// adminServer listens on --admin-listen and returns the admin surface's
// server (nil without one). The address must be free, the default too:
// a router that ran without its dashboard while the documented address
// showed another process's page would mislead.
func adminServer(cfg proxy.Config, rt *proxy.Router, tlsCfg *tls.Config, log *slog.Logger) (*http.Server, net.Listener, error) {
	if cfg.AdminListen == "" {
		return nil, nil, nil
	}
	ln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		return nil, nil, fmt.Errorf("admin-listen %s (the dashboard, /metrics, the admin API): %w; "+
			"another process (another router?) holds it: give --admin-listen another address, or --admin-listen \"\" for none", cfg.AdminListen, err)
	}
	if cfg.AdminAPIKeys == "" && !isLoopback(ln.Addr()) {
		log.Warn("admin surface reachable beyond this host without a key: set --admin-api-keys", "admin_listen", ln.Addr().String())
	}
	admin := rt.NewAdminServer()
	admin.TLSConfig = tlsCfg
	return admin, ln, nil
}

func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// logStart logs the startup line: where each surface is and what guards it.
func logStart(log *slog.Logger, cfg proxy.Config, rt *proxy.Router, ln, adminLn net.Listener, tls bool, traces string) {
	scheme := "http://"
	if tls {
		scheme = "https://"
	}
	attrs := []any{"listen", ln.Addr().String(), "tls", tls, "policy", rt.Policy(), "backends", rt.Replicas(),
		"api_keys", cfg.APIKeys != "", "pass_through", cfg.PassThrough, "drain_timeout", cfg.DrainTimeout, "traces", traces}
	if adminLn != nil {
		attrs = append(attrs, "admin", adminLn.Addr().String(), "admin_keys", cfg.AdminAPIKeys != "",
			"dashboard", scheme+adminLn.Addr().String()+"/ui/")
	}
	log.Info("kvrouter serving", attrs...)
}

// waitStop waits for SIGTERM or SIGINT, ctx's end or a server's failure
// (returned). SIGHUP calls hup (a reload).
func waitStop(ctx context.Context, sigs <-chan os.Signal, serveErr <-chan error, log *slog.Logger, hup func()) error {
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGHUP {
				log.Info("SIGHUP received: reloading the configuration")
				hup()
				continue
			}
			log.Info("kvrouter stopping", "signal", s.String())
			return nil
		case <-ctx.Done():
			log.Info("kvrouter stopping", "cause", context.Cause(ctx).Error())
			return nil
		case err := <-serveErr:
			log.Error("kvrouter serving failed", "err", err)
			return err
		}
	}
}

func logHangup(log *slog.Logger) {
	log.Warn("SIGHUP received while draining: not reloading")
}

// drain stops the router gracefully: it turns unready (/readyz 503),
// stops accepting connections and lets the requests in flight finish for
// up to timeout, logging their number every few seconds. Those still in
// flight then are ended (a stream with a final SSE error event) and drain
// returns an error saying so; a second SIGTERM or SIGINT ends them at once.
func drain(srv *http.Server, rt *proxy.Router, timeout time.Duration, sigs <-chan os.Signal, log *slog.Logger) error {
	rt.Drain()
	start := time.Now()
	log.Info("draining: unready, no new connections; requests in flight may finish",
		"in_flight", rt.InFlight(), "drain_timeout", timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	tick := time.NewTicker(progressEvery(timeout))
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				log.Info("drain complete", "took", time.Since(start).Round(time.Millisecond))
				return nil
			}
			return cutRest(srv, rt, time.Since(start), log)
		case <-tick.C:
			log.Info("draining", "in_flight", rt.InFlight(), "elapsed", time.Since(start).Round(time.Second),
				"left", (timeout - time.Since(start)).Round(time.Second))
		case s := <-sigs:
			if s == syscall.SIGHUP {
				logHangup(log)
				continue
			}
			log.Warn("second signal: ending the requests in flight now", "signal", s.String())
			cancel()
		}
	}
}

// cutRest ends the requests a drain left in flight and closes the server.
func cutRest(srv *http.Server, rt *proxy.Router, after time.Duration, log *slog.Logger) error {
	after = after.Round(time.Millisecond)
	n := rt.CutInFlight(fmt.Sprintf("the router is shutting down: this request was ended after %s of draining", after))
	log.Warn("drain incomplete: requests in flight ended with an error", "ended", n, "after", after)
	ctx, cancel := context.WithTimeout(context.Background(), cutGrace)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		srv.Close()
	}
	return fmt.Errorf("drain incomplete: %d requests in flight ended after %s", n, after)
}

// progressEvery is the interval of a drain's progress lines: a tenth of
// the timeout, within 1..5 s.
func progressEvery(timeout time.Duration) time.Duration {
	return min(max(timeout/10, time.Second), 5*time.Second)
}
