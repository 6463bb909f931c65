package sdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// DecodeConfig decodes cfg into out strictly: an unknown key is an error
// that names it, so a typo in the Node's configuration is caught at
// Configure rather than silently ignored. An empty cfg leaves out as it is.
func DecodeConfig(cfg Config, out any) error {
	if len(bytes.TrimSpace(cfg)) == 0 || string(bytes.TrimSpace(cfg)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(cfg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			return Errorf(KindInvalidRequest, "config is not valid JSON: %v", err)
		}
		return Errorf(KindInvalidRequest, "config: %v", err)
	}
	if dec.More() {
		return Errorf(KindInvalidRequest, "config: trailing data after the object")
	}
	return nil
}

// MustConfig encodes v as a Config, for tests and examples.
func MustConfig(v any) Config {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("sdk.MustConfig: %v", err))
	}
	return Config(b)
}
