package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// help is what a subcommand's -h prints before its flags.
type help struct {
	// synopsis is the usage line after "usage: ", e.g.
	// "kvrouter sim [flags]".
	synopsis string
	// about says what the command does, in a few lines of plain text.
	about string
	// examples are command lines, each with an optional "  # comment".
	examples []string
	// own, when set, names the command's own flags, listed before the
	// others (epp's, before those it shares with serve).
	own []string
}

// write writes h and fs's flags to w.
func (h help) write(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n%s\n", h.synopsis, strings.TrimRight(h.about, "\n"))
	if len(h.examples) > 0 {
		fmt.Fprintln(w, "\nexamples:")
		for _, e := range h.examples {
			fmt.Fprintln(w, "  "+e)
		}
	}
	if h.own != nil {
		fmt.Fprintf(w, "\nflags of %s:\n", fs.Name())
		printDefaults(w, fs, func(f *flag.Flag) bool { return slices.Contains(h.own, f.Name) })
		fmt.Fprintln(w, "\nflags shared with serve:")
		printDefaults(w, fs, func(f *flag.Flag) bool { return !slices.Contains(h.own, f.Name) })
		return
	}
	var n int
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n > 0 {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
	}
}

// printDefaults prints the defaults of fs's flags that keep holds for,
// as fs.PrintDefaults prints them all.
func printDefaults(w io.Writer, fs *flag.FlagSet, keep func(*flag.Flag) bool) {
	sub := subFlagSet(fs, keep)
	sub.SetOutput(w)
	sub.PrintDefaults()
}

// subFlagSet is a FlagSet of fs's flags that keep holds for, the same
// values, defaults and help.
func subFlagSet(fs *flag.FlagSet, keep func(*flag.Flag) bool) *flag.FlagSet {
	sub := flag.NewFlagSet(fs.Name(), flag.ContinueOnError)
	fs.VisitAll(func(f *flag.Flag) {
		if keep(f) {
			sub.Var(f.Value, f.Name, f.Usage)
			sub.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	return sub
}

// usageError is a command-line mistake: main prints it with a pointer to
// the command's -h instead of the whole usage.
type usageError struct {
	cmd string
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// parseFlags parses args with fs. On -h it writes h and the flags to
// stderr and returns flag.ErrHelp. A bad flag gives a *usageError naming
// it, with a suggestion for a misspelt flag name, and does not print the
// usage (which would bury the error under a hundred flags).
func parseFlags(fs *flag.FlagSet, args []string, h help, stderr io.Writer) error {
	if len(args) == 1 && args[0] == writeDocsArg { // docgen.go
		return &flagSetRequest{fs}
	}
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		h.write(stderr, fs)
		return flag.ErrHelp
	case err != nil:
		return &usageError{cmd: fs.Name(), err: withFlagSuggestion(fs, err)}
	case fs.NArg() > 0:
		return &usageError{cmd: fs.Name(), err: fmt.Errorf("unexpected arguments %q (flags come as --name value)", fs.Args())}
	}
	return nil
}

// withFlagSuggestion adds "did you mean --x?" to the flag package's
// "flag provided but not defined: -y" when a defined flag is close.
func withFlagSuggestion(fs *flag.FlagSet, err error) error {
	const undefined = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, undefined) {
		return err
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if s := closest(strings.TrimPrefix(msg, undefined), names); s != "" {
		return fmt.Errorf("%w (did you mean --%s?)", err, s)
	}
	return err
}

// closest returns the name in known nearest to s by edit distance, if it
// is within max(2, len(s)/4) edits and no other name is as near; else "".
func closest(s string, known []string) string {
	best, bestD, tie := "", max(2, len(s)/4)+1, false
	for _, k := range known {
		switch d := editDistance(s, k); {
		case d < bestD:
			best, bestD, tie = k, d, false
		case d == bestD:
			tie = true
		}
	}
	if tie {
		return ""
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, sub)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
