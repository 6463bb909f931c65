// Package fakemodel is the model side shared by the fake model servers
// (fakeollama, fakeopenai): what a fake model answers and what it costs,
// independent of any server's wire shapes.
//
//   - Tokens and PromptCache: the fakes' one tokenizer (a token is a
//     whitespace-separated word) and a bounded cache of the prompts a server
//     served recently, whose longest common prefix with a new prompt is the
//     part of it the server need not prefill again.
//   - Generate: a JSON value that conforms to a JSON schema, for structured
//     outputs (Ollama's format, OpenAI's response_format) and tool-call
//     arguments.
//   - Agent: a model that answers as a coding agent's model does, with one
//     tool call for a user turn and a quote of the tool's result after it.
package fakemodel
