package ollamaapi

import (
	"encoding/json"
	"fmt"

	"github.com/iop-dev/iop/internal/edge/frontend"
)

// errorBody is Ollama's error shape.
type errorBody struct {
	Error string `json:"error"`
}

// errorOf renders a failure in Ollama's shape. A model that no Node
// offers, or that the principal may not use, is answered as Ollama answers
// for one it does not have (`ollama run` then offers to pull it), without
// saying whether the model exists for others.
func errorOf(f *frontend.Failure) errorBody {
	if f.Code == "model_not_found" && f.Model != "" {
		return errorBody{Error: fmt.Sprintf("model '%s' not found", f.Model)}
	}
	return errorBody{Error: f.Message}
}

// errorLine is f as one NDJSON line, the in-stream form of an error that
// the official client returns from Chat or Generate.
func errorLine(f *frontend.Failure) []byte {
	b, _ := json.Marshal(errorOf(f))
	return append(b, '\n')
}

// invalid is a 400 in this API's words.
func invalid(format string, args ...any) *frontend.Failure {
	return frontend.Invalid("", format, args...)
}
