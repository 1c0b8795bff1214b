package main

// The generated references: docs/configuration.md, written from the
// subcommands' own FlagSets and the YAML keys of proxy.Config, and
// docs/metrics.md, written from the Prometheus collectors the router
// registers. TestGeneratedDocs fails when either file is stale; the hidden
// subcommand "kvrouter gendocs" (go generate ./cmd/kvrouter) rewrites them.

//go:generate go run . gendocs --dir ../../docs

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	kvepp "github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/proxy"
)

// writeDocsArg, as a subcommand's only argument, makes parseFlags hand
// back the subcommand's FlagSet (a *flagSetRequest error) instead of
// parsing: "kvrouter serve --write-documentation" prints serve's table.
const writeDocsArg = "--write-documentation"

// flagSetRequest is the error parseFlags returns for writeDocsArg.
type flagSetRequest struct{ fs *flag.FlagSet }

func (r *flagSetRequest) Error() string {
	return "the flags of " + r.fs.Name() + " were asked for (" + writeDocsArg + ")"
}

// flagSetOf runs a subcommand with writeDocsArg and returns its FlagSet,
// defaults and all, as the subcommand builds it.
func flagSetOf(run func(context.Context, []string) error) (*flag.FlagSet, error) {
	err := run(context.Background(), []string{writeDocsArg})
	var r *flagSetRequest
	if !errors.As(err, &r) {
		return nil, fmt.Errorf("the subcommand did not hand back its flags: %v", err)
	}
	return r.fs, nil
}

// docCommands are the subcommands whose flags docs/configuration.md lists,
// in its order.
var docCommands = []string{"serve", "epp", "engine", "sim", "plan", "calibrate", "replay", "demo"}

// configFileKeys are the keys of the --config file: the yaml names of
// proxy.Config's fields, inline structs flattened, other nested structs
// as "outer.inner".
func configFileKeys() []string {
	var keys []string
	var walk func(t reflect.Type, prefix string)
	unmarshaler := reflect.TypeFor[yaml.Unmarshaler]()
	walk = func(t reflect.Type, prefix string) {
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			tag := f.Tag.Get("yaml")
			name, opts, _ := strings.Cut(tag, ",")
			if name == "-" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if strings.Contains(","+opts+",", ",inline,") {
				walk(ft, prefix)
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshaler) && !ft.Implements(unmarshaler) {
				walk(ft, prefix+name+".")
				continue
			}
			keys = append(keys, prefix+name)
		}
	}
	walk(reflect.TypeFor[proxy.Config](), "")
	return keys
}

// yamlKeyOf is the config file's key for the serve flag name: the key
// equal to it, else the one nested key ending in ".name"; "" if none.
func yamlKeyOf(keys []string, name string) string {
	if name == "preset-file" { // sets preset to the file's path (presetflag.go)
		name = "preset"
	}
	if slices.Contains(keys, name) {
		return name
	}
	var found []string
	for _, k := range keys {
		if strings.HasSuffix(k, "."+name) {
			found = append(found, k)
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return ""
}

// cell escapes s for a Markdown table cell of text.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ", "<", "&lt;", ">", "&gt;").Replace(s)
}

// code is s as inline code in a table cell, or an empty cell.
func code(s string) string {
	if s == "" {
		return ""
	}
	return "`" + strings.NewReplacer("|", `\|`, "\n", " ").Replace(s) + "`"
}

// flagRows writes one row per flag of fs: the flag, its KVROUTER_*
// variable and YAML key when env is set, its default and its help.
func flagRows(w io.Writer, fs *flag.FlagSet, env bool, keys []string) {
	if env {
		fmt.Fprintln(w, "| flag | environment | YAML key | default | description |")
		fmt.Fprintln(w, "|---|---|---|---|---|")
	} else {
		fmt.Fprintln(w, "| flag | default | description |")
		fmt.Fprintln(w, "|---|---|---|")
	}
	fs.VisitAll(func(f *flag.Flag) {
		if !env {
			fmt.Fprintf(w, "| %s | %s | %s |\n", code("--"+f.Name), code(f.DefValue), cell(f.Usage))
			return
		}
		key := yamlKeyOf(keys, f.Name)
		if f.Name == "backend" && key != "" {
			key += "` or `backends" // proxy.ReadConfigFile takes either
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", code("--"+f.Name), code(envName(f.Name)), code(key), code(f.DefValue), cell(f.Usage))
	})
}

// commandRun is the run function of the subcommand name.
func commandRun(name string) func(context.Context, []string) error {
	return commands()[name].run
}

// writeConfigurationDoc writes docs/configuration.md.
func writeConfigurationDoc(w io.Writer) error {
	keys := configFileKeys()
	fmt.Fprint(w, `# Configuration reference

<!-- Generated by "go generate ./cmd/kvrouter" (kvrouter gendocs) from the
subcommands' flag definitions: do not edit. TestGeneratedDocs fails when it
is stale. -->

Every subcommand prints the same descriptions with `+"`-h`"+`. For `+"`serve`"+` and
`+"`epp`"+`, each flag is also an environment variable and a key of the
`+"`--config`"+` YAML file. Precedence: flags, then the environment, then the
file, then the defaults. `+"`KVROUTER_BACKEND`"+` takes space-separated backends.
A `+"`KVROUTER_*`"+` variable that no flag reads is reported at start with the
nearest real name. How to use these settings is in [operations.md](operations.md).

`)
	fss := map[string]*flag.FlagSet{}
	for _, name := range docCommands {
		fs, err := flagSetOf(commandRun(name))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		fss[name] = fs
	}
	fmt.Fprintln(w, "## kvrouter serve")
	fmt.Fprintln(w)
	flagRows(w, fss["serve"], true, keys)
	var yamlOnly []string
	for _, k := range keys {
		found := false
		fss["serve"].VisitAll(func(f *flag.Flag) { found = found || yamlKeyOf(keys, f.Name) == k })
		if !found {
			yamlOnly = append(yamlOnly, "`"+k+"`")
		}
	}
	if len(yamlOnly) > 0 {
		fmt.Fprintf(w, "\nKeys of the YAML file only: %s (`tokenizers: {model-a: /dir/a, model-b: remote}` gives a tokenizer per model).\n", strings.Join(yamlOnly, ", "))
	}

	fmt.Fprint(w, "\n## kvrouter epp\n\n")
	fmt.Fprintln(w, "`epp` takes every `serve` flag above (its environment variables and YAML keys too);")
	fmt.Fprintf(w, "its `--listen` is the gRPC address, `%s` unless given. These are its own, each a\n", DefaultEPPListen)
	fmt.Fprint(w, "variable and a top-level key of the `--config` file too:\n\n")
	serveNames := flagNames(fss["serve"])
	own := subFlagSet(fss["epp"], func(f *flag.Flag) bool { return !slices.Contains(serveNames, f.Name) })
	flagRows(w, own, true, flagNames(own))
	if missing := subFlagSet(fss["serve"], func(f *flag.Flag) bool { return fss["epp"].Lookup(f.Name) == nil }); len(flagNames(missing)) > 0 {
		return fmt.Errorf("epp lacks serve's flags %v", flagNames(missing))
	}

	for _, name := range docCommands[2:] {
		fmt.Fprintf(w, "\n## kvrouter %s\n\n", name)
		flagRows(w, fss[name], false, nil)
	}
	return nil
}

// flagNames are the names of fs's flags, sorted.
func flagNames(fs *flag.FlagSet) []string {
	var n []string
	fs.VisitAll(func(f *flag.Flag) { n = append(n, f.Name) })
	return n
}

// recorder is a Registerer that keeps every collector registered on it.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// metricDoc is one metric family of docs/metrics.md.
type metricDoc struct {
	name, typ, help string
	labels          []string
}

var descRE = regexp.MustCompile(`^Desc\{fqName: "([^"]*)", help: ("(?:[^"\\]|\\.)*"), .*variableLabels: \{([^}]*)\}\}$`)

// metricDocs describes the collectors of rec; gathered (the registry's
// families with samples) gives the types of the custom collectors.
func metricDocs(rec *recorder, types map[string]string) ([]metricDoc, error) {
	var out []metricDoc
	for _, c := range rec.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		var descs []*prometheus.Desc
		for d := range ch {
			descs = append(descs, d)
		}
		for _, d := range descs {
			m := descRE.FindStringSubmatch(d.String())
			if m == nil {
				return nil, fmt.Errorf("cannot read %s", d)
			}
			var help string
			if _, err := fmt.Sscanf(m[2], "%q", &help); err != nil {
				return nil, fmt.Errorf("help of %s: %w", m[1], err)
			}
			md := metricDoc{name: m[1], help: help, typ: types[m[1]]}
			for l := range strings.SplitSeq(m[3], ",") {
				if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
					md.labels = append(md.labels, l)
				}
			}
			if md.typ == "" && len(descs) == 1 {
				// A Gauge has every method of a Counter, and a Summary
				// those of a Histogram: the vectors are told apart by
				// type, a lone Gauge before a Counter, and a lone
				// Observer is taken for a histogram (none here is a
				// summary without a sample).
				switch c.(type) {
				case *prometheus.CounterVec:
					md.typ = "counter"
				case *prometheus.GaugeVec, prometheus.Gauge:
					md.typ = "gauge"
				case prometheus.Counter:
					md.typ = "counter"
				case *prometheus.HistogramVec, prometheus.Histogram:
					md.typ = "histogram"
				case *prometheus.SummaryVec:
					md.typ = "summary"
				}
			}
			if md.typ == "" {
				return nil, fmt.Errorf("metric %s: no type (it has no sample and its collector is not a vector)", md.name)
			}
			out = append(out, md)
		}
	}
	slices.SortFunc(out, func(a, b metricDoc) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// gatheredTypes are the metric types of g's families with a sample.
func gatheredTypes(g prometheus.Gatherer) (map[string]string, error) {
	mfs, err := g.Gather()
	if err != nil {
		return nil, err
	}
	t := map[string]string{}
	for _, mf := range mfs {
		t[mf.GetName()] = strings.ToLower(mf.GetType().String())
	}
	return t, nil
}

// metricSection is one table of docs/metrics.md: the metrics a router
// started with the serve flags args registers beyond those of the
// sections before it.
type metricSection struct {
	title, about string
	args         []string
	epp, dyn     bool
}

// docBackend is the backend the sections' routers are built with; nothing
// listens there, and nothing is dialled before Run.
const docBackend = "http://127.0.0.1:1,model=m"

var metricSections = []metricSection{
	{title: "The router (serve and epp)", about: "Registered by every router, whatever its flags."},
	{title: "Configuration reloads and discovery", about: "Registered by `kvrouter serve` (`kvrouter epp` registers them too, for its discovery).", dyn: true},
	{title: "Precise mode", about: "Registered when the router follows the engines' KV events: a backend with `kv=`, or `--kv-events-bind`.",
		args: []string{"--backend", docBackend + ",kv=tcp://127.0.0.1:1", "--tokenizer", "remote"}},
	{title: "Several routers", about: "Registered with `--redis`.", args: []string{"--redis", "redis://127.0.0.1:1"}},
	{title: "The endpoint picker (epp)", about: "Registered by `kvrouter epp`.", epp: true},
}

// writeMetricsDoc writes docs/metrics.md.
func writeMetricsDoc(w io.Writer) error {
	fmt.Fprint(w, `# Metrics reference

<!-- Generated by "go generate ./cmd/kvrouter" (kvrouter gendocs) from the
collectors the router registers: do not edit. TestGeneratedDocs fails when
it is stale. -->

The router serves these on its admin listener, `+"`GET /metrics`"+` on
`+"`--admin-listen`"+` (default `+"`127.0.0.1:9091`"+`), beside the Go runtime's
`+"`go_*`"+` and `+"`process_*`"+` series. What to watch and the Grafana dashboard over
them are in [observability.md](observability.md).
`)
	seen := map[string]bool{}
	for _, s := range metricSections {
		args := append([]string{"--backend", docBackend, "--admin-listen", ""}, s.args...)
		if slices.Contains(s.args, "--backend") {
			args = append([]string{"--admin-listen", ""}, s.args...)
		}
		cfg, err := loadServeConfig(args, func(string) string { return "" }, io.Discard)
		if err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
		reg := prometheus.NewRegistry()
		rec := &recorder{Registerer: reg}
		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		rt, err := proxy.New(cfg, proxy.Deps{Registry: rec, Gatherer: reg, Logger: log})
		if err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
		if !slices.Contains(s.args, "--redis") { // a syncer's Run would try Redis once
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			defer rt.Run(ctx) // stops what New started (a KV-event subscriber)
		}
		if s.dyn || s.epp {
			rec.collectors = nil // only this section's own
		}
		if s.dyn {
			if _, err := newDynMetrics(rec); err != nil {
				return err
			}
		}
		if s.epp {
			if _, err := kvepp.New(rt, kvepp.Config{}, rec, log); err != nil {
				return fmt.Errorf("%s: %w", s.title, err)
			}
		}
		types, err := gatheredTypes(reg)
		if err != nil {
			return err
		}
		docs, err := metricDocs(rec, types)
		if err != nil {
			return fmt.Errorf("%s: %w", s.title, err)
		}
		var rows []metricDoc
		for _, d := range docs {
			if !seen[d.name] {
				seen[d.name] = true
				rows = append(rows, d)
			}
		}
		fmt.Fprintf(w, "\n## %s\n\n%s\n\n", s.title, s.about)
		fmt.Fprintln(w, "| metric | type | labels | description |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, d := range rows {
			ls := make([]string, len(d.labels))
			for i, l := range d.labels {
				ls[i] = code(l)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", code(d.name), d.typ, strings.Join(ls, ", "), cell(d.help))
		}
	}
	return nil
}

// generatedDocs are the generated files, by their name under docs/.
func generatedDocs() map[string]func(io.Writer) error {
	return map[string]func(io.Writer) error{
		"configuration.md": writeConfigurationDoc,
		"metrics.md":       writeMetricsDoc,
	}
}

var gendocsHelp = help{
	synopsis: "kvrouter gendocs [--dir docs]",
	about: "Writes the generated references, configuration.md (every subcommand's flags)\n" +
		"and metrics.md (every metric the router registers), into --dir. A hidden\n" +
		"command for developers: go generate ./cmd/kvrouter runs it.",
	examples: []string{"kvrouter gendocs --dir docs   # from the repository's root"},
}

// runGendocs is the hidden subcommand gendocs.
func runGendocs(_ context.Context, args []string) error {
	fs := flag.NewFlagSet("gendocs", flag.ContinueOnError)
	dir := fs.String("dir", "docs", "directory the files are written to")
	if err := parseFlags(fs, args, gendocsHelp, os.Stderr); err != nil {
		return err
	}
	for name, gen := range generatedDocs() {
		var b bytes.Buffer
		if err := gen(&b); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := os.WriteFile(filepath.Join(*dir, name), b.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// writeFlagDocs prints the flag table of the subcommand name, for
// "kvrouter <name> --write-documentation".
func writeFlagDocs(w io.Writer, name string, fs *flag.FlagSet) {
	env := name == "serve" || name == "epp"
	var keys []string
	if env {
		keys = configFileKeys()
	}
	flagRows(w, fs, env, keys)
}
