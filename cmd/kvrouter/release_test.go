package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
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

// releaseVersion is the version TestReleaseScript releases, in a copy of
// the repository: the first release's, whose heading the CHANGELOG gets
// when it is cut.
const releaseVersion = "v0.1.0"

// releaseCopy copies the repository's tracked files (as they are in the
// work tree) to a new directory, cuts the release there as a maintainer
// would (CHANGELOG.md's "## Unreleased" becomes an empty one above
// "## releaseVersion - 2026-12-07"), commits the copy in a git
// repository of its own, and returns its root.
func releaseCopy(t *testing.T, root string) string {
	t.Helper()
	files, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout (git ls-files: %v): no clean checkout to copy", err)
	}
	dst := t.TempDir()
	for _, f := range strings.Split(strings.TrimRight(string(files), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(root, f))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dst, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	changelog := filepath.Join(dst, "CHANGELOG.md")
	b, err := os.ReadFile(changelog)
	if err != nil {
		t.Fatal(err)
	}
	cut := strings.Replace(string(b), "\n## Unreleased\n", "\n## Unreleased\n\n## "+releaseVersion+" - 2026-12-07\n", 1)
	if cut == string(b) {
		t.Fatal("CHANGELOG.md has no \"## Unreleased\" line to cut the release under")
	}
	if err := os.WriteFile(changelog, []byte(cut), 0o644); err != nil {
		t.Fatal(err)
	}
	git(t, dst, "init", "-q")
	git(t, dst, "add", "-A")
	git(t, dst, "commit", "-q", "-m", "release "+releaseVersion)
	return dst
}

// git runs git with args in dir as a throwaway identity.
func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=release test", "-c", "user.email=release@test.invalid", "-c", "commit.gpgsign=false"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

// TestReleaseScript: in a committed copy of the repository with the
// release cut in its CHANGELOG, scripts/release.sh v0.1.0 builds static
// linux/amd64 and linux/arm64 binaries (ELF of each machine) that report
// the version, with their SHA256SUMS, says it builds no image when told
// there is no container engine, and says how to tag; it uses the
// Dockerfile's build flags. It refuses, before building anything: a
// version that is not semantic, one the CHANGELOG has no heading for,
// one the manifests do not run, and a checkout with uncommitted or
// untracked files. The repository's own CHANGELOG is not touched.
func TestReleaseScript(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles kvrouter twice")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	root := repoRoot(t)
	src, err := os.ReadFile(filepath.Join(root, "scripts", "release.sh"))
	if err != nil {
		t.Fatal(err)
	}
	d := readDockerfile(t, filepath.Join(root, "Dockerfile"))
	const flags = `go build -trimpath -ldflags="-s -w -X main.version=$`
	if !strings.Contains(d.build, flags) || !bytes.Contains(src, []byte(flags)) {
		t.Errorf("the Dockerfile (%q) and release.sh do not both run %s...", d.build, flags)
	}
	repo := releaseCopy(t, root)
	run := func(args ...string) (string, int) {
		cmd := exec.Command("bash", append([]string{filepath.Join(repo, "scripts", "release.sh")}, args...)...)
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
	refusals := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"0.1.0"}, 2, "usage"},
		{[]string{"v0.1"}, 2, "usage"},
		{[]string{"v0.1.1"}, 1, "CHANGELOG.md has no \"## v0.1.1 - YYYY-MM-DD\" heading"},
	}
	for _, r := range refusals {
		if out, code := run(append(r.args, t.TempDir())...); code != r.code || !strings.Contains(out, r.want) || strings.Contains(out, "go build") {
			t.Errorf("release.sh %v: exit %d, %q; want %d, %q and nothing built", r.args, code, out, r.code, r.want)
		}
	}
	// A version the manifests do not run: the CHANGELOG has its heading,
	// deploy/kustomization.yaml another tag.
	edit(t, filepath.Join(repo, "CHANGELOG.md"), "\n## Unreleased\n", "\n## Unreleased\n\n## v0.1.1 - 2026-12-08\n")
	git(t, repo, "commit", "-q", "-am", "v0.1.1's heading")
	if out, code := run("v0.1.1", t.TempDir()); code != 1 || !strings.Contains(out, "newTag is not v0.1.1") {
		t.Errorf("release.sh v0.1.1 with newTag %s: exit %d, %q; want 1: the manifests' tag", releaseVersion, code, out)
	}
	// A dirty checkout: an uncommitted change, then an untracked file.
	readme := filepath.Join(repo, "README.md")
	edit(t, readme, "# ", "# (edited) ")
	if out, code := run(releaseVersion, t.TempDir()); code != 1 || !strings.Contains(out, "uncommitted or untracked") {
		t.Errorf("release.sh in a checkout with a change: exit %d, %q; want 1", code, out)
	}
	git(t, repo, "checkout", "--", "README.md")
	if err := os.WriteFile(filepath.Join(repo, "cmd", "kvrouter", "stray.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := run(releaseVersion, t.TempDir()); code != 1 || !strings.Contains(out, "uncommitted or untracked") {
		t.Errorf("release.sh in a checkout with an untracked file: exit %d, %q; want 1", code, out)
	}
	os.Remove(filepath.Join(repo, "cmd", "kvrouter", "stray.go"))

	dist := t.TempDir()
	out, code := run(releaseVersion, dist)
	if code != 0 {
		t.Fatalf("release.sh %s: exit %d\n%s", releaseVersion, code, out)
	}
	if !strings.Contains(out, "image kvrouter:"+releaseVersion+" not built (binaries only)") || !strings.Contains(out, "git tag -a "+releaseVersion) {
		t.Errorf("release.sh without a container engine says %q, want that it built no image, and how to tag", out)
	}
	checkRelease(t, dist, releaseVersion)
}

// edit replaces the first old in the file path with new, failing t when
// there is none.
func edit(t *testing.T, path, old, new string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), old, new, 1)
	if s == string(b) {
		t.Fatalf("%s has no %q", path, old)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

// checkRelease checks release.sh's output in dist: a static binary of
// each architecture, of its machine, in SHA256SUMS, the one of this
// machine reporting version.
func checkRelease(t *testing.T, dist, version string) {
	t.Helper()
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		name := "kvrouter-" + version + "-linux-" + arch
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
			wantVersion(t, path, version)
		}
	}
}
