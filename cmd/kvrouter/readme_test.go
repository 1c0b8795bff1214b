package main

// TestREADME runs the commands of README.md and of every page of docs/,
// so that one that stops working fails CI. The rules, the same for each
// file:
//
//   - Commands come from the file's fenced code blocks. In a block tagged
//     sh, bash, shell or console, every line that is neither blank nor a
//     "#" comment is a command; in any other block (output, YAML), only a
//     line starting with "$ " is. A leading "$ " is dropped, and a line
//     ending in "\" continues on the next.
//   - Each block runs in a fresh directory holding the fixtures the docs
//     name as the reader's own files (my-traffic.jsonl), with the
//     kvrouter the tests build first on PATH; "go run ./cmd/kvrouter" is
//     run as that kvrouter. Commands run with bash, in order, and must
//     exit 0 within commandCPU seconds of CPU time per process (the
//     command's own work, which a loaded machine does not stretch as it
//     does wall time); the wall clock only catches a command that hangs
//     (hangAfter).
//   - A kvrouter serve or kvrouter engine command is a server, with or
//     without a trailing "&": it is started in the background, the test
//     waits until its --listen address (else the subcommand's default)
//     accepts connections, runs the block's later commands, and at the
//     block's end sends SIGTERM and requires exit status 0. A server that
//     exits before then fails the test. If a port a server would use is
//     taken by another process, the block is skipped, except under CI=true,
//     where that fails.
//   - readmeRules, keyed by the exact command, says what to do with one
//     that cannot run here as written: skip it (with the reason: it needs
//     a GPU, a download, files the reader brings), append flags that make
//     it small (later flags win over the README's), or start a server
//     first. A rule whose command is in no file fails the test. A
//     command that already ran (the same text, in any file) is not run
//     again.
//   - A block right after a line "<!-- ci: skip REASON -->" (an HTML
//     comment: invisible on the rendered page) is skipped whole, for a
//     transcript or a deployment walk-through that cannot run here.
//   - -short skips the commands whose rule marks them slow.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/proxy"
)

// commandCPU bounds the CPU time, in seconds, of each process of a
// foreground command of the docs (bash's ulimit -t): the command's own
// work. The docs' commands are sized (readmeRules) to use a few
// CPU-seconds each (logged with each command); a command that loops, or
// a simulation that grew a hundredfold, uses it up, on a quiet machine as
// on a loaded one. A wall-clock limit did not tell these apart from a
// machine shared with other work: on a 2-core machine at load average
// 30, sim commands of 2 CPU-seconds took over a minute of wall time and
// failed the old 1-minute limit.
const commandCPU = 120

// hangAfter is how long a command, a server's start or a server's stop
// may take in wall time before the test calls it hung: only a command
// waiting for something that never comes (using no CPU) gets there, so
// it is long, and it is cut to the test's own deadline (go test
// -timeout) less a minute, so that a hang fails with the command's
// output rather than go test's panic.
const hangAfter = 10 * time.Minute

// hangBound is hangAfter, or less when the test's deadline is nearer.
func hangBound(t *testing.T) time.Duration {
	d := hangAfter
	if dl, ok := t.Deadline(); ok {
		d = min(d, max(time.Until(dl)-time.Minute, time.Second))
	}
	return d
}

// readmeRule says how TestREADME runs one README command.
type readmeRule struct {
	// skip, if set, is why the command is not run.
	skip string
	// args are appended to the command (before a "> file" redirection).
	args string
	// server is a server command started before this one and stopped
	// after it, as a block's server is.
	server string
	// slow: -short skips the command.
	slow bool
}

// routersCommand is the several-routers run of docs/results.md, which
// scripts/results writes.
const routersCommand = "kvrouter sim --workload hot-prefix,multi-turn-chat --load 0.8 --replicas 16 --preset llama3-8b-h100 --policies kv-aware,session-hash,least-loaded --requests 2000"

// readmeRules are the README commands that need a rule, keyed by the
// command without its comment.
func readmeRules() map[string]readmeRule {
	return map[string]readmeRule{
		"go run ./cmd/kvrouter demo":       {args: "--requests 24 --policies round-robin,kv-aware", slow: true},
		"go test -race -timeout 30m ./...": {skip: "the test suite itself"},
		"go install ./cmd/kvrouter":        {skip: "the tests build ./cmd/kvrouter themselves (installing would write to GOPATH/bin)"},
		`vllm serve Qwen/Qwen3-8B --port 8000 --enable-prompt-tokens-details --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@10.0.0.5:8000@Qwen/Qwen3-8B"}'`: {
			skip: "needs a GPU and vLLM"},
		"kvrouter serve --tokenizer /models/Qwen3-8B --backend http://10.0.0.5:8000,kv=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558 --backend http://10.0.0.6:8000,kv=tcp://10.0.0.6:5557,replay=tcp://10.0.0.6:5558": {
			skip: "needs the model's tokenizer files in /models/Qwen3-8B"},
		"kvrouter sim --workload shared-prefix --replicas 16 --preset llama3-8b-h100 --load 0.8 --policies all": {args: "--requests 128"},
		"curl -LO https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/conversation_trace.jsonl": {
			skip: "downloads the public trace (no network in CI)"},
		"kvrouter sim --trace conversation_trace.jsonl --replicas 16 --preset llama3-8b-h100 --load 0.8 --policies all": {
			skip: "needs the downloaded Mooncake trace"},
		"kvrouter sim --workload shared-prefix,multi-turn-chat,agentic --load 0.5,0.8,0.95 --replicas 8 --policies all --report board.html": {
			args: "--requests 40"},
		"kvrouter replay --target http://127.0.0.1:8000 --workload multi-turn-chat --requests 500 --rate 4": {
			args: "--requests 16 --rate 16 --max-tokens 16", server: "kvrouter engine --listen 127.0.0.1:8000 --time-scale 0.05"},
		"kvrouter replay --target http://10.0.0.1:8000 --workload mooncake-conversation --concurrency 16 --json": {
			skip: "needs a fleet at 10.0.0.1 and the downloaded Mooncake trace"},
		"go test -run TestScreenshot ./dashboard -args -screenshot=$PWD/dashboard.png": {
			skip: "a browser test, which go test ./... runs"},
		"kvrouter sim --workload multi-tenant-context --load 0.95 --policies kv-aware,kv-aware-precise,mooncake": {
			args: "--requests 200", slow: true},
		"kvrouter sim --workload multi-tenant-context --load 0.95 --policies kv-aware,kv-aware-precise,mooncake --cpu-kv-blocks 112640": {
			args: "--requests 200", slow: true},
		"kvrouter sim --workload multi-tenant-context --load 0.95 --policies kv-aware,kv-aware-precise,mooncake --interconnect-gbps 50": {
			args: "--requests 200", slow: true},
		"kvrouter sim --workload multi-tenant-context --load 0.95 --policies kv-aware,kv-aware-precise,mooncake --cpu-kv-blocks 112640 --interconnect-gbps 50": {
			args: "--requests 200", slow: true},
		"kvrouter sim --workload document-qa --replicas 16 --prefill-replicas 8 --load 0.8 --policies kv-aware,pd-round-robin,llm-d-pd,dynamo-pd": {
			args: "--requests 200"},
		"kvrouter sim --workload all --load 0.5,0.8,0.95 --prefill-replicas 4 --policies all --requests 1000 --json > pd.json": {
			args: "--requests 20", slow: true},
		"kvrouter plan --trace recording.jsonl --slo-ttft 800ms --slo-itl 50ms --rate-scale 2 --report plan.html": {
			skip: "needs the reader's recording; TestPlanTrace runs plan on a trace"},
		"go install github.com/kvrouter/kvrouter/cmd/kvrouter@latest": {
			skip: "fetches the published module (no network in CI); the tests build this checkout"},
		"docker build --build-arg VERSION=v0.1.0 -t kvrouter:v0.1.0 .": {skip: "needs a Docker daemon; TestDockerfileBuild runs the Dockerfile's build stage"},
		"kubectl apply -n llm -k deploy/":                              {skip: "needs a cluster; deploy's tests decode every manifest strictly"},
		"kvrouter epp --listen :9002 --discover dns://vllm-engines:8000 --policy kv-aware": {
			skip: "needs the cluster's DNS name of the vLLM pods; epp's tests run it on loopback"},
		"kvrouter sim --workload hot-prefix,multi-turn-chat --load 0.8 --replicas 16 --policies kv-aware,session-hash,least-loaded --requests 2000 --routers 3 --sync-interval 50ms": {
			args: "--requests 300"},
		"go test ./proxy -run TestRecordingLoop -v": {skip: "a test of ./proxy, which go test ./... runs"},
		"kvrouter replay --target http://127.0.0.1:8400 --workload multi-turn-chat --requests 300 --rate 8 --time-scale 0.05": {
			args: "--requests 40"},
		"kvrouter sim --workload document-qa --load 0.8 --cpu-kv-blocks 112640 --policies kv-aware,sglang-cache-aware,preble-e2,llm-d,session-hash,least-loaded,round-robin": {
			args: "--requests 600"}, // 6,585 requests: 45 CPU-seconds
		"kvrouter sim --capacity --workload document-qa --prefill-replicas 0,4,8 --policies kv-aware,dynamo-pd --requests 300": {
			args: "--requests 100"}, // 30 CPU-seconds at 300
		"kvrouter sim --capacity --workload multi-turn-chat --requests 1500 --policies kv-aware,preble-e2,least-loaded,round-robin": {
			args: "--requests 400"}, // 12 CPU-seconds at 1500
		routersCommand + " --routers 1":                      {args: "--requests 300"},
		routersCommand + " --routers 3 --sync-interval 50ms": {args: "--requests 300"},
		routersCommand + " --routers 3 --sync-interval -1ns": {args: "--requests 300"},
	}
}

// readmeBlock is one fenced block's commands, with the README line each
// starts on.
type readmeBlock struct {
	line     int
	commands []readmeCommand
	// skip is the reason of a "<!-- ci: skip REASON -->" line right
	// before the block; empty: none.
	skip string
}

type readmeCommand struct {
	line int
	text string
}

// readmeBlocks extracts the commands of README text, by the rules above.
func readmeBlocks(text string) []readmeBlock {
	var blocks []readmeBlock
	var cur *readmeBlock
	shell, cont, prev := false, "", ""
	contLine := 0
	for i, l := range strings.Split(text, "\n") {
		n := i + 1
		if strings.HasPrefix(l, "```") {
			if cur == nil {
				tag := strings.TrimSpace(strings.TrimPrefix(l, "```"))
				shell = tag == "sh" || tag == "bash" || tag == "shell" || tag == "console"
				cur = &readmeBlock{line: n}
				if r, ok := strings.CutPrefix(prev, "<!-- ci: skip"); ok && strings.HasSuffix(r, "-->") {
					cur.skip = strings.TrimSpace(strings.TrimSuffix(r, "-->"))
					if cur.skip == "" {
						cur.skip = "marked ci: skip"
					}
				}
			} else {
				if len(cur.commands) > 0 {
					blocks = append(blocks, *cur)
				}
				cur, cont = nil, ""
			}
			continue
		}
		if cur == nil {
			if strings.TrimSpace(l) != "" {
				prev = strings.TrimSpace(l)
			}
			continue
		}
		if cont == "" {
			prompt := strings.HasPrefix(l, "$ ")
			l = strings.TrimPrefix(l, "$ ")
			if (!shell && !prompt) || strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#") {
				continue
			}
			contLine = n
		}
		if s, ok := strings.CutSuffix(l, "\\"); ok {
			cont += strings.TrimSpace(s) + " "
			continue
		}
		cur.commands = append(cur.commands, readmeCommand{line: contLine, text: withoutComment(cont + strings.TrimSpace(l))})
		cont = ""
	}
	return blocks
}

// docFiles are the files whose commands TestREADME runs, paths from the
// repository's root: README.md, then docs/*.md.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, p := range pages {
		files = append(files, filepath.ToSlash(filepath.Join("docs", filepath.Base(p))))
	}
	return files
}

// readDoc is the text of file, a path from the repository's root.
func readDoc(t *testing.T, file string) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(file)))
	if err != nil {
		t.Fatal(err)
	}
	return string(text)
}

// TestREADME runs the commands of README.md and docs/*.md: see the top of
// this file.
func TestREADME(t *testing.T) {
	files := docFiles(t)
	blocks := map[string][]readmeBlock{}
	seen := map[string]bool{}
	for _, f := range files {
		blocks[f] = readmeBlocks(readDoc(t, f))
		for _, b := range blocks[f] {
			for _, c := range b.commands {
				seen[c.text] = true
			}
		}
	}
	rules := readmeRules()
	for cmd := range rules {
		if !seen[cmd] {
			t.Errorf("readmeRules has a rule for a command neither README.md nor docs/ has: %q", cmd)
		}
	}
	bin := kvrouterBin(t)
	ran := map[string]bool{}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			for _, b := range blocks[f] {
				t.Run(fmt.Sprintf("line%d", b.line), func(t *testing.T) {
					runBlock(t, f, b, bin, rules, ran)
				})
			}
		})
	}
}

// runBlock runs one block of file (a path from the repository's root)
// in a fresh directory.
func runBlock(t *testing.T, file string, b readmeBlock, bin string, rules map[string]readmeRule, ran map[string]bool) {
	if b.skip != "" {
		t.Skipf("%s:%d: block skipped (%s)", file, b.line, b.skip)
	}
	dir := t.TempDir()
	writeFixtures(t, dir)
	env := append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	var servers []*server
	defer func() {
		for i := len(servers) - 1; i >= 0; i-- {
			servers[i].stop(t)
		}
	}()
	for _, c := range b.commands {
		at := fmt.Sprintf("%s:%d", file, c.line)
		rule := rules[c.text]
		switch {
		case rule.skip != "":
			t.Logf("%s: skipped (%s): %s", at, rule.skip, c.text)
			continue
		case rule.slow && testing.Short():
			t.Logf("%s: skipped (slow; -short): %s", at, c.text)
			continue
		case ran[c.text]:
			t.Logf("%s: ran already: %s", at, c.text)
			continue
		}
		ran[c.text] = true
		if rule.server != "" {
			s := startServer(t, dir, env, at, rule.server)
			defer s.stop(t)
		}
		cmd := withArgs(strings.ReplaceAll(c.text, "go run ./cmd/kvrouter", "kvrouter"), rule.args)
		if isServer(cmd) {
			servers = append(servers, startServer(t, dir, env, at, cmd))
			continue
		}
		runCommand(t, dir, env, at, cmd)
	}
}

// withArgs appends args to cmd, before a "> file" redirection.
func withArgs(cmd, args string) string {
	if args == "" {
		return cmd
	}
	rest := ""
	if i := strings.Index(cmd, " >"); i >= 0 {
		cmd, rest = cmd[:i], cmd[i:]
	}
	return strings.TrimSpace(cmd) + " " + args + rest
}

// withoutComment is line without a trailing shell comment: a "#" after
// white space, outside quotes.
func withoutComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimSpace(line[:i])
		}
	}
	return strings.TrimSpace(line)
}

// isServer: cmd runs kvrouter serve or kvrouter engine.
func isServer(cmd string) bool {
	return strings.HasPrefix(cmd, "kvrouter serve ") || strings.HasPrefix(cmd, "kvrouter engine ") ||
		cmd == "kvrouter serve" || cmd == "kvrouter engine"
}

// runCommand runs one foreground command, failing t unless it exits 0.
func runCommand(t *testing.T, dir string, env []string, at string, cmd string) {
	t.Helper()
	if strings.HasPrefix(cmd, "curl ") {
		needTool(t, "curl")
	}
	hang := hangBound(t)
	ctx, cancel := context.WithTimeout(context.Background(), hang)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", "-c", fmt.Sprintf("ulimit -t %d\n%s", commandCPU, cmd))
	c.Dir, c.Env = dir, env
	start := time.Now()
	out, err := c.CombinedOutput()
	var cpu time.Duration
	if c.ProcessState != nil {
		cpu = c.ProcessState.UserTime() + c.ProcessState.SystemTime() // bash's and the processes it waited for
	}
	switch {
	case ctx.Err() != nil:
		t.Errorf("%s: hung, or the test's deadline near: still running after %v of wall time (%v of CPU): %s\n%s", at, hang, cpu.Round(time.Millisecond), cmd, tail(out))
	case cpuExceeded(err, cpu, commandCPU):
		t.Errorf("%s: used more than its %d CPU-seconds: %s\n%s", at, commandCPU, cmd, tail(out))
	case err != nil:
		t.Errorf("%s: %v: %s\n%s", at, err, cmd, tail(out))
	default:
		t.Logf("%s: ok in %v of CPU (%v of wall time): %s", at, cpu.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), cmd)
	}
}

// cpuExceeded: a command that ended with err after using cpu is one the
// kernel stopped at its limit of seconds (ulimit -t sends SIGKILL there;
// bash reports a child's as exit status 128+9). The kernel's accounting
// runs in ticks, so the cpu reported can fall a little short of the
// limit: half of it tells the limit from an unrelated kill.
func cpuExceeded(err error, cpu time.Duration, seconds int) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) || cpu < time.Duration(seconds)*time.Second/2 {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	killed := func(s syscall.Signal) bool {
		return ws.Signaled() && ws.Signal() == s || ws.Exited() && ws.ExitStatus() == 128+int(s)
	}
	return ok && (killed(syscall.SIGKILL) || killed(syscall.SIGXCPU))
}

// server is a README server command running in the background.
type server struct {
	at   string
	cmd  string
	c    *exec.Cmd
	done chan error
	out  *strings.Builder
}

// startServer starts cmd (its trailing "&" dropped) in its own process
// group and waits until its listen address accepts connections.
func startServer(t *testing.T, dir string, env []string, at string, cmd string) *server {
	t.Helper()
	cmd = strings.TrimSpace(strings.TrimSuffix(cmd, "&"))
	for _, addr := range serverPorts(cmd) {
		if ln, err := net.Listen("tcp", addr); err != nil {
			if os.Getenv("CI") == "" {
				t.Skipf("%s: %s is taken by another process here: %v", at, addr, err)
			}
			t.Fatalf("%s: %s is taken: %v", at, addr, err)
		} else {
			ln.Close()
		}
	}
	s := &server{at: at, cmd: cmd, done: make(chan error, 1), out: &strings.Builder{}}
	s.c = exec.Command("bash", "-c", "exec "+cmd)
	s.c.Dir, s.c.Env = dir, env
	s.c.Stdout, s.c.Stderr = s.out, s.out
	s.c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.c.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.done <- s.c.Wait() }()
	addr := dialAddr(listenAddr(cmd))
	hang := hangBound(t)
	deadline := time.Now().Add(hang)
	for {
		select {
		case err := <-s.done:
			s.done <- err
			t.Fatalf("%s: the server exited (%v) before serving: %s\n%s", at, err, cmd, tail([]byte(s.out.String())))
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Logf("%s: serving on %s: %s", at, addr, cmd)
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: hung: %s not accepting connections after %v: %s", at, addr, hang, cmd)
		}
		time.Sleep(50 * time.Millisecond) // between dials; the loop also watches the server's exit, which wait.For cannot
	}
}

// stop sends SIGTERM to the server's process group and requires a clean
// exit within 20 s; it does nothing the second time.
func (s *server) stop(t *testing.T) {
	t.Helper()
	if s.c == nil {
		return
	}
	defer func() { s.c = nil }()
	select {
	case err := <-s.done:
		t.Errorf("%s: the server exited (%v) before the block's end: %s\n%s", s.at, err, s.cmd, tail([]byte(s.out.String())))
		return
	default:
	}
	syscall.Kill(-s.c.Process.Pid, syscall.SIGTERM)
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("%s: on SIGTERM the server exited with %v, want 0: %s\n%s", s.at, err, s.cmd, tail([]byte(s.out.String())))
		}
	case <-time.After(hangBound(t)): // a bound on a hung server, not a threshold: its drain takes seconds
		syscall.Kill(-s.c.Process.Pid, syscall.SIGKILL)
		<-s.done
		t.Errorf("%s: hung: the server did not stop after SIGTERM: %s", s.at, s.cmd)
	}
}

// listenAddr is a server command's --listen, else its subcommand's
// default.
func listenAddr(cmd string) string {
	if v := flagValue(cmd, "listen"); v != "" {
		return v
	}
	if strings.HasPrefix(cmd, "kvrouter engine") {
		return "127.0.0.1:8001"
	}
	return "127.0.0.1:8000"
}

// serverPorts are the addresses a server command would bind: its listen
// address, a router's admin address and any tcp:// endpoint it binds (a "*" or 0.0.0.0 host, or the
// KV-event bind).
func serverPorts(cmd string) []string {
	addrs := []string{listenAddr(cmd)}
	if admin := flagValue(cmd, "admin-listen"); admin != "" {
		if admin = strings.Trim(admin, `'"`); admin != "" {
			addrs = append(addrs, admin)
		}
	} else if !strings.HasPrefix(cmd, "kvrouter engine") {
		addrs = append(addrs, proxy.DefaultAdminListen) // serve and epp refuse to start without it
	}
	for _, name := range []string{"kv-events-bind", "kv-events-endpoint", "kv-events-replay-endpoint"} {
		v := strings.Trim(flagValue(cmd, name), `'"`)
		hostPort, ok := strings.CutPrefix(v, "tcp://")
		if !ok {
			continue
		}
		if host, port, err := net.SplitHostPort(hostPort); err == nil && (name == "kv-events-bind" || host == "*") {
			if host == "*" {
				host = ""
			}
			addrs = append(addrs, net.JoinHostPort(host, port))
		}
	}
	return addrs
}

// flagValue is the value of --name in cmd ("--name v" or "--name=v").
func flagValue(cmd, name string) string {
	f := strings.Fields(cmd)
	for i, a := range f {
		a = "-" + strings.TrimLeft(a, "-")
		if a == "-"+name && i+1 < len(f) {
			return f[i+1]
		}
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v
		}
	}
	return ""
}

// dialAddr turns a listen address into one to dial.
func dialAddr(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// writeFixtures writes the files the README's commands take as the
// reader's own: my-traffic.jsonl, a small Mooncake-format trace (120
// requests, a shared 1,024-token prefix and per-conversation history).
func writeFixtures(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "my-traffic.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	next := 2 // hash ids 0 and 1: the shared prefix
	hist := make([][]int, 12)
	for i := range 120 {
		conv := i % len(hist)
		if hist[conv] == nil {
			hist[conv] = []int{0, 1}
		}
		hist[conv] = append(hist[conv], next)
		next++
		ids := strings.Trim(strings.Join(strings.Fields(fmt.Sprint(hist[conv])), ", "), "[]")
		fmt.Fprintf(w, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}`+"\n",
			i*250, 512*len(hist[conv])-100, 32+i%64, ids)
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		t.Fatal(err)
	}
}

// needTool skips t when tool is missing, unless CI is set, where that
// fails.
func needTool(t *testing.T, tool string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (.ci/run installs it): %v", tool, err)
		}
		t.Skipf("%s not installed (.ci/run installs it): %v", tool, err)
	}
}

// tail is the last 40 lines of out.
func tail(out []byte) string {
	l := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	return strings.Join(l[max(0, len(l)-40):], "\n")
}

// TestReadmeBlocks: the extraction rules on a literal README.
func TestReadmeBlocks(t *testing.T) {
	text := "intro\n```sh\n# a comment\nkvrouter sim \\\n  --replicas 4   # trailing\n\nkvrouter version\n```\n" +
		"```\n$ go run ./cmd/kvrouter demo\noutput line\n```\n```yaml\nbackend: []\n```\n```console\n$ kvrouter --version\n```\n" +
		"<!-- ci: skip needs Docker -->\n\n```sh\ndocker build .\n```\n"
	got := readmeBlocks(text)
	want := []readmeBlock{
		{line: 2, commands: []readmeCommand{{4, "kvrouter sim --replicas 4"}, {7, "kvrouter version"}}},
		{line: 9, commands: []readmeCommand{{10, "go run ./cmd/kvrouter demo"}}},
		{line: 16, commands: []readmeCommand{{17, "kvrouter --version"}}},
		{line: 21, commands: []readmeCommand{{22, "docker build ."}}, skip: "needs Docker"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, want := withArgs("kvrouter sim --json > board.json", "--requests 4"), "kvrouter sim --json --requests 4 > board.json"; got != want {
		t.Errorf("withArgs: got %q, want %q", got, want)
	}
	if got, want := withoutComment(`curl -d '{"a":"# not a comment"}' x # comment`), `curl -d '{"a":"# not a comment"}' x`; got != want {
		t.Errorf("withoutComment: got %q, want %q", got, want)
	}
	if got := serverPorts("kvrouter engine --listen 127.0.0.1:8001 --kv-events-endpoint 'tcp://*:5557' --kv-events-replay-endpoint tcp://10.0.0.1:5558"); fmt.Sprint(got) != "[127.0.0.1:8001 :5557]" {
		t.Errorf("serverPorts: got %v", got)
	}
	if got := serverPorts("kvrouter serve --backend http://127.0.0.1:8001"); fmt.Sprint(got) != "[127.0.0.1:8000 "+proxy.DefaultAdminListen+"]" {
		t.Errorf("serverPorts of serve: got %v, want its listen and default admin addresses", got)
	}
	if got := serverPorts(`kvrouter serve --listen 127.0.0.1:8400 --admin-listen ""`); fmt.Sprint(got) != "[127.0.0.1:8400]" {
		t.Errorf("serverPorts of serve without admin: got %v", got)
	}
}

// TestDocServersInBackground: a server command (kvrouter serve, engine)
// followed by other commands in its block ends in "&", so that the block
// pasted into a shell runs as written; TestREADME would run it either
// way, so only this test sees a missing one. A block marked ci: skip
// (several hosts, say) is not checked.
func TestDocServersInBackground(t *testing.T) {
	for _, file := range docFiles(t) {
		for _, b := range readmeBlocks(readDoc(t, file)) {
			if b.skip != "" {
				continue
			}
			for i, c := range b.commands {
				if isServer(c.text) && i+1 < len(b.commands) && !strings.HasSuffix(strings.TrimSpace(c.text), "&") {
					t.Errorf("%s:%d: %q runs in the foreground: the block's next commands would wait for it (end it with &)", file, c.line, c.text)
				}
			}
		}
	}
}

// TestCommandCPULimit: a command of the docs that spins is stopped by
// its CPU budget, as runCommand sets it (here 1 CPU-second), and named
// as such, however long the loaded machine takes to give it that second;
// a command's exit for another cause is not taken for it.
func TestCommandCPULimit(t *testing.T) {
	needTool(t, "bash")
	for _, tc := range []struct {
		cmd  string
		want bool
	}{
		{"while :; do :; done", true},                    // bash itself spins
		{"bash -c 'while :; do :; done'; exit $?", true}, // a child spins; bash reports its signal as 128+24
		{"exit 3", false},
		{"kill -TERM $$", false},
	} {
		c := exec.Command("bash", "-c", "ulimit -t 1\n"+tc.cmd)
		err := c.Run()
		cpu := c.ProcessState.UserTime() + c.ProcessState.SystemTime()
		if got := cpuExceeded(err, cpu, 1); got != tc.want {
			t.Errorf("%q: exit %v after %v of CPU, CPU limit exceeded %v, want %v", tc.cmd, err, cpu, got, tc.want)
		}
	}
}
