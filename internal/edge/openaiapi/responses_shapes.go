package openaiapi

import "encoding/json"

// Wire shapes of a response, as OpenAI sends them.
type (
	responseObject struct {
		ID                 string             `json:"id"`
		Object             string             `json:"object"`
		CreatedAt          int64              `json:"created_at"`
		Status             string             `json:"status"`
		Background         bool               `json:"background"`
		CompletedAt        *int64             `json:"completed_at"`
		Error              *responseError     `json:"error"`
		IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
		Model              string             `json:"model"`
		Output             []any              `json:"output"`
		PreviousResponseID *string            `json:"previous_response_id"`
		Store              bool               `json:"store"`
		Truncation         string             `json:"truncation"`
		Usage              *responseUsage     `json:"usage"`
		User               *string            `json:"user"`
		responseEcho
	}
	// responseEcho is what a response repeats of its request.
	responseEcho struct {
		Instructions      *string           `json:"instructions"`
		MaxOutputTokens   *int64            `json:"max_output_tokens"`
		Metadata          map[string]string `json:"metadata"`
		ParallelToolCalls bool              `json:"parallel_tool_calls"`
		Reasoning         reasoningEcho     `json:"reasoning"`
		Temperature       *float64          `json:"temperature"`
		Text              textEcho          `json:"text"`
		ToolChoice        any               `json:"tool_choice"`
		Tools             []any             `json:"tools"`
		TopP              *float64          `json:"top_p"`
	}
	reasoningEcho struct {
		Effort  *string `json:"effort"`
		Summary *string `json:"summary"`
	}
	textEcho struct {
		Format respTextFormat `json:"format"`
	}
	toolEcho struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description *string         `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
		Strict      bool            `json:"strict"`
	}
	responseError struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	incompleteDetails struct {
		Reason string `json:"reason"`
	}
	responseUsage struct {
		InputTokens        int64 `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens int64 `json:"cached_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens        int64 `json:"output_tokens"`
		OutputTokensDetails struct {
			ReasoningTokens int64 `json:"reasoning_tokens"`
		} `json:"output_tokens_details"`
		TotalTokens int64 `json:"total_tokens"`
	}

	messageItem struct {
		Type    string           `json:"type"`
		ID      string           `json:"id"`
		Status  string           `json:"status"`
		Role    string           `json:"role"`
		Content []respOutputText `json:"content"`
	}
	respOutputText struct {
		Type        string     `json:"type"`
		Text        string     `json:"text"`
		Annotations []struct{} `json:"annotations"`
		Logprobs    []struct{} `json:"logprobs"`
	}
	reasoningItem struct {
		Type    string          `json:"type"`
		ID      string          `json:"id"`
		Status  string          `json:"status"`
		Summary []struct{}      `json:"summary"`
		Content []reasoningPart `json:"content"`
	}
	reasoningPart struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	functionCallItem struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		Status    string `json:"status"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
		Arguments string `json:"arguments"`
	}
	// customToolCallItem is a call of a custom tool: OpenAI's has no
	// status.
	customToolCallItem struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
		Input     string `json:"input"`
	}

	// respEvent is every streamed event but error: each type uses some
	// of the fields.
	respEvent struct {
		Type           string          `json:"type"`
		SequenceNumber int64           `json:"sequence_number"`
		Response       *responseObject `json:"response,omitempty"`
		OutputIndex    *int            `json:"output_index,omitempty"`
		ItemID         string          `json:"item_id,omitempty"`
		ContentIndex   *int            `json:"content_index,omitempty"`
		Item           any             `json:"item,omitempty"`
		Part           any             `json:"part,omitempty"`
		Delta          *string         `json:"delta,omitempty"`
		Text           *string         `json:"text,omitempty"`
		Name           string          `json:"name,omitempty"`
		Arguments      *string         `json:"arguments,omitempty"`
		Input          *string         `json:"input,omitempty"`
		Logprobs       json.RawMessage `json:"logprobs,omitempty"` // noLogprobs on text events
	}
	// respErrorEvent is the in-stream error.
	respErrorEvent struct {
		Type           string  `json:"type"`
		SequenceNumber int64   `json:"sequence_number"`
		Code           string  `json:"code"`
		Message        string  `json:"message"`
		Param          *string `json:"param"`
		Error          any     `json:"error"`
	}
)

// noLogprobs is the logprobs of a text event: none, as an empty list.
var noLogprobs = json.RawMessage("[]")

// echo is what the response repeats of req.
func (req *responsesRequest) echo() responseEcho {
	e := responseEcho{
		Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens, Metadata: req.Metadata,
		ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls,
		Temperature:       req.Temperature, TopP: req.TopP, ToolChoice: "auto",
		Text: textEcho{Format: respTextFormat{Type: "text"}}, Tools: echoTools(req.Tools),
	}
	if e.Metadata == nil {
		e.Metadata = map[string]string{}
	}
	if r := req.Reasoning; r != nil {
		e.Reasoning = reasoningEcho{Effort: r.Effort, Summary: r.Summary}
	}
	if t := req.Text; t != nil && t.Format != nil && t.Format.Type != "" {
		e.Text.Format = *t.Format
	}
	if given(req.ToolChoice) {
		// As the client wrote it (it was checked): a function's choice
		// names it as the client does, not by the name the model sees.
		e.ToolChoice = req.ToolChoice
	}
	return e
}
