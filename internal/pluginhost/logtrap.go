package pluginhost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// The stderr trap (ARCHITECTURE decision 7). go-plugin v1.8 parses each
// stderr line of a plugin as an hclog JSON entry and panics on some of them
// (a non-string "@message", for one), which would take the Node down. So
// go-plugin gets a logger whose level is Off, which makes it skip parsing,
// and writes the raw stream into a lineWriter instead. A lineWriter never
// blocks the plugin's pipe: it splits lines, caps their length and queues
// them on a bounded logSink, which drops (and counts) what does not fit.
// One goroutine per plugin drains the sink into the Node's slog logger,
// parsing lines leniently: it cannot panic and never waits on the plugin.

const (
	// maxLogLine caps one logged line; the rest of a longer line is dropped.
	maxLogLine = 8 << 10
	// logQueue is how many lines wait for the logger before lines drop.
	logQueue = 512
	// maxLogFields caps the fields taken from one JSON line.
	maxLogFields = 32
)

// rawLine is one line of plugin output on its way to the logger.
type rawLine struct {
	stream    string // "stderr" or "stdout"
	text      []byte
	truncated bool
}

// logSink queues lines from a plugin's output streams and logs them from
// one goroutine.
type logSink struct {
	log     *slog.Logger
	lines   chan rawLine
	dropped atomic.Uint64
	done    chan struct{}

	mu     sync.Mutex // guards closed and sends on lines
	closed bool
}

func newLogSink(log *slog.Logger) *logSink {
	s := &logSink{log: log, lines: make(chan rawLine, logQueue), done: make(chan struct{})}
	go s.run()
	return s
}

// push queues l, or drops it when the queue is full or the sink closed.
func (s *logSink) push(l rawLine) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.dropped.Add(1)
		return
	}
	select {
	case s.lines <- l:
	default:
		s.dropped.Add(1)
	}
}

func (s *logSink) run() {
	defer close(s.done)
	for l := range s.lines {
		s.reportDropped()
		logLine(s.log, l)
	}
	s.reportDropped()
}

func (s *logSink) reportDropped() {
	if n := s.dropped.Swap(0); n > 0 {
		s.log.Warn("plugin log lines dropped: the plugin wrote faster than the log took them", "dropped", n)
	}
}

// close stops taking lines and waits until the queued ones are logged.
func (s *logSink) close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.lines)
	}
	s.mu.Unlock()
	<-s.done
}

// lineWriter splits one output stream into lines for a logSink. Write
// never blocks and never fails: go-plugin's reader goroutine (and with it
// the plugin's pipe) must keep moving whatever the plugin writes.
type lineWriter struct {
	sink   *logSink
	stream string

	mu        sync.Mutex
	partial   []byte
	truncated bool
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxLogLine - len(w.partial); len(chunk) > room {
			chunk = chunk[:room]
			w.truncated = true
		}
		w.partial = append(w.partial, chunk...)
		if i < 0 {
			break
		}
		w.flushLocked()
		p = p[i+1:]
	}
	return n, nil
}

// flush logs a final line that had no newline.
func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 || w.truncated {
		w.flushLocked()
	}
}

func (w *lineWriter) flushLocked() {
	line := bytes.TrimSuffix(w.partial, []byte{'\r'})
	if len(line) > 0 || w.truncated {
		w.sink.push(rawLine{stream: w.stream, text: slices.Clone(line), truncated: w.truncated})
	}
	w.partial = w.partial[:0]
	w.truncated = false
}

// logLine logs one plugin line: an hclog JSON entry with its level,
// message and fields, anything else as text at info (error for what looks
// like a panic). It never panics, whatever the line holds.
func logLine(log *slog.Logger, l rawLine) {
	level, msg, attrs := parseLine(l.text)
	if l.stream != "stderr" {
		attrs = append(attrs, slog.String("stream", l.stream))
	}
	if l.truncated {
		attrs = append(attrs, slog.Bool("truncated", true))
	}
	log.LogAttrs(context.Background(), level, msg, attrs...)
}

// parseLine reads a plugin's log line leniently.
func parseLine(line []byte) (slog.Level, string, []slog.Attr) {
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		var entry map[string]any
		if json.Unmarshal(trimmed, &entry) == nil && entry != nil {
			return parseEntry(entry)
		}
	}
	text := safeText(line)
	level := slog.LevelInfo
	switch {
	case strings.HasPrefix(text, "panic: "), strings.HasPrefix(text, "fatal error: "),
		strings.HasPrefix(text, "[ERROR]"):
		level = slog.LevelError
	case strings.HasPrefix(text, "[WARN]"):
		level = slog.LevelWarn
	case strings.HasPrefix(text, "[DEBUG]"), strings.HasPrefix(text, "[TRACE]"):
		level = slog.LevelDebug
	}
	return level, text, nil
}

// parseEntry reads an hclog JSON entry: "@level", "@message", "@module",
// and the other keys as fields (sorted, at most maxLogFields). Values of
// the wrong type are rendered, never asserted.
func parseEntry(entry map[string]any) (slog.Level, string, []slog.Attr) {
	level := slog.LevelInfo
	if s, ok := entry["@level"].(string); ok {
		level = levelOf(s)
	}
	msg := ""
	switch m := entry["@message"].(type) {
	case nil:
	case string:
		msg = safeText([]byte(m))
	default:
		msg = safeText(fmt.Appendf(nil, "%v", m))
	}
	keys := make([]string, 0, len(entry))
	for k := range entry {
		switch k {
		case "@level", "@message", "@timestamp", "@caller":
		default:
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var attrs []slog.Attr
	for i, k := range keys {
		if i == maxLogFields {
			attrs = append(attrs, slog.Int("fields_dropped", len(keys)-maxLogFields))
			break
		}
		name := strings.TrimPrefix(safeText([]byte(k)), "@")
		if name == "" || name == "plugin" {
			name = "field_" + name
		}
		attrs = append(attrs, slog.Any(name, entry[k]))
	}
	return level, msg, attrs
}

func levelOf(s string) slog.Level {
	s = strings.ToLower(strings.TrimSpace(s))
	switch {
	case strings.HasPrefix(s, "trace"), strings.HasPrefix(s, "debug"):
		return slog.LevelDebug
	case strings.HasPrefix(s, "warn"):
		return slog.LevelWarn
	case strings.HasPrefix(s, "err"), strings.HasPrefix(s, "fatal"), strings.HasPrefix(s, "panic"):
		return slog.LevelError
	}
	return slog.LevelInfo
}

// safeText returns b as valid UTF-8 (invalid bytes replaced).
func safeText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
