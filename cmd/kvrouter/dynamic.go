package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/discover"
	"github.com/kvrouter/kvrouter/kube"
	"github.com/kvrouter/kvrouter/proxy"
)

// defaultConfigPoll is how often the --config file is checked for a
// change when ConfigPollInterval is zero.
const defaultConfigPoll = 2 * time.Second

// dynamicFlags binds the flags of a fleet that changes while the router
// runs.
func dynamicFlags(fs *flag.FlagSet, cfg *proxy.Config) {
	fs.IntVar(&cfg.MaxBackends, "max-backends", cfg.MaxBackends,
		fmt.Sprintf("most backends at once, added ones included (admin API, reload, discovery); 0: max(backends given, %d)", proxy.DefaultMaxBackends))
	fs.StringVar(&cfg.Discover, "discover", cfg.Discover,
		"find backends in DNS, re-resolved every --discover-interval: dns://NAME:PORT (A/AAAA records) or dns+srv://_SERVICE._PROTO.NAME (SRV records); or watch them in the Kubernetes API: k8s://NAMESPACE/SELECTOR?port=PORT (ready pods of a label selector such as app=vllm) or inferencepool://NAMESPACE/NAME (ready pods of a Gateway API Inference Extension v1 InferencePool, at its target ports; docs/kubernetes.md); ?scheme=https for TLS backends, ?role=prefill|decode|both for their role (docs/disaggregation.md; both: &)")
	fs.DurationVar(&cfg.DiscoverInterval, "discover-interval", cfg.DiscoverInterval, "how often a dns:// or dns+srv:// --discover is resolved again (0: 10s)")
	fs.StringVar(&cfg.KubeAPI, "kube-api", cfg.KubeAPI,
		"the Kubernetes API server's URL for k8s:// and inferencepool:// discovery and the endpoint picker's leader election, no credentials sent (kubectl proxy's, say); empty: the pod's service account (in-cluster)")
	fs.DurationVar(&cfg.ConfigPollInterval, "config-poll-interval", cfg.ConfigPollInterval,
		"how often the --config file is checked for a change, reloaded as on SIGHUP (0: 2s; negative: SIGHUP only)")
}

// dynMetrics counts reloads and discovery resolutions.
type dynMetrics struct {
	reloads     *prometheus.CounterVec // trigger, result
	resolutions *prometheus.CounterVec // result
}

func newDynMetrics(reg prometheus.Registerer) (*dynMetrics, error) {
	m := &dynMetrics{
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_config_reloads_total",
			Help: "Reloads of the --config file (trigger: sighup, change) by result (ok; error: invalid, the running configuration kept).",
		}, []string{"trigger", "result"}),
		resolutions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_discover_resolutions_total",
			Help: "Resolutions of --discover by result: DNS lookups, and the endpoint lists a Kubernetes watch delivers (ok; error: the last backend list kept).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.reloads, m.resolutions} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func outcomeOf(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// reloader reloads the configuration: the same flags, environment and
// file as at start, read by loadServeConfig, whose backend list is then
// applied (proxy.Router.SetBackends: added, drained and removed as
// needed). An invalid configuration is logged and counted, and the
// running one kept. Settings other than the backend list apply only at
// start: a reload that changes one is refused as invalid, naming it.
type reloader struct {
	args   []string
	getenv func(string) string
	rt     *proxy.Router
	log    *slog.Logger
	m      *dynMetrics
	path   string // the --config file; "" for none

	// mu serialises reloads and guards cur and stamp.
	mu    sync.Mutex
	cur   proxy.Config
	stamp fileStamp
}

// fileStamp is what tells a file changed.
type fileStamp struct {
	mod  time.Time
	size int64
	ok   bool
}

func stampFile(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size(), ok: true}
}

func newReloader(args []string, getenv func(string) string, cfg proxy.Config, rt *proxy.Router, m *dynMetrics, log *slog.Logger) *reloader {
	r := &reloader{args: args, getenv: getenv, rt: rt, log: log, m: m, cur: cfg, path: configPath(args, getenv)}
	if r.path != "" {
		r.stamp = stampFile(r.path)
	}
	return r
}

// configPath returns the --config file args or the environment name.
func configPath(args []string, getenv func(string) string) string {
	scratch := proxy.DefaultConfig()
	var path string
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	serveFlags(fs, &scratch, &path)
	fs.Parse(args) // parsed once already, at start
	if path == "" {
		path = getenv(envName("config"))
	}
	return path
}

// reload reads the configuration again and applies its backend list.
func (r *reloader) reload(trigger string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.path != "" {
		r.stamp = stampFile(r.path)
	}
	cfg, err := loadServeConfig(r.args, r.getenv, io.Discard)
	if err != nil {
		r.m.reloads.WithLabelValues(trigger, "error").Inc()
		r.log.Error("config reload failed: keeping the running configuration", "trigger", trigger, "config", r.path, "err", err)
		return err
	}
	if moved := changedSettings(r.cur, cfg); len(moved) > 0 {
		err := fmt.Errorf("config reload: %s changed, which applies only at start: restart to apply it, or undo the change; the running configuration kept, backends included", strings.Join(moved, ", "))
		r.m.reloads.WithLabelValues(trigger, "error").Inc()
		r.log.Error(err.Error(), "trigger", trigger, "config", r.path, "settings", moved)
		return err
	}
	err = r.rt.SetBackends(cfg.Backends, proxy.SourceConfig)
	r.m.reloads.WithLabelValues(trigger, outcomeOf(err)).Inc()
	r.log.Info("config reloaded", "trigger", trigger, "config", r.path, "backends", len(cfg.Backends), "err", err)
	if err == nil {
		r.cur = cfg
	}
	return err
}

// changedSettings names (by their YAML keys) the settings but the backend
// list that differ between old and cfg.
func changedSettings(old, cfg proxy.Config) []string {
	return changedFields(nil, reflect.ValueOf(old), reflect.ValueOf(cfg))
}

// changedFields appends to out the YAML keys of the fields of structs a
// and b that differ, looking into the inline ones.
func changedFields(out []string, a, b reflect.Value) []string {
	for i := range a.NumField() {
		f := a.Type().Field(i)
		key, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case key == "backend" || key == "-" || !f.IsExported():
			continue
		case opts == "inline" && f.Type.Kind() == reflect.Struct:
			out = changedFields(out, a.Field(i), b.Field(i))
			continue
		case key == "":
			key = f.Name
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			out = append(out, key)
		}
	}
	return out
}

// watch checks the file every interval and reloads it when it changed,
// until ctx is done.
func (r *reloader) watch(ctx context.Context, every time.Duration) {
	if r.path == "" || every < 0 {
		return
	}
	if every == 0 {
		every = defaultConfigPoll
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		changed := stampFile(r.path) != r.stamp
		r.mu.Unlock()
		if changed {
			r.reload("change")
		}
	}
}

// newDiscoverer returns the --discover loop, applying each list through
// SetBackends; nil without --discover.
func newDiscoverer(cfg proxy.Config, rt *proxy.Router, m *dynMetrics, log *slog.Logger) (*discover.Discoverer, error) {
	if cfg.Discover == "" {
		return nil, nil
	}
	tg, err := discover.Parse(cfg.Discover)
	if err != nil {
		return nil, err
	}
	var kc *kube.Client
	if tg.Kube != "" {
		if kc, err = kubeClient(cfg); err != nil {
			return nil, err
		}
	}
	return discover.New(discover.Config{
		Target:   tg,
		Interval: cfg.DiscoverInterval,
		Kube:     kc,
		Logger:   log,
		OnChange: func(urls []string) {
			bes := make([]proxy.Backend, len(urls))
			for i, u := range urls {
				bes[i] = proxy.Backend{URL: u, Role: tg.Role}
			}
			err := rt.SetBackends(bes, proxy.SourceDiscover)
			log.Info("discovered backends", "target", tg.String(), "backends", urls, "err", err)
		},
		OnResolve: func(err error) { m.resolutions.WithLabelValues(outcomeOf(err)).Inc() },
	})
}

// kubeClient returns the Kubernetes API client: --kube-api's, or the
// pod's in-cluster one.
func kubeClient(cfg proxy.Config) (*kube.Client, error) {
	kcfg := kube.Config{Server: cfg.KubeAPI}
	if cfg.KubeAPI == "" {
		var err error
		if kcfg, err = kube.InCluster(os.Getenv); err != nil {
			return nil, err
		}
	}
	return kube.New(kcfg)
}

// runDynamic runs the config watch and the discovery loop until ctx is
// done, and joins them.
func runDynamic(ctx context.Context, r *reloader, every time.Duration, d *discover.Discoverer) {
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(ctx, every) })
	if d != nil {
		wg.Go(func() {
			if err := d.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				r.log.Error("discovery stopped", "err", err)
			}
		})
	}
	wg.Wait()
}
