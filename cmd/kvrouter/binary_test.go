package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// built is the kvrouter binary the tests run, built once per test binary
// into its own directory (removed by TestMain). It is built the way a user
// builds it (go build, VCS stamping as the environment has it) and without
// -race even when the tests have it: the race detector slows the README's
// simulations tenfold, and after go vet (CI runs it first) the packages
// are already compiled.
var built = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "kvrouter-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "kvrouter")
	args := []string{"build", "-o", bin}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil && bytes.Contains(out, []byte("VCS")) {
		// A checkout git refuses to read (another owner): build unstamped.
		out, err = exec.Command("go", append(args, "-buildvcs=false", ".")...).CombinedOutput()
	}
	if err != nil {
		return "", &buildError{out: string(out), err: err}
	}
	return bin, nil
})

type buildError struct {
	out string
	err error
}

func (e *buildError) Error() string { return "go build: " + e.err.Error() + "\n" + e.out }

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := built(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

// kvrouterBin returns the built binary's path, failing t if the build did.
func kvrouterBin(t *testing.T) string {
	t.Helper()
	bin, err := built()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

// runBin runs the built kvrouter with args and env (added to a clean
// environment: PATH and HOME only, so the caller's KVROUTER_* variables
// do not leak in) in dir, for at most timeout.
func runBin(t *testing.T, dir string, env []string, timeout time.Duration, args ...string) result {
	t.Helper()
	bin := kvrouterBin(t) // before the clock starts: the first call builds it
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("kvrouter %s: still running after %v\nstderr:\n%s", strings.Join(args, " "), timeout, stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{stdout.String(), stderr.String(), code}
}
