package openaiapi

import "net/http"

// sessionKey is the conversation a request is a turn of, as the client
// names it (frontend.Turn.Session, for session affinity): its
// prompt_cache_key, which OpenAI's own caching is keyed on and which Codex
// sets to its session id; else the session-id (or session_id) header Codex
// sends; else the end user the request is for (user, then
// safety_identifier), whose turns share a prefix as often as a session's.
// "" for none. A key is only ever matched within the principal that sent
// it (frontend.Turn.Session).
func sessionKey(r *http.Request, promptCacheKey, user, safetyIdentifier string) string {
	if promptCacheKey != "" {
		return promptCacheKey
	}
	if r != nil {
		for _, h := range []string{"Session-Id", "Session_id"} {
			if v := r.Header.Get(h); v != "" {
				return v
			}
		}
	}
	if user != "" {
		return user
	}
	return safetyIdentifier
}
