package record

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
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

// open opens path for appending, creating it (openRegular).
func (f *file) open() error {
	h, err := openRegular(f.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
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

// openRegular opens path with flag (and perm when it creates it) only if
// it is a regular file, not through a symbolic link: a link planted in a
// recordings' directory would have the router append to whatever it
// points to (any file the router may write), and a FIFO would block the
// open, and with it the admin API, until a reader came. The open is
// non-blocking (O_NONBLOCK, which a regular file ignores), the last
// component is not followed (O_NOFOLLOW), and what was opened is checked
// before use.
func openRegular(path string, flag int, perm os.FileMode) (*os.File, error) {
	h, err := os.OpenFile(path, flag|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, perm)
	switch {
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("open %s: a symbolic link; recordings and keys are opened only as regular files", path)
	case errors.Is(err, syscall.ENXIO): // a FIFO without a reader, opened for writing
		return nil, fmt.Errorf("open %s: not a regular file (a FIFO or a device); recordings and keys are opened only as regular files", path)
	}
	if err != nil {
		return nil, err
	}
	fi, err := h.Stat()
	if err != nil {
		h.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		h.Close()
		return nil, fmt.Errorf("open %s: not a regular file (%s); recordings and keys are opened only as regular files", path, kind(fi.Mode()))
	}
	return h, nil
}

// kind names a file mode's type for an error.
func kind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeDevice != 0:
		return "a device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return m.Type().String()
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
