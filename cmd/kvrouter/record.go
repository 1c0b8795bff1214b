package main

import (
	"flag"

	"github.com/kvrouter/kvrouter/record"
)

// recordFlags binds the flags of a recording (docs/own-traffic.md).
func recordFlags(fs *flag.FlagSet, cfg *record.Config) {
	fs.StringVar(&cfg.Path, "record", cfg.Path,
		"append every completed request to this file as a trace kvrouter sim and replay read (JSON lines: Mooncake fields, keyed block and session ids, no prompt text); empty: no recording (the admin API's POST /admin/v1/record starts one)")
	fs.Int64Var(&cfg.MaxBytes, "record-max-bytes", cfg.MaxBytes, "rotate the recording at this size, bytes (FILE.1, FILE.2 ...; 0: 256 MiB; else 4 KiB..1 TiB)")
	fs.IntVar(&cfg.Backups, "record-backups", cfg.Backups, "rotated recording files kept (0: 5; at most 100)")
	fs.Float64Var(&cfg.SampleRate, "record-sample-rate", cfg.SampleRate,
		"fraction of sessions recorded, 0..1, conversations whole (0: all)")
	fs.StringVar(&cfg.KeyFile, "record-key-file", cfg.KeyFile,
		"file of the secret the recording's ids are keyed with (at least 16 bytes), so that recordings with the same key share ids; empty: a random key per recording")
	fs.IntVar(&cfg.Queue, "record-queue", cfg.Queue, "requests waiting to be written at most; past it they are dropped and counted (0: 4096)")
}
