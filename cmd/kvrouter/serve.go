package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"kvrouter/proxy"
)

// runServe runs the live router until ctx is done.
func runServe(ctx context.Context, args []string) error {
	cfg, err := loadServeConfig(args, osGetenv, os.Stderr)
	if err != nil {
		return err
	}
	level, _ := proxy.ParseLogLevel(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rt, err := proxy.New(cfg, proxy.Deps{Registry: reg, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	srv := &http.Server{Handler: rt.Handler(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("kvrouter serving", "listen", ln.Addr().String(), "policy", rt.Policy(), "backends", rt.Replicas(),
		"dashboard", "http://"+ln.Addr().String()+"/ui/")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var runErr error
	wg.Go(func() { runErr = rt.Run(ctx) })
	serveErr := make(chan error, 1)
	wg.Go(func() { serveErr <- srv.Serve(ln) })
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	cancel()
	wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return runErr
}
