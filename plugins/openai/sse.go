package openai

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strings"
)

// maxEventBytes bounds one server-sent event, so a server that never ends
// a line cannot exhaust memory.
const maxEventBytes = 16 << 20

// errEventTooLarge is returned for an event above maxEventBytes.
var errEventTooLarge = errors.New("server-sent event too large")

// sseEvent is one dispatched server-sent event.
type sseEvent struct {
	Event string // the "event:" field, "" for the default "message"
	Data  string // the "data:" lines, joined by "\n"
}

// sseReader reads server-sent events incrementally, following the
// WHATWG event-stream rules: lines end in "\n" or "\r\n"; a blank line
// dispatches the event; a line starting with ":" is a comment; "field:
// value" drops one space after the colon; several data lines join with
// "\n"; unknown fields (id, retry, ...) are ignored. Unlike a browser, an
// event left pending at the end of the stream is still dispatched, since
// some servers omit the last blank line.
type sseReader struct {
	r *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader {
	return &sseReader{r: bufio.NewReaderSize(r, 32<<10)}
}

// Next returns the next event, or io.EOF after the last one. Other errors
// are the underlying reader's.
func (s *sseReader) Next() (sseEvent, error) {
	var (
		ev      sseEvent
		data    strings.Builder
		hasData bool
		size    int
	)
	for {
		line, err := s.readLine()
		if err != nil {
			if errors.Is(err, io.EOF) && hasData {
				ev.Data = strings.TrimSuffix(data.String(), "\n")
				return ev, nil
			}
			return sseEvent{}, err
		}
		if len(line) == 0 {
			if hasData {
				ev.Data = strings.TrimSuffix(data.String(), "\n")
				return ev, nil
			}
			ev = sseEvent{}
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			size += len(value) + 1
			if size > maxEventBytes {
				return sseEvent{}, errEventTooLarge
			}
			data.Write(value)
			data.WriteByte('\n')
			hasData = true
		case "event":
			ev.Event = string(value)
		}
	}
}

// readLine returns the next line without its line ending. The returned
// slice is valid until the next call.
func (s *sseReader) readLine() ([]byte, error) {
	line, err := s.r.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		buf := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			line, err = s.r.ReadSlice('\n')
			buf = append(buf, line...)
			if len(buf) > maxEventBytes {
				return nil, errEventTooLarge
			}
		}
		line = buf
	}
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) > 0 {
			// A last line without its ending still counts.
			return bytes.TrimSuffix(line, []byte("\r")), nil
		}
		return nil, err
	}
	line = line[:len(line)-1]
	return bytes.TrimSuffix(line, []byte("\r")), nil
}
