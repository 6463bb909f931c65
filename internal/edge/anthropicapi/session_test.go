package anthropicapi

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	ft "github.com/iop-dev/iop/internal/edge/frontend/frontendtest"
)

func TestSessionKey(t *testing.T) {
	long := strings.Repeat("s", maxSessionKey+1)
	tests := []struct {
		name, header, userID, want string
	}{
		{"none", "", "", ""},
		{"Claude Code's header", "9f1c-session", `{"session_id":"other"}`, "9f1c-session"},
		{"Claude Code's user_id: its session_id", "", `{"device_id":"d","account_uuid":"","session_id":"9f1c"}`, "9f1c"},
		{"JSON without a session_id: the whole string", "", `{"device_id":"d"}`, `{"device_id":"d"}`},
		{"another client's user_id", "", "user-42", "user-42"},
		{"a key past the bound is hashed", long, "", "sha256:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.header != "" {
				h.Set(SessionHeader, tt.header)
			}
			got := sessionKey(h, tt.userID)
			if got != tt.want && !(strings.HasSuffix(tt.want, ":") && strings.HasPrefix(got, tt.want) && len(got) == len(tt.want)+64) {
				t.Errorf("sessionKey = %q, want %q", got, tt.want)
			}
		})
	}
	for _, raw := range []string{`{"user_id":5}`, `"x"`, `[]`, `{"user_id":"u"`, ``} {
		if id := metadataUserID([]byte(raw)); id != "" {
			t.Errorf("metadataUserID(%s) = %q, want none", raw, id)
		}
	}
	if id := metadataUserID([]byte(` {"user_id":"u1","other":true}`)); id != "u1" {
		t.Errorf("metadataUserID = %q, want u1", id)
	}
}

// Issue 21 (session affinity): the key the client names its session with
// reaches the plan the run is dispatched under; a count names none.
func TestSessionReachesThePlan(t *testing.T) {
	rec := &sessionRecorder{Dispatcher: &ft.Dispatcher{Events: []ft.Step{ft.Usage(3, 1), ft.Completed("stop")}}}
	e := newEnvOver(t, rec, rec.Dispatcher)
	body := `{"model":"m1","max_tokens":8,"metadata":{"user_id":"{\"session_id\":\"from-metadata\"}"},"messages":[{"role":"user","content":"hi"}]}`
	for _, w := range []interface{ Result() *http.Response }{
		e.postTo("/v1/messages?beta=true", body, http.Header{SessionHeader: {"from-header"}}),
		e.post(body),
		e.post(plainBody),
		e.postTo("/v1/messages/count_tokens", body, http.Header{SessionHeader: {"from-header"}}),
	} {
		if r := w.Result(); r.StatusCode != http.StatusOK {
			t.Fatalf("status %d", r.StatusCode)
		}
	}
	if got, want := rec.sessions(), []string{"from-header", "from-metadata", "", ""}; !slices.Equal(got, want) {
		t.Errorf("plans' sessions %q, want %q", got, want)
	}
}
