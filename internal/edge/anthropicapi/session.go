package anthropicapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
)

// SessionHeader is the header Claude Code names its session with, on
// every request of it.
const SessionHeader = "X-Claude-Code-Session-Id"

// maxSessionKey bounds a session key as the client wrote it; a longer one
// is kept as its SHA-256, so that what the Edge holds per session is
// bounded whatever the client sends.
const maxSessionKey = 128

// sessionKey is the key of the conversation a request is a turn of
// (frontend.Turn.Session), from what Anthropic's clients already send:
// the SessionHeader, else metadata.user_id. Claude Code writes user_id as a
// JSON object whose session_id names the session; another client's user_id
// names its end user, whose requests are one conversation as far as the
// Edge can tell. "" for neither.
func sessionKey(h http.Header, userID string) string {
	key := h.Get(SessionHeader)
	if key == "" && userID != "" {
		key = userID
		var inner struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &inner) == nil && inner.SessionID != "" {
			key = inner.SessionID
		}
	}
	if len(key) > maxSessionKey {
		sum := sha256.Sum256([]byte(key))
		key = "sha256:" + hex.EncodeToString(sum[:])
	}
	return key
}

// metadataUserID is metadata.user_id when it is a string, and "" for
// anything else: metadata is Anthropic's, and a shape the Edge does not
// expect costs the session key, never the request.
func metadataUserID(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return ""
	}
	var m struct {
		UserID json.RawMessage `json:"user_id"`
	}
	if json.Unmarshal(raw, &m) != nil {
		return ""
	}
	var id string
	if json.Unmarshal(m.UserID, &id) != nil {
		return ""
	}
	return id
}
