package pluginhost

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is an slog.Handler that keeps records, optionally blocking
// until released (a log that has stopped taking lines).
type recorder struct {
	mu      sync.Mutex
	records []slog.Record
	gate    chan struct{} // if non-nil, Handle waits for it to close
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, rec)
	return nil
}

func (r *recorder) messages() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, rec := range r.records {
		out = append(out, rec.Message)
	}
	return out
}

func attrsOf(rec slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	rec.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value; return true })
	return m
}

// Lines are split on newlines across writes, CRLF is trimmed, empty lines
// dropped, a final line without newline flushed, and a long line capped.
func TestLineWriterSplitsAndCapsLines(t *testing.T) {
	rec := &recorder{}
	sink := newLogSink(slog.New(rec))
	w := &lineWriter{sink: sink, stream: "stderr"}
	for _, chunk := range []string{"one\ntw", "o\r\n\n", strings.Repeat("x", 3*maxLogLine), "\nlast"} {
		if n, err := w.Write([]byte(chunk)); n != len(chunk) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	w.flush()
	sink.close()
	msgs := rec.messages()
	if len(msgs) != 4 || msgs[0] != "one" || msgs[1] != "two" || len(msgs[2]) != maxLogLine || msgs[3] != "last" {
		t.Fatalf("lines %q", msgs)
	}
	if !attrsOf(rec.records[2])["truncated"].Bool() {
		t.Error("the long line is not marked truncated")
	}
}

// A log that stops taking lines never blocks the plugin's output: lines
// beyond the queue are dropped, and the drop is reported once it resumes.
func TestLogSinkNeverBlocksAndCountsDrops(t *testing.T) {
	rec := &recorder{gate: make(chan struct{})}
	sink := newLogSink(slog.New(rec))
	w := &lineWriter{sink: sink, stream: "stderr"}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 3 * logQueue {
			_, _ = w.Write([]byte("line\n"))
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Write blocked on a stalled log")
	}
	close(rec.gate)
	sink.close()
	msgs := rec.messages()
	if len(msgs) >= 3*logQueue || !strings.Contains(strings.Join(msgs, "\n"), "plugin log lines dropped") {
		t.Fatalf("%d records, last %q", len(msgs), msgs[len(msgs)-1])
	}
}

// Lines are parsed leniently: hclog JSON with its level, message and
// fields, wrongly typed values rendered, anything else as text.
func TestParseLineIsLenient(t *testing.T) {
	cases := []struct {
		line  string
		level slog.Level
		msg   string
		attrs []string
	}{
		{`{"@level":"warn","@message":"hi","@timestamp":"2024-01-01T00:00:00.000000Z","@module":"m","n":1}`, slog.LevelWarn, "hi", []string{"module", "n"}},
		{`{"@level":"ERROR","@message":"boom"}`, slog.LevelError, "boom", nil},
		{`{"@level":"trace","@message":"t"}`, slog.LevelDebug, "t", nil},
		{`{"@level":1,"@message":["x"],"@timestamp":5}`, slog.LevelInfo, "[x]", nil},
		{`{"@message":null}`, slog.LevelInfo, "", nil},
		{`{"plugin":"spoof","":"empty"}`, slog.LevelInfo, "", []string{"field_", "field_plugin"}},
		{`{"@level":`, slog.LevelInfo, `{"@level":`, nil},
		{`null`, slog.LevelInfo, "null", nil},
		{`[1,2]`, slog.LevelInfo, "[1,2]", nil},
		{"panic: oops", slog.LevelError, "panic: oops", nil},
		{"[WARN] careful", slog.LevelWarn, "[WARN] careful", nil},
		{"\xff\xfebinary", slog.LevelInfo, "\uFFFDbinary", nil},
	}
	for _, c := range cases {
		level, msg, attrs := parseLine([]byte(c.line))
		var keys []string
		for _, a := range attrs {
			keys = append(keys, a.Key)
		}
		if level != c.level || msg != c.msg || strings.Join(keys, ",") != strings.Join(c.attrs, ",") {
			t.Errorf("parseLine(%q) = %v %q %v, want %v %q %v", c.line, level, msg, keys, c.level, c.msg, c.attrs)
		}
	}
}

// Whatever a plugin writes, parsing it never panics and yields valid UTF-8.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{`{"@level":1}`, `{"@message":{"a":[1,{"b":null}]}}`, "plain", `{"@level":`, "\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		_, msg, _ := parseLine(line)
		if !strings.ContainsRune(msg, '\uFFFD') && strings.ToValidUTF8(msg, "") != msg {
			t.Fatalf("message %q is not valid UTF-8", msg)
		}
	})
}
