package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// version is the release's semantic version (v0.1.0), set by a release
// build: go build -ldflags "-X main.version=v0.1.0" (scripts/release.sh,
// the Dockerfile's VERSION). Empty in any other build, whose version
// comes from the toolchain's VCS stamping. It is the one variable the
// linker sets; nothing assigns it.
var version string

// buildInfo is what the binary knows of its own build: the release
// version the linker set (version), else the Go toolchain's build
// information (runtime/debug.ReadBuildInfo).
type buildInfo struct {
	// Version is the release version when the build set one (v0.1.0),
	// else the main module's version: a tag (v0.3.1) or a pseudo-version
	// (go install ...@version, or a build from a git checkout, "+dirty"
	// with uncommitted changes); "(devel)" for a build without VCS
	// information.
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
		return buildInfo{Version: cmp.Or(version, "unknown"), GoVersion: runtime.Version()}
	}
	return parseBuildInfo(bi, version)
}

// parseBuildInfo extracts a buildInfo from the toolchain's; release, when
// not empty, is the version (a release build's).
func parseBuildInfo(bi *debug.BuildInfo, release string) buildInfo {
	b := buildInfo{Version: cmp.Or(release, bi.Main.Version, "(devel)"), GoVersion: bi.GoVersion}
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
	about: "Prints the build: the release's semantic version (v0.1.0) for a release build\n" +
		"(scripts/release.sh, the image), else the module version (a tag, or a\n" +
		"pseudo-version naming the commit, with +dirty for uncommitted changes; \"(devel)\"\n" +
		"when the build had no VCS information); then the commit it was built from and\n" +
		"whether the work tree had uncommitted changes (dirty), the commit time, and the Go\n" +
		"toolchain, from the build information Go stamps into the binary.\n" +
		"\"kvrouter --version\" is the same.",
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
