package secret

import (
	"bytes"
	"io"
	"sync"
)

// Writer redacts text written to an underlying writer, line by line: a
// command's text output goes through one, so that no printf anywhere can
// show a secret. It holds back an incomplete line until its newline or
// Flush, so a value split across two writes is still found (a secret never
// holds a line break). JSON documents should not go through it: redact
// them with Redactor.JSON, which touches strings only, and write them to
// the underlying writer.
type Writer struct {
	mu  sync.Mutex
	w   io.Writer
	r   func() *Redactor
	buf []byte
}

// NewWriter returns a Writer onto w. redactor is asked for the redactor
// at every line, so the configuration may be loaded (and its secrets
// registered) after the Writer is made; it may return nil.
func NewWriter(w io.Writer, redactor func() *Redactor) *Writer {
	return &Writer{w: w, r: redactor}
}

// Write buffers p and writes every complete line, redacted. It reports
// len(p) written unless the underlying writer fails.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	i := bytes.LastIndexByte(w.buf, '\n')
	if i < 0 {
		return len(p), nil
	}
	err := w.emit(w.buf[:i+1])
	w.buf = append(w.buf[:0], w.buf[i+1:]...)
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is left of an incomplete last line, redacted.
func (w *Writer) Flush() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) == 0 {
		return nil
	}
	err := w.emit(w.buf)
	w.buf = w.buf[:0]
	return err
}

// Raw is the underlying writer, for documents already redacted.
func (w *Writer) Raw() io.Writer { return w.w }

func (w *Writer) emit(b []byte) error {
	var r *Redactor
	if w.r != nil {
		r = w.r()
	}
	_, err := io.WriteString(w.w, r.String(string(b)))
	return err
}
