package record

import "fmt"

// writer turns batches of entries into lines and writes them, keeping
// what goes wrong to the log (once per failure spell) and the metrics
// (every time). Only the recorder's goroutine uses it.
type writer struct {
	r       *Recorder
	f       *file
	buf     []byte
	failing bool // the last attempt failed: log the recovery
}

// write writes batch as one write: into the open file, after rotating it
// when the batch would take it past its cap; reopening it first when a
// previous open failed. A failure drops the batch.
func (w *writer) write(batch []*Entry) {
	if len(batch) == 0 {
		return
	}
	r := w.r
	if w.f.f == nil {
		if err := w.f.open(); err != nil {
			w.fail("open", err)
			r.drop("write_error", len(batch))
			return
		}
	}
	w.buf = w.buf[:0]
	for i, e := range batch {
		w.buf = r.keys.appendLine(w.buf, e, r.start, i == 0 && w.f.head)
	}
	if w.f.full(len(w.buf)) {
		if err := w.f.rotate(); err != nil {
			w.fail("rotate", err)
			r.drop("write_error", len(batch))
			return
		}
		r.m.rotations.Inc()
		w.buf = w.buf[:0]
		for i, e := range batch {
			w.buf = r.keys.appendLine(w.buf, e, r.start, i == 0)
		}
	}
	if err := w.f.write(w.buf); err != nil {
		w.fail("write", err)
		r.drop("write_error", len(batch))
		return
	}
	r.written.Add(int64(len(batch)))
	r.m.lines.Add(float64(len(batch)))
	r.m.bytes.Add(float64(len(w.buf)))
	if w.failing {
		w.failing = false
		r.log.Info("recording: writing again", "path", w.f.path)
	}
}

// reopen closes the file and opens its path again (SIGHUP).
func (w *writer) reopen() {
	if err := w.f.close(); err != nil {
		w.fail("close", err)
	}
	if err := w.f.open(); err != nil {
		w.fail("open", err)
		return
	}
	w.r.log.Info("recording: file reopened", "path", w.f.path)
}

// fail counts a failed operation and logs the first of a spell.
func (w *writer) fail(op string, err error) {
	r := w.r
	r.errs.Add(1)
	r.m.errors.WithLabelValues(op).Inc()
	msg := fmt.Sprintf("%s %s: %v", op, w.f.path, err)
	r.lastErr.Store(&msg)
	if !w.failing {
		w.failing = true
		r.log.Error("recording: requests are being dropped", "op", op, "path", w.f.path, "err", err)
	}
}
