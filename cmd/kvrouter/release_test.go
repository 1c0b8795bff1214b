package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// testVersion is the release version the tests stamp.
const testVersion = "v9.8.7-test.1"

// repoRoot is the module's root, two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// wantVersion runs bin's "version" and "--version" and fails unless both
// print version=want.
func wantVersion(t *testing.T, bin, want string) {
	t.Helper()
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", bin, arg, err, out)
		}
		if !strings.HasPrefix(string(out), "kvrouter version="+want+" ") {
			t.Errorf("%s %s: got %q, want it to start with %q", filepath.Base(bin), arg, out, "kvrouter version="+want+" ")
		}
	}
}

// TestReleaseVersion: a build with -ldflags "-X main.version=..." (what
// scripts/release.sh and the Dockerfile do) reports that version from
// "kvrouter version" and "kvrouter --version"; the test's own build,
// without it, reports the toolchain's (a pseudo-version or "(devel)").
func TestReleaseVersion(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "kvrouter")
	args := []string{"build", "-ldflags=-X main.version=" + testVersion, "-o", bin}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil && bytes.Contains(out, []byte("VCS")) {
		out, err = exec.Command("go", append(args, "-buildvcs=false", ".")...).CombinedOutput()
	}
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	wantVersion(t, bin, testVersion)
	plain := runBin(t, t.TempDir(), nil, 30*time.Second, "version")
	if strings.Contains(plain.stdout, testVersion) || !strings.HasPrefix(plain.stdout, "kvrouter version=") {
		t.Errorf("unstamped build: %q, want the toolchain's version", plain.stdout)
	}
}

// dockerfile is what TestDockerfileBuild reads of the Dockerfile.
type dockerfile struct {
	stages   map[string]bool   // stage names (FROM ... AS name)
	args     map[string]string // ARG defaults
	copies   [][]string        // COPY arguments, --from=... kept
	build    string            // the build stage's RUN go build command, continued lines joined
	entry    string            // ENTRYPOINT's executable
	workdir  string
	fromLast string // the final stage's base image
}

// readDockerfile parses the few instructions the Dockerfile uses.
func readDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := dockerfile{stages: map[string]bool{}, args: map[string]string{}}
	var line string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || l == "" {
			continue
		}
		if cont, ok := strings.CutSuffix(l, "\\"); ok {
			line += cont
			continue
		}
		line += l
		f := strings.Fields(line)
		switch strings.ToUpper(f[0]) {
		case "FROM":
			d.fromLast = f[1]
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				d.stages[f[3]] = true
			}
		case "ARG":
			k, v, _ := strings.Cut(f[1], "=")
			if _, seen := d.args[k]; !seen || v != "" {
				d.args[k] = v
			}
		case "COPY":
			d.copies = append(d.copies, f[1:])
		case "RUN":
			if strings.Contains(line, "go build") {
				d.build = strings.TrimSpace(strings.TrimPrefix(line, f[0]))
			}
		case "WORKDIR":
			d.workdir = f[1]
		case "ENTRYPOINT":
			d.entry = strings.Trim(strings.TrimPrefix(line, f[0]), ` ["]`)
		}
		line = ""
	}
	return d
}

// TestDockerfileBuild: the image cannot be built here (no container
// daemon, and the base images' registries are out of reach), so the test
// runs the Dockerfile's own build command as its build stage would, with
// its ARGs (TARGETARCH this machine's, VERSION set), from the build
// context (the repository, its WORKDIR), and checks that the result
// reports the version; that every COPY source exists in the context or
// is the build stage's output; and that the ENTRYPOINT is the binary the
// final stage copies in.
func TestDockerfileBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles kvrouter with -trimpath (a full build)")
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image's binary is linux's")
	}
	root := repoRoot(t)
	d := readDockerfile(t, filepath.Join(root, "Dockerfile"))
	if !d.stages["build"] || d.workdir == "" || d.build == "" {
		t.Fatalf("Dockerfile: stages %v, WORKDIR %q, build command %q: want a build stage that runs go build", d.stages, d.workdir, d.build)
	}
	m := regexp.MustCompile(`-o (\S+) (\./\S+)$`).FindStringSubmatch(d.build)
	if m == nil {
		t.Fatalf("build command %q: want it to end in -o OUT ./PACKAGE", d.build)
	}
	out, pkg := m[1], m[2]
	if _, err := os.Stat(filepath.Join(root, pkg, "main.go")); err != nil {
		t.Errorf("the build stage builds %s: %v", pkg, err)
	}
	copied := ""
	for _, c := range d.copies {
		if from, ok := strings.CutPrefix(c[0], "--from="); ok {
			if !d.stages[from] || c[1] != out {
				t.Errorf("COPY %s: want --from=build of %s, the build stage's output", strings.Join(c, " "), out)
			}
			copied = c[2]
			continue
		}
		for _, src := range c[:len(c)-1] {
			if _, err := os.Stat(filepath.Join(root, src)); err != nil {
				t.Errorf("COPY %s: %v", src, err)
			}
		}
	}
	if copied == "" || d.entry != copied {
		t.Errorf("ENTRYPOINT %q, want the binary copied from the build stage (%q)", d.entry, copied)
	}
	bin := filepath.Join(t.TempDir(), "kvrouter")
	args := map[string]string{}
	for k, v := range d.args {
		args[k] = v
	}
	args["TARGETARCH"], args["VERSION"] = runtime.GOARCH, testVersion
	cmdline := strings.Replace(d.build, "-o "+out, "-o "+bin, 1)
	cmd := exec.Command("bash", "-c", cmdline)
	cmd.Dir = root
	cmd.Env = os.Environ()
	for k, v := range args {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if o, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, o)
	}
	wantVersion(t, bin, testVersion)
}

// TestReleaseScript: scripts/release.sh --snapshot builds static
// linux/amd64 and linux/arm64 binaries (ELF of each machine) that report
// the version, with their SHA256SUMS, and says it builds no image when
// told there is no container engine; it uses the Dockerfile's build
// flags. Without --snapshot it refuses a version the CHANGELOG has no
// heading for, and any version that is not semantic.
func TestReleaseScript(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles kvrouter twice")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	root := repoRoot(t)
	script := filepath.Join(root, "scripts", "release.sh")
	src, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	d := readDockerfile(t, filepath.Join(root, "Dockerfile"))
	const flags = `go build -trimpath -ldflags="-s -w -X main.version=$`
	if !strings.Contains(d.build, flags) || !bytes.Contains(src, []byte(flags)) {
		t.Errorf("the Dockerfile (%q) and release.sh do not both run %s...", d.build, flags)
	}
	run := func(args ...string) (string, int) {
		cmd := exec.Command("bash", append([]string{script}, args...)...)
		cmd.Env = append(os.Environ(), "CONTAINER=none")
		o, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(o), code
	}
	if out, code := run("9.8.7"); code != 2 || !strings.Contains(out, "usage") {
		t.Errorf("release.sh 9.8.7: exit %d, %q; want 2 and the usage", code, out)
	}
	if out, code := run(testVersion, t.TempDir()); code != 1 || !strings.Contains(out, "CHANGELOG.md has no") {
		t.Errorf("release.sh %s: exit %d, %q; want 1: no CHANGELOG heading", testVersion, code, out)
	}
	dist := t.TempDir()
	out, code := run("--snapshot", testVersion, dist)
	if code != 0 {
		t.Fatalf("release.sh --snapshot: exit %d\n%s", code, out)
	}
	if !strings.Contains(out, "image kvrouter:"+testVersion+" not built (binaries only)") {
		t.Errorf("release.sh without a container engine says %q, want that it built no image", out)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		name := "kvrouter-" + testVersion + "-linux-" + arch
		path := filepath.Join(dist, name)
		f, err := elf.Open(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if f.Machine != machine || f.Progs == nil {
			t.Errorf("%s: machine %v, want %v", name, f.Machine, machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s: dynamically linked, want static (CGO_ENABLED=0)", name)
			}
		}
		f.Close()
		b, _ := os.ReadFile(path)
		sum := sha256.Sum256(b)
		if !bytes.Contains(sums, []byte(hex.EncodeToString(sum[:])+"  "+name)) {
			t.Errorf("SHA256SUMS lacks %s's", name)
		}
		if runtime.GOOS == "linux" && runtime.GOARCH == arch {
			wantVersion(t, path, testVersion)
		}
	}
}
