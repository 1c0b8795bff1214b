package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/demo"
	"github.com/kvrouter/kvrouter/route"
)

// commandHelp is each subcommand's help, which its -h prints.
func commandHelp() map[string]help {
	return map[string]help{
		"serve": serveHelp, "epp": eppHelp, "engine": engineHelp, "sim": simHelp,
		"demo": demoHelp, "replay": replayHelp, "version": versionHelp, "plan": planHelp,
		"gendocs": gendocsHelp, "calibrate": calibrateHelp,
	}
}

// TestHelp: every subcommand's -h says what it does and gives examples,
// exits 0, and each example's flags exist and parse (the example is run
// with -h appended, which stops before it does anything).
func TestHelp(t *testing.T) {
	dir := t.TempDir()
	hs := commandHelp()
	for name := range commands() {
		h, ok := hs[name]
		if !ok {
			t.Errorf("command %s has no help: give it a help{synopsis, about, examples} parsed with parseFlags, and list it in commandHelp", name)
			continue
		}
		r := runBin(t, dir, nil, 30*time.Second, name, "-h")
		if r.code != 0 {
			t.Errorf("kvrouter %s -h: exit %d, want 0\n%s", name, r.code, r.stderr)
		}
		if !strings.HasPrefix(r.stderr, "usage: kvrouter "+name) {
			t.Errorf("kvrouter %s -h starts %q, want \"usage: kvrouter %s\"", name, firstLine(r.stderr), name)
		}
		if len(strings.Split(strings.TrimSpace(h.about), "\n")) < 2 || !strings.Contains(r.stderr, firstLine(h.about)) {
			t.Errorf("kvrouter %s -h: no description of at least two lines", name)
		}
		if len(h.examples) == 0 || !strings.Contains(r.stderr, "\nexamples:\n") {
			t.Errorf("kvrouter %s -h: no examples", name)
		}
		for _, e := range h.examples {
			args := strings.Fields(cutAny(e, " #", " >"))
			if len(args) < 2 || args[0] != "kvrouter" || strings.TrimPrefix(args[1], "--") != name {
				t.Errorf("kvrouter %s example %q does not run kvrouter %s", name, e, name)
				continue
			}
			if r := runBin(t, dir, nil, 30*time.Second, append(args[1:], "-h")...); r.code != 0 {
				t.Errorf("example %q with -h: exit %d, want 0 (a flag that does not exist?)\n%s", e, r.code, firstLine(r.stderr))
			}
		}
	}
	if a, b := runBin(t, dir, nil, 30*time.Second, "help", "sim"), runBin(t, dir, nil, 30*time.Second, "sim", "-h"); a != b || a.code != 0 {
		t.Errorf("kvrouter help sim: exit %d, %d bytes; want kvrouter sim -h's %d bytes", a.code, len(a.stderr), len(b.stderr))
	}
	r := runBin(t, dir, nil, 30*time.Second)
	for name, c := range commands() {
		if !c.hidden && !strings.Contains(r.stderr, "\n  "+name+" ") {
			t.Errorf("kvrouter alone: the command list lacks %s:\n%s", name, r.stderr)
		}
	}
	if r.code != 2 {
		t.Errorf("kvrouter alone: exit %d, want 2", r.code)
	}
}

// TestDemoPolicies: demo --policies takes a list or all.
func TestDemoPolicies(t *testing.T) {
	got, err := demoPolicies("all")
	if err != nil || !slices.Equal(got, route.Names()) || !slices.Contains(got, "kv-aware") {
		t.Errorf("all: got %v, %v; want every policy %v", got, err, route.Names())
	}
	if got, err := demoPolicies(" round-robin, kv-aware ,"); err != nil || !slices.Equal(got, []string{"round-robin", "kv-aware"}) {
		t.Errorf("list: got %v, %v", got, err)
	}
	if _, err := demoPolicies("kv-aware,nope"); err == nil || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Errorf("unknown policy: got %v", err)
	}
}

// TestUsageErrors: a misspelt flag is named with a suggestion and a pointer
// to -h, without the pages of flags; exit status 2.
func TestUsageErrors(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--polcy", "kv-aware"}, "flag provided but not defined: -polcy (did you mean --policy?)"},
		{[]string{"sim", "--replica", "4"}, "flag provided but not defined: -replica (did you mean --replicas?)"},
		{[]string{"serve", "--backend", "localhost:8000"}, `backend "localhost:8000": URL needs a scheme, e.g. http://localhost:8000`},
		{[]string{"engine", "extra"}, `unexpected arguments ["extra"]`},
	}
	for _, c := range cases {
		r := runBin(t, dir, nil, 30*time.Second, c.args...)
		if r.code != 2 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("kvrouter %s: exit %d, stderr %q; want exit 2 and %q", strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
		if !strings.Contains(r.stderr, "Run 'kvrouter "+c.args[0]+" -h'") || strings.Count(r.stderr, "\n") > 2 {
			t.Errorf("kvrouter %s: stderr %q, want the error and a pointer to -h only", strings.Join(c.args, " "), r.stderr)
		}
	}
}

// TestEnvTypoWarned: the binary warns about a misspelt KVROUTER_ variable
// at start, whatever the command, and still runs.
func TestEnvTypoWarned(t *testing.T) {
	r := runBin(t, t.TempDir(), []string{"KVROUTER_SCRAPE_INTERVL=250ms", "KVROUTER_POLICY=round-robin"}, 30*time.Second, "version")
	want := "kvrouter: warning: unknown environment variable KVROUTER_SCRAPE_INTERVL is ignored (did you mean KVROUTER_SCRAPE_INTERVAL?)\n"
	if r.code != 0 || r.stderr != want {
		t.Errorf("got exit %d, stderr %q; want exit 0, stderr %q", r.code, r.stderr, want)
	}
}

// TestEnvTypoWarnedByServe: serve logs the warning in its log, at start.
func TestEnvTypoWarnedByServe(t *testing.T) {
	c := exec.Command(kvrouterBin(t), "serve", "--listen", "127.0.0.1:0", "--admin-listen", "", "--backend", "http://127.0.0.1:9")
	c.Env = []string{"PATH=" + os.Getenv("PATH"), "KVROUTER_BACKENDS=http://127.0.0.1:9"}
	stderr, err := c.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Wait()
	defer c.Process.Signal(syscall.SIGTERM)
	want := `level=WARN msg="unknown environment variable is ignored" name=KVROUTER_BACKENDS did_you_mean=KVROUTER_BACKEND`
	sc := bufio.NewScanner(stderr)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.Contains(sc.Text(), want) {
			return
		}
		if len(lines) > 20 {
			break
		}
	}
	t.Errorf("serve's log lacks %q:\n%s", want, strings.Join(lines, "\n"))
}

// TestVersionFromBuild: kvrouter version and --version print what the Go
// toolchain stamped into the binary, as "go version -m" reads it, and,
// when the binary was built from a git checkout, that checkout's commit.
func TestVersionFromBuild(t *testing.T) {
	dir := t.TempDir()
	r := runBin(t, dir, nil, 30*time.Second, "version")
	if r2 := runBin(t, dir, nil, 30*time.Second, "--version"); r2.stdout != r.stdout || r.code != 0 || r2.code != 0 {
		t.Errorf("version: %q (exit %d); --version: %q (exit %d); want the same, exit 0", r.stdout, r.code, r2.stdout, r2.code)
	}
	out, err := exec.Command("go", "version", "-m", kvrouterBin(t)).Output()
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "mod":
			fields["version"] = f[2]
		case len(f) == 2 && f[0] == "build" && strings.HasPrefix(f[1], "vcs"):
			k, v, _ := strings.Cut(f[1], "=")
			fields[k] = v
		case len(f) == 2 && strings.HasSuffix(f[0], ":"):
			fields["go"] = f[1]
		}
	}
	want := []string{"kvrouter", "version=" + fields["version"]}
	if rev := fields["vcs.revision"]; rev != "" {
		want = append(want, "revision="+rev, "dirty="+fields["vcs.modified"])
	}
	if tm := fields["vcs.time"]; tm != "" {
		want = append(want, "time="+tm)
	}
	got := strings.Fields(r.stdout)
	if len(got) < len(want) || !slices.Equal(got[:len(want)], want) || got[len(want)] != "go="+fields["go"] {
		t.Errorf("kvrouter version: %q; go version -m says %v", r.stdout, fields)
	}
	t.Logf("kvrouter version: %s", strings.TrimSpace(r.stdout))
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil || fields["vcs"] != "git" {
		t.Logf("not stamped from git here (worktree, -buildvcs=false or no git): revision not compared")
		return
	}
	if rev := strings.TrimSpace(string(head)); fields["vcs.revision"] != rev {
		t.Errorf("revision %s, want the checkout's HEAD %s", fields["vcs.revision"], rev)
	}
	status, err := exec.Command("git", "status", "--porcelain").Output()
	if err != nil {
		t.Fatal(err)
	}
	if dirty := fmt.Sprint(len(status) > 0); fields["vcs.modified"] != dirty {
		t.Errorf("vcs.modified %s, want %s (git status --porcelain: %q)", fields["vcs.modified"], dirty, status)
	}
}

// TestSimDemoChat: kvrouter sim and replay take the demo's workload, and
// it is the demo's own generator's output, request for request.
func TestSimDemoChat(t *testing.T) {
	w, err := loadWorkload(demo.ChatWorkload, "", "", 7, 60, 0)
	if err != nil {
		t.Fatal(err)
	}
	want, err := demo.Workload(demo.ChatWorkload, 60, 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, w.Requests); diff != "" || w.Name != demo.ChatWorkload {
		t.Errorf("workload %q (-demo +sim):\n%s", w.Name, diff)
	}
	reqs, name, err := replayWorkload(demo.ChatWorkload, "", "", 7, 60)
	if err != nil || name != demo.ChatWorkload || !cmp.Equal(want, reqs) {
		t.Errorf("replay's demo-chat: %d requests named %q, %v; want the demo's %d", len(reqs), name, err, len(want))
	}
	out, _, err := runSimArgs(t, "--workload", demo.ChatWorkload, "--requests", "60", "--replicas", "2", "--policies", "round-robin,kv-aware", "--json")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{`"policy": "round-robin"`, `"policy": "kv-aware"`, `"completed": 60`, `"value": "demo-chat"`} {
		if !strings.Contains(out, p) {
			t.Errorf("sim --workload demo-chat --json lacks %s", p)
		}
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// cutAny returns s up to the first of seps.
func cutAny(s string, seps ...string) string {
	for _, sep := range seps {
		s, _, _ = strings.Cut(s, sep)
	}
	return s
}

// TestParseBuildInfo: the version line from a stamped build's information
// (the text "go version -m" prints), and from an unstamped one, each
// without and with a release version.
func TestParseBuildInfo(t *testing.T) {
	stamped, err := debug.ParseBuildInfo("go\tgo1.26.8\npath\tgithub.com/kvrouter/kvrouter/cmd/kvrouter\n" +
		"mod\tgithub.com/kvrouter/kvrouter\tv0.0.0-20261201161421-86752753e55e+dirty\t\n" +
		"build\t-compiler=gc\nbuild\tvcs=git\nbuild\tvcs.revision=86752753e55ecd1666578aa924ca913a6089871e\n" +
		"build\tvcs.time=2026-12-01T16:14:21Z\nbuild\tvcs.modified=true\n")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := debug.ParseBuildInfo("go\tgo1.26.8\npath\tgithub.com/kvrouter/kvrouter/cmd/kvrouter\nmod\tgithub.com/kvrouter/kvrouter\t(devel)\t\n")
	if err != nil {
		t.Fatal(err)
	}
	stamped.GoVersion, plain.GoVersion = "go1.26.8", "go1.26.8" // ParseBuildInfo leaves it to the caller
	platform := " platform=" + runtime.GOOS + "/" + runtime.GOARCH
	cases := []struct {
		bi      *debug.BuildInfo
		release string
		want    string
	}{
		{stamped, "", "kvrouter version=v0.0.0-20261201161421-86752753e55e+dirty revision=86752753e55ecd1666578aa924ca913a6089871e dirty=true time=2026-12-01T16:14:21Z go=go1.26.8" + platform},
		{plain, "", "kvrouter version=(devel) go=go1.26.8" + platform},
		{stamped, "v0.1.0", "kvrouter version=v0.1.0 revision=86752753e55ecd1666578aa924ca913a6089871e dirty=true time=2026-12-01T16:14:21Z go=go1.26.8" + platform},
		{plain, "v0.1.0", "kvrouter version=v0.1.0 go=go1.26.8" + platform},
	}
	for _, c := range cases {
		if got := parseBuildInfo(c.bi, c.release).String(); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}

// isServeConfig reports whether a YAML block is a kvrouter configuration,
// one with a top-level backends key, rather than a Kubernetes manifest or
// Envoy's configuration.
func isServeConfig(body string) bool {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "backends:") || strings.HasPrefix(l, "backend:") {
			return true
		}
	}
	return false
}

// TestREADMEConfig: the YAML config examples (kvrouter's, not the
// manifests') of README.md and docs/*.md are valid configurations.
func TestREADMEConfig(t *testing.T) {
	n := 0
	for _, file := range docFiles(t) {
		for _, block := range strings.Split(readDoc(t, file), "```yaml\n")[1:] {
			body, _, _ := strings.Cut(block, "```")
			if !isServeConfig(body) {
				continue // a Kubernetes manifest or an Envoy configuration
			}
			path := filepath.Join(t.TempDir(), "kvrouter.yaml")
			if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := loadServeConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Errorf("%s: config example:\n%s\n%v", file, body, err)
			} else if len(cfg.Backends) == 0 {
				t.Errorf("%s: config example has no backends:\n%s", file, body)
			}
			n++
		}
	}
	if n == 0 {
		t.Error("neither README.md nor docs/ has a yaml config example")
	}
}
