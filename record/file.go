package record

import (
	"fmt"
	"os"
	"strconv"
)

// file is the recording's file with its size-capped rotation. Only the
// writer goroutine touches it.
type file struct {
	path     string
	maxBytes int64
	backups  int
	f        *os.File // nil: closed, or the last open failed
	size     int64
	head     bool // the next line is the first of this open file
}

// open opens path for appending, creating it.
func (f *file) open() error {
	h, err := os.OpenFile(f.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return err
	}
	fi, err := h.Stat()
	if err != nil {
		h.Close()
		return err
	}
	f.f, f.size, f.head = h, fi.Size(), true
	return nil
}

// close closes the open file, if any.
func (f *file) close() error {
	if f.f == nil {
		return nil
	}
	err := f.f.Close()
	f.f = nil
	return err
}

// full reports whether n more bytes take the file past its cap (an empty
// file takes any line).
func (f *file) full(n int) bool { return f.size > 0 && f.size+int64(n) > f.maxBytes }

// rotate renames path to path.1, shifting path.1 .. to path.2 .. and
// dropping what falls past backups, and opens a new path.
func (f *file) rotate() error {
	if err := f.close(); err != nil {
		return err
	}
	os.Remove(f.backup(f.backups)) // absent is fine
	for i := f.backups - 1; i >= 1; i-- {
		if err := os.Rename(f.backup(i), f.backup(i+1)); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	if err := os.Rename(f.path, f.backup(1)); err != nil {
		return fmt.Errorf("rotate: %w", err)
	}
	return f.open()
}

func (f *file) backup(i int) string { return f.path + "." + strconv.Itoa(i) }

// write writes b, counting what reached the file.
func (f *file) write(b []byte) error {
	n, err := f.f.Write(b)
	f.size += int64(n)
	if err == nil {
		f.head = false
	}
	return err
}
