package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// buildInfo is what the binary knows of its own build, from the Go
// toolchain's build information (runtime/debug.ReadBuildInfo): nothing is
// set by hand or by ldflags.
type buildInfo struct {
	// Version is the main module's version: a tag (v0.3.1) or a
	// pseudo-version (go install ...@version, or a build from a git
	// checkout, "+dirty" with uncommitted changes); "(devel)" for a build
	// without VCS information.
	Version string
	// Revision is the VCS commit the binary was built from (vcs.revision);
	// empty when the build was not stamped (no VCS, -buildvcs=false, go
	// run of files).
	Revision string
	// Time is the commit's time (vcs.time), RFC 3339; empty when unknown.
	Time string
	// Dirty reports uncommitted changes in the work tree at build time
	// (vcs.modified).
	Dirty bool
	// GoVersion is the toolchain that built the binary, e.g. go1.26.8.
	GoVersion string
}

// readBuildInfo returns this binary's build information.
func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return buildInfo{Version: "unknown", GoVersion: runtime.Version()}
	}
	return parseBuildInfo(bi)
}

// parseBuildInfo extracts a buildInfo from the toolchain's.
func parseBuildInfo(bi *debug.BuildInfo) buildInfo {
	b := buildInfo{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if b.Version == "" {
		b.Version = "(devel)"
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.time":
			b.Time = s.Value
		case "vcs.modified":
			b.Dirty = s.Value == "true"
		}
	}
	return b
}

// String is the one line "kvrouter version" prints: logfmt-like
// key=value pairs, the unknown ones left out.
func (b buildInfo) String() string {
	parts := []string{"kvrouter", "version=" + b.Version}
	if b.Revision != "" {
		parts = append(parts, "revision="+b.Revision, fmt.Sprintf("dirty=%t", b.Dirty))
	}
	if b.Time != "" {
		parts = append(parts, "time="+b.Time)
	}
	parts = append(parts, "go="+b.GoVersion, "platform="+runtime.GOOS+"/"+runtime.GOARCH)
	return strings.Join(parts, " ")
}

var versionHelp = help{
	synopsis: "kvrouter version",
	about: "Prints the build: the module version (a tag, or a pseudo-version naming the\n" +
		"commit, with +dirty for uncommitted changes; \"(devel)\" when the build had no VCS\n" +
		"information), the commit it was built from and whether the work tree had\n" +
		"uncommitted changes (dirty), the commit time, and the Go toolchain, all from the\n" +
		"build information Go stamps into the binary. \"kvrouter --version\" is the same.",
	examples: []string{"kvrouter version", "kvrouter --version"},
}

// runVersion is "kvrouter version".
func runVersion(_ context.Context, args []string) error {
	return versionCommand(args, os.Stdout, os.Stderr)
}

func versionCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := parseFlags(fs, args, versionHelp, stderr); err != nil {
		return err
	}
	_, err := fmt.Fprintln(stdout, readBuildInfo())
	return err
}
