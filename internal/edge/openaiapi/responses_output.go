package openaiapi

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/iop-dev/iop/internal/edge/frontend"
	"github.com/iop-dev/iop/quicwire/wirepb"
)

// A run's answer as a Responses API response. Its output items follow the
// run's events: reasoning deltas make a reasoning item (the model's own
// reasoning, as reasoning_text content; summary is empty, since nothing
// summarizes it, and there is never encrypted_content, whatever include
// asks), text deltas a message item, and each tool call (by the run's
// index) an item of the kind the client declared the tool as (tools.go): a
// function_call (with its namespace, and its inner name, for a namespace's
// member), a custom_tool_call, or a client-run built-in's call item
// (local_shell_call, shell_call, apply_patch_call). A change of kind
// closes the open message or reasoning item, so a turn that reasons,
// answers and calls lists [reasoning, message, function_call...], as
// OpenAI does; calls close at the end of the run, since the fragments of
// parallel calls may interleave.
//
// Streamed, every event is `event: <type>` and `data: <json>` with a
// sequence_number from 0:
//
//	response.created, response.in_progress           before the first item
//	response.output_item.added                       an item opens
//	response.content_part.added                      its part (message, reasoning)
//	response.output_text.delta ...                   text
//	response.reasoning_text.delta ...                reasoning
//	response.function_call_arguments.delta ...       arguments
//	response.output_text.done / reasoning_text.done /
//	response.function_call_arguments.done            the item's whole text
//	response.custom_tool_call_input.delta, .done     a custom call's input,
//	                                                 whole, as the call closes
//	                                                 (a built-in's call has no
//	                                                 events but its item's)
//	response.content_part.done                       (message, reasoning)
//	response.output_item.done                        the item, complete
//	response.completed | response.incomplete         the response, with usage
//
// A run that ends in length (or content_filter) is incomplete, with
// incomplete_details.reason max_output_tokens (content_filter). A failure
// after the response started is an `error` event (code, message and param
// at the top, as OpenAI documents it, and the same in an "error" object,
// as OpenAI sends it, so that the SDKs raise it as the stream's error)
// followed by response.failed, whose response carries the error: never a
// silent end. There is no [DONE]: OpenAI sends none on this API.

// Kinds of output items.
const (
	kindMessage      = "message"
	kindReasoning    = "reasoning"
	kindFunctionCall = "function_call"
	kindCustomCall   = "custom_tool_call"
	kindBuiltinCall  = "builtin_call" // a client-run built-in's call, of its own type
)

// outItem is an output item being built.
type outItem struct {
	kind   string
	id     string
	index  int             // output_index
	text   strings.Builder // the message's text, the reasoning, or the call's arguments
	callID string
	name   string
	// tool is how the client declared the tool a call calls (nil: a
	// function of that name): the call answers in its terms.
	tool   *declaredTool
	status string // in_progress, then completed or incomplete
}

// wire is the item as the response lists it; whole false gives it as
// response.output_item.added does, before its text.
func (it *outItem) wire(whole bool) any {
	text := ""
	if whole {
		text = it.text.String()
	}
	switch it.kind {
	case kindMessage:
		m := messageItem{Type: "message", ID: it.id, Status: it.status, Role: "assistant", Content: []respOutputText{}}
		if whole {
			m.Content = append(m.Content, newRespOutputText(text))
		}
		return m
	case kindReasoning:
		r := reasoningItem{Type: "reasoning", ID: it.id, Status: it.status, Summary: []struct{}{}, Content: []reasoningPart{}}
		if whole {
			r.Content = append(r.Content, reasoningPart{Type: "reasoning_text", Text: text})
		}
		return r
	case kindCustomCall:
		input := ""
		if whole {
			input = customInput([]byte(text))
		}
		return customToolCallItem{Type: "custom_tool_call", ID: it.id, CallID: it.callID, Name: it.tool.name,
			Namespace: it.tool.namespace, Input: input}
	case kindBuiltinCall:
		return it.tool.builtin.item(it.id, it.callID, it.status, []byte(text))
	}
	f := functionCallItem{Type: "function_call", ID: it.id, Status: it.status, CallID: it.callID, Name: it.name, Arguments: text}
	if it.tool != nil && it.tool.kind == toolFunction {
		f.Name, f.Namespace = it.tool.name, it.tool.namespace
	}
	return f
}

func newRespOutputText(s string) respOutputText {
	return respOutputText{Type: "output_text", Text: s, Annotations: []struct{}{}, Logprobs: []struct{}{}}
}

// respOutput writes a run's answer as a Responses API response: streamed
// as the events come, or whole at the end.
type respOutput struct {
	resp   *frontend.Response
	stream bool
	obj    responseObject
	seq    int64
	headed bool // response.created and response.in_progress went out
	runID  string
	buf    []byte

	items []*outItem
	open  *outItem           // the open message or reasoning item
	calls map[int32]*outItem // the function calls, by the run's tool call index
	tools *toolset           // how the client declared the tools the calls call
	usage *wirepb.Usage      // the run's last usage event
}

func newRespOutput(x *frontend.Exchange, resp *frontend.Response, req *parsedResponses) *respOutput {
	o := &respOutput{resp: resp, stream: req.stream, calls: map[int32]*outItem{}, tools: req.tools}
	o.obj = responseObject{Object: "response", CreatedAt: x.Arrived().Unix(), Status: "in_progress", Model: req.model,
		Output: []any{}, Truncation: "disabled", responseEcho: req.echo}
	if req.user != "" {
		o.obj.User = &req.user
	}
	if req.stream {
		resp.Stream("text/event-stream", nil)
	}
	return o
}

// Started names the response and its items after the run.
func (o *respOutput) Started(runID string) {
	o.runID = runID
	o.obj.ID = "resp_" + runID
}

// head sends response.created and response.in_progress before the first
// event of the response; a response that never got a run gets an id of
// its own.
func (o *respOutput) head() bool {
	if o.headed {
		return true
	}
	o.headed = true
	if o.obj.ID == "" {
		o.obj.ID = "resp_" + strings.ToLower(rand.Text())
	}
	r := o.obj
	return o.emit(&respEvent{Type: "response.created", Response: &r}) &&
		o.emit(&respEvent{Type: "response.in_progress", Response: &r})
}

// Text relays a text delta. Like the other event methods it reports false
// when the client could not be written to.
func (o *respOutput) Text(s string) bool { return o.delta(kindMessage, s) }

// Reasoning relays a reasoning delta.
func (o *respOutput) Reasoning(s string) bool { return o.delta(kindReasoning, s) }

// Usage notes the run's usage, for the end.
func (o *respOutput) Usage(u *wirepb.Usage) { o.usage = u }

// Complete ends the response (complete).
func (o *respOutput) Complete(doneReason string) bool { return o.complete(doneReason, o.usage) }

var _ frontend.RunWriter = (*respOutput)(nil)

// delta appends s to the open item of kind (a message or reasoning).
func (o *respOutput) delta(kind, s string) bool {
	if s == "" {
		return true
	}
	it, ok := o.current(kind)
	if !ok {
		return false
	}
	it.text.WriteString(s)
	ev := &respEvent{Type: "response.reasoning_text.delta", ItemID: it.id, OutputIndex: &it.index, ContentIndex: new(int), Delta: &s}
	if kind == kindMessage {
		ev.Type, ev.Logprobs = "response.output_text.delta", noLogprobs
	}
	return o.emit(ev)
}

// ToolCall relays a tool call or a fragment of one, by its index. A call
// answers as the client declared its tool (outItem.tool): a function's
// arguments stream as they come; a custom tool's input and a built-in's
// action are whole only with the call's last fragment (the model writes
// them as JSON arguments), so they go out when it closes, at the end.
func (o *respOutput) ToolCall(tc *wirepb.ToolCall) bool {
	if tc == nil {
		return true
	}
	it := o.calls[tc.GetIndex()]
	if it == nil {
		if o.open != nil && !o.close(o.open, "completed") {
			return false
		}
		it = o.add(kindFunctionCall)
		it.callID = tc.GetId()
		if it.callID == "" {
			it.callID = fmt.Sprintf("call_%s_%d", o.runID, tc.GetIndex())
		}
		o.name(it, tc.GetName())
		o.calls[tc.GetIndex()] = it
		if !o.opened(it) {
			return false
		}
	}
	if it.name == "" {
		// A name after the call opened: its item went out as a
		// function's, and stays one.
		it.name = tc.GetName()
	}
	args := string(tc.GetArgumentsJson())
	if args == "" {
		return true
	}
	it.text.WriteString(args)
	if it.kind != kindFunctionCall {
		o.resp.Progress()
		return true
	}
	return o.emit(&respEvent{Type: "response.function_call_arguments.delta", ItemID: it.id, OutputIndex: &it.index, Delta: &args})
}

// name names a new call item by the function the model called: the kind
// of item follows how the client declared it.
func (o *respOutput) name(it *outItem, name string) {
	it.name = name
	d := o.tools.declared(name)
	if d == nil {
		return
	}
	it.tool = d
	switch d.kind {
	case toolCustom:
		it.kind, it.id = kindCustomCall, "ctc"+strings.TrimPrefix(it.id, "fc")
	case toolBuiltin:
		it.kind, it.id = kindBuiltinCall, "tc"+strings.TrimPrefix(it.id, "fc")
	}
}

// current returns the open item of kind, closing the open item of the
// other kind and opening one of this kind if need be; false if a write
// failed.
func (o *respOutput) current(kind string) (*outItem, bool) {
	if o.open != nil && o.open.kind == kind {
		return o.open, true
	}
	if o.open != nil && !o.close(o.open, "completed") {
		return nil, false
	}
	o.open = o.add(kind)
	return o.open, o.opened(o.open)
}

// add appends a new item of kind to the output.
func (o *respOutput) add(kind string) *outItem {
	prefix := map[string]string{kindMessage: "msg", kindReasoning: "rs", kindFunctionCall: "fc"}[kind]
	it := &outItem{kind: kind, index: len(o.items), status: "in_progress"}
	it.id = fmt.Sprintf("%s_%s_%d", prefix, o.runID, it.index)
	o.items = append(o.items, it)
	return it
}

// opened announces a new item (and its content part).
func (o *respOutput) opened(it *outItem) bool {
	if !o.emit(&respEvent{Type: "response.output_item.added", OutputIndex: &it.index, Item: it.wire(false)}) {
		return false
	}
	if part := it.part(false); part != nil {
		return o.emit(&respEvent{Type: "response.content_part.added", ItemID: it.id, OutputIndex: &it.index,
			ContentIndex: new(int), Part: part})
	}
	return true
}

// part is the content part of a message or reasoning item (nil for a
// function call); whole false gives it empty, as it is added.
func (it *outItem) part(whole bool) any {
	text := ""
	if whole {
		text = it.text.String()
	}
	switch it.kind {
	case kindMessage:
		return newRespOutputText(text)
	case kindReasoning:
		return reasoningPart{Type: "reasoning_text", Text: text}
	}
	return nil
}

// close ends an item with status: its whole text, its part, the item.
func (o *respOutput) close(it *outItem, status string) bool {
	if o.open == it {
		o.open = nil
	}
	it.status = status
	text := it.text.String()
	var done *respEvent
	switch it.kind {
	case kindMessage:
		done = &respEvent{Type: "response.output_text.done", ItemID: it.id, OutputIndex: &it.index, ContentIndex: new(int),
			Text: &text, Logprobs: noLogprobs}
	case kindReasoning:
		done = &respEvent{Type: "response.reasoning_text.done", ItemID: it.id, OutputIndex: &it.index, ContentIndex: new(int),
			Text: &text}
	case kindCustomCall:
		// The input, whole, as one delta and its done.
		input := customInput([]byte(text))
		if !o.emit(&respEvent{Type: "response.custom_tool_call_input.delta", ItemID: it.id, OutputIndex: &it.index, Delta: &input}) {
			return false
		}
		done = &respEvent{Type: "response.custom_tool_call_input.done", ItemID: it.id, OutputIndex: &it.index, Input: &input}
	case kindBuiltinCall: // no event of its own: the item says it all
	default:
		name := it.name
		if it.tool != nil {
			name = it.tool.name
		}
		done = &respEvent{Type: "response.function_call_arguments.done", ItemID: it.id, OutputIndex: &it.index,
			Name: name, Arguments: &text}
	}
	if done != nil && !o.emit(done) {
		return false
	}
	if part := it.part(true); part != nil {
		if !o.emit(&respEvent{Type: "response.content_part.done", ItemID: it.id, OutputIndex: &it.index,
			ContentIndex: new(int), Part: part}) {
			return false
		}
	}
	return o.emit(&respEvent{Type: "response.output_item.done", OutputIndex: &it.index, Item: it.wire(true)})
}

// complete ends the response: completed, or incomplete when the run
// stopped at its length limit or a content filter. A run that said
// nothing answers with an empty message, so that output is never empty.
func (o *respOutput) complete(doneReason string, u *wirepb.Usage) bool {
	status := "completed"
	switch doneReason {
	case "length":
		status, o.obj.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	case "content_filter":
		status, o.obj.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "content_filter"}
	}
	if len(o.items) == 0 {
		if _, ok := o.current(kindMessage); !ok {
			return false
		}
	}
	for _, it := range o.unfinished() {
		if !o.close(it, status) {
			return false
		}
	}
	o.obj.Status, o.obj.Usage, o.obj.Output = status, respUsageOf(u), o.wireItems()
	if status == "completed" {
		now := time.Now().Unix()
		o.obj.CompletedAt = &now
	}
	if !o.stream {
		return shape.WriteJSON(o.resp, http.StatusOK, &o.obj)
	}
	r := o.obj
	return o.emit(&respEvent{Type: "response." + status, Response: &r}, true)
}

// Fail ends a response that has started with an error event and
// response.failed, whose response carries the error and the output so far.
func (o *respOutput) Fail(f *frontend.Failure) {
	u := o.usage
	if !o.head() {
		return
	}
	for _, it := range o.unfinished() {
		it.status = "incomplete"
	}
	b := errorOf(f)
	code := ""
	if b.Error.Code != nil {
		code = *b.Error.Code
	}
	o.obj.Status, o.obj.Usage, o.obj.Output = "failed", respUsageOf(u), o.wireItems()
	o.obj.Error = &responseError{Code: code, Message: b.Error.Message}
	ev := &respErrorEvent{Type: "error", Code: code, Message: b.Error.Message, Param: b.Error.Param, Error: b.Error}
	r := o.obj
	if o.emit(ev) {
		o.emit(&respEvent{Type: "response.failed", Response: &r}, true)
	}
}

// unfinished are the items still open, in output order.
func (o *respOutput) unfinished() []*outItem {
	var open []*outItem
	for _, it := range o.items {
		if it.status == "in_progress" {
			open = append(open, it)
		}
	}
	return open
}

func (o *respOutput) wireItems() []any {
	out := make([]any, 0, len(o.items))
	for _, it := range o.items {
		out = append(out, it.wire(true))
	}
	return out
}

// respUsageOf is the run's usage in the Responses API's terms (zeros when the
// provider reported none).
func respUsageOf(u *wirepb.Usage) *responseUsage {
	r := &responseUsage{InputTokens: u.GetPromptTokens(), OutputTokens: u.GetCompletionTokens()}
	r.TotalTokens = r.InputTokens + r.OutputTokens
	return r
}

// emit sends one event, after the response's head; its sequence_number is
// the next; last says it ends the stream. A response sent whole sends
// nothing until complete: each event only tells the idle timer that the
// run made progress.
func (o *respOutput) emit(ev any, last ...bool) bool {
	if !o.stream {
		o.resp.Progress()
		return true
	}
	if !o.head() {
		return false
	}
	var typ string
	switch e := ev.(type) {
	case *respEvent:
		e.SequenceNumber, typ = o.seq, e.Type
	case *respErrorEvent:
		e.SequenceNumber, typ = o.seq, e.Type
	}
	o.seq++
	b, err := json.Marshal(ev)
	if err != nil { // only our own types: a bug
		panic(fmt.Sprintf("openaiapi: marshal %s event: %v", typ, err))
	}
	o.buf = append(append(append(append(append(o.buf[:0], "event: "...), typ...), "\ndata: "...), b...), "\n\n"...)
	if len(last) > 0 && last[0] {
		return o.resp.End(o.buf)
	}
	return o.resp.Event(o.buf)
}
