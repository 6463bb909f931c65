package sdk

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
)

type describeOnly struct{}

func (describeOnly) Info() Info                              { return Info{Name: "d", Version: "1"} }
func (describeOnly) Configure(context.Context, Config) error { return nil }
func (describeOnly) Execute(context.Context, *Request, EventSink) (*Result, error) {
	return &Result{}, nil
}

type panicInfo struct{ describeOnly }

func (panicInfo) Info() Info { panic("no info") }

// describe prints every key, with [] and {} rather than null.
func TestDescribeWritesEveryKey(t *testing.T) {
	var buf bytes.Buffer
	if err := Describe(&buf, describeOnly{}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"name", "version", "description", "config_fields", "capabilities", "protocol_version"} {
		if _, ok := got[k]; !ok {
			t.Errorf("describe lacks %q: %s", k, buf.String())
		}
	}
	if got["capabilities"] == nil || got["config_fields"] == nil || got["protocol_version"] != float64(1) {
		t.Errorf("describe = %s", buf.String())
	}
	if err := Describe(&buf, panicInfo{}); err == nil {
		t.Error("a panicking Info did not fail describe")
	}
}

// The adapter's log lines carry hclog's keys, which the host parses.
func TestPluginLoggerWritesHclogKeys(t *testing.T) {
	var buf bytes.Buffer
	newPluginLogger(&buf, "debug").Debug("hello", "k", 1)
	newPluginLogger(&buf, "bogus").Debug("hidden at the default level")
	var line map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if line["@message"] != "hello" || line["@level"] != "debug" || line["@timestamp"] == nil || line["k"] != float64(1) {
		t.Errorf("line %v", line)
	}
}
