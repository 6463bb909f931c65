package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
	"github.com/iop-dev/iop/internal/fakes/fakeopenai"
)

// Coding agents end to end (issue 21, SPEC P7, P2): Claude Code in print mode
// and the Codex CLI's exec, installed from npm at pinned versions
// (.ci/agents.sh) and unchanged, each hold a session of several turns with
// tool calls against real edged and noded processes, through the ollama
// adapter (the fake Ollama) and through the openai adapter (the fake
// OpenAI-compatible server). The fakes' model answers as a coding agent's
// model does (fakemodel.Agent): a turn that asks gets a call to the
// agent's shell tool, the turn that carries the tool's result gets a
// quote of it. The agents reach nothing but the Edge: their proxy settings
// point at a trap that refuses and remembers anything else.

// agentModel is the model the agents are told to use; no agent knows it,
// as no agent knows a self-hosted model.
const agentModel = "qwen3-coder"

// agentCommand is the command the fake model has the agent run. What it
// prints, agentProof, is not in its text: a reply that quotes agentProof
// quotes the output of a real execution. It also leaves a line in a file
// of the agent's working directory, once per tool call.
const (
	agentCommand = "echo iop-agent-$(echo ok) | tee -a agent-ran.txt"
	agentProof   = "iop-agent-ok"
	agentRanFile = "agent-ran.txt"
	// agentQuote starts the fake model's reply to a tool's result
	// (fakemodel.DefaultAgentReply).
	agentQuote = "The command printed: "
)

// The prompts of a session's two runs: the second resumes the first's
// session, so its turns carry the whole history, the first run's tool
// call and result included.
var agentPrompts = []string{
	"Run the shell command this task needs and tell me what it printed.",
	"Run it once more and tell me what it printed this time.",
}

// agentStack is a real edged and noded with one provider in front of a
// fake model server whose model answers as a coding agent's model.
type agentStack struct {
	base string
	// chats are the bodies of the chat requests the model server got, in
	// the order they arrived.
	chats func() [][]byte
}

// agentAdapter starts an agentStack through one of the Node's adapters.
type agentAdapter struct {
	name  string
	start func(t *testing.T) agentStack
}

var agentAdapters = []agentAdapter{
	{"ollama adapter", func(t *testing.T) agentStack {
		fake := fakeollama.New(fakeollama.Model{Name: agentModel + ":latest", Agent: &fakeollama.Agent{Command: agentCommand}})
		t.Cleanup(fake.Close)
		base := startAgentStack(t, fmt.Sprintf("{name: ollama, adapter: ollama, capacity: 4, config: {base_url: %q}}", fake.URL()))
		return agentStack{base: base, chats: func() (bodies [][]byte) {
			for _, r := range fake.Requests() {
				if r.Path == "/api/chat" {
					bodies = append(bodies, r.Body)
				}
			}
			return bodies
		}}
	}},
	{"openai adapter", func(t *testing.T) agentStack {
		fake := fakeopenai.Start(fakeopenai.Config{Models: []fakeopenai.Model{{Name: agentModel, Agent: &fakeopenai.Agent{Command: agentCommand}}}})
		t.Cleanup(fake.Close)
		base := startAgentStack(t, fmt.Sprintf("{name: vllm, adapter: openai, capacity: 4, targets: [%s], config: {base_url: %q}}", agentModel, fake.BaseURL()))
		return agentStack{base: base, chats: func() (bodies [][]byte) {
			for _, r := range fake.Requests() {
				if r.Path == "/v1/chat/completions" {
					bodies = append(bodies, r.Body)
				}
			}
			return bodies
		}}
	}},
}

// startAgentStack starts edged and noded, the Node with provider (one
// YAML flow mapping), and returns the Edge's base URL once the provider
// is online.
func startAgentStack(t *testing.T, provider string) string {
	t.Helper()
	dir := t.TempDir()
	quicPort, httpPort := freePort(t, "udp"), freePort(t, "tcp")
	edgeConf, nodeConf := filepath.Join(dir, "edge.yaml"), filepath.Join(dir, "node.yaml")
	writeFile(t, edgeConf, fmt.Sprintf(`
edge_id: edge-1
listen: {quic: "127.0.0.1:%d", http: "127.0.0.1:%d"}
identity: {mode: loopback}
api: {allow_anonymous: true}
profiles:
  - {name: default, deadline: 2m, queue_timeout: 30s, max_queue_depth: 16, idle_timeout: 60s}
`, quicPort, httpPort))
	writeFile(t, nodeConf, fmt.Sprintf(`
node_id: n1
edge: {address: "127.0.0.1:%d"}
identity: {mode: loopback}
reconnect: {initial_backoff: 50ms, max_backoff: 500ms}
providers:
  - %s
`, quicPort, provider))
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	start(t, "edged", bin.edged, "run", "--config", edgeConf)
	start(t, "noded", bin.noded, "run", "--config", nodeConf)
	waitNode(t, base, "n1", "ready with its provider online", func(n nodeView) bool {
		return n.State == "ready" && len(n.Providers) == 1 && n.Providers[0].State == "online"
	})
	return base
}

// codingAgent is one agent as the test drives it.
type codingAgent struct {
	name    string
	command string // the npm package's command
	// route is the Edge's route of the agent's turns, and path the URL path
	// it posts them to.
	route, path string
	// prepare writes the agent's configuration for an Edge at base into h
	// and returns its environment variables.
	prepare func(t *testing.T, h *agentHome, base string) []string
	// turn runs the agent once on prompt (resuming the session after the
	// first run) and returns its final answer.
	turn func(t *testing.T, s *agentSession, prompt string) string
}

// agentSession is an agent's session across its runs.
type agentSession struct {
	h    *agentHome
	bin  string
	env  []string
	id   string // the session's id, once the agent named it
	runs int
}

var codingAgents = []codingAgent{claudeCode, codex}

// claudeCode is Claude Code in print mode (claude -p), with the Edge as its
// Anthropic API. Only its Bash tool is allowed without asking (there is
// nobody to ask), and --dangerously-skip-permissions is not needed (it is
// refused to root, as CI may be).
var claudeCode = codingAgent{
	name: "claude code", command: "claude", route: "anthropic_messages", path: "/v1/messages",
	prepare: func(t *testing.T, h *agentHome, base string) []string {
		return []string{
			"ANTHROPIC_BASE_URL=" + base,
			"ANTHROPIC_AUTH_TOKEN=iop-test-key",
			"ANTHROPIC_MODEL=" + agentModel,
			// Every model it may pick for a side task (titles, subagents).
			"ANTHROPIC_SMALL_FAST_MODEL=" + agentModel,
			"ANTHROPIC_DEFAULT_HAIKU_MODEL=" + agentModel,
			"ANTHROPIC_DEFAULT_SONNET_MODEL=" + agentModel,
			"ANTHROPIC_DEFAULT_OPUS_MODEL=" + agentModel,
			"CLAUDE_CONFIG_DIR=" + filepath.Join(h.home, ".claude"),
			// Nothing but the model's API: no telemetry, error reports,
			// updates or other calls home.
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
			"DISABLE_TELEMETRY=1",
			"DISABLE_ERROR_REPORTING=1",
			"DISABLE_AUTOUPDATER=1",
		}
	},
	turn: func(t *testing.T, s *agentSession, prompt string) string {
		args := []string{"-p", prompt, "--output-format", "json", "--allowedTools", "Bash"}
		if s.id != "" {
			args = append(args, "--resume", s.id)
		}
		r := s.h.run(t, s.env, s.bin, args...)
		// The result is the last line of stdout: one JSON object.
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var out struct {
			Type, Subtype, Result string
			IsError               bool   `json:"is_error"`
			SessionID             string `json:"session_id"`
			NumTurns              int    `json:"num_turns"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &out); err != nil {
			t.Fatalf("claude's output is not its JSON result: %v\n%s", err, r)
		}
		if out.Type != "result" || out.Subtype != "success" || out.IsError || out.NumTurns < 2 {
			t.Fatalf("claude's result is not a success of at least 2 turns: %+v\n%s", out, r)
		}
		if s.id != "" && out.SessionID != s.id {
			t.Errorf("claude --resume %s went on in session %s", s.id, out.SessionID)
		}
		s.id = out.SessionID
		return out.Result
	},
}

// codex is the Codex CLI's exec, with the Edge as a model provider of the
// Responses API. Its sandbox needs kernel features CI may not have, so
// commands run unsandboxed, in the test's working directory.
var codex = codingAgent{
	name: "codex", command: "codex", route: "openai_responses", path: "/v1/responses",
	prepare: func(t *testing.T, h *agentHome, base string) []string {
		codexHome := filepath.Join(h.home, ".codex")
		if err := os.MkdirAll(codexHome, 0o700); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(codexHome, "config.toml"), fmt.Sprintf(`
model = %q
model_provider = "iop"
check_for_update_on_startup = false

[model_providers.iop]
name = "iop"
base_url = "%s/v1"
env_key = "IOP_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
`, agentModel, base))
		return []string{"CODEX_HOME=" + codexHome, "IOP_KEY=iop-test-key"}
	},
	turn: func(t *testing.T, s *agentSession, prompt string) string {
		s.runs++
		last := filepath.Join(s.h.home, fmt.Sprintf("codex-last-%d.txt", s.runs))
		args := []string{"exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
			"--color", "never", "--output-last-message", last}
		if s.runs > 1 {
			args = append(args, "resume", "--last")
		}
		r := s.h.run(t, s.env, s.bin, append(args, prompt)...)
		answer, err := os.ReadFile(last)
		if err != nil {
			t.Fatalf("codex left no last message: %v\n%s", err, r)
		}
		return string(answer)
	},
}

// Issue 21: each agent, through each adapter, runs a session of two runs
// (the second resuming the first) of two turns each: a call to its shell
// tool, then an answer that quotes the tool's output. The agents exit 0
// and answer with the output of the command they ran; the model server
// got every turn, the later ones carrying the tool results (the session's
// history included); the Edge answered every request of the agents
// without a 4xx or 5xx and counts the runs as completed (P7: the agents
// are unchanged); every turn is one of one session, kept on the Node that
// ran its first (P9); and no agent reached for anything but the Edge.
func TestCodingAgentsHoldASessionThroughTheEdge(t *testing.T) {
	for _, agent := range codingAgents {
		for _, adapter := range agentAdapters {
			t.Run(agent.name+"/"+adapter.name, func(t *testing.T) {
				bin := agentBinary(t, agent.command)
				t.Parallel()
				runAgentSession(t, agent, adapter, bin)
			})
		}
	}
}

func runAgentSession(t *testing.T, agent codingAgent, adapter agentAdapter, bin string) {
	stack := adapter.start(t)
	door := newAgentDoor(t, stack.base)
	trap := newInternetTrap(t)
	t.Cleanup(func() {
		if t.Failed() {
			door.report(t)
		}
	})
	h := newAgentHome(t, trap)
	s := &agentSession{h: h, bin: bin, env: agent.prepare(t, h, door.url)}
	t.Logf("%s: %s", agent.name, agentVersion(t, h, bin))

	for i, prompt := range agentPrompts {
		answer := agent.turn(t, s, prompt)
		if !strings.Contains(answer, agentQuote) || !strings.Contains(answer, agentProof) {
			t.Errorf("run %d: the agent's answer does not quote the command's output %q: %q", i+1, agentProof, answer)
		}
	}
	if ran, _ := os.ReadFile(filepath.Join(h.work, agentRanFile)); strings.Count(string(ran), agentProof) != len(agentPrompts) {
		t.Errorf("%s holds %q: the agent did not run the command once per run", agentRanFile, ran)
	}

	// What the agent sent, and what the Edge answered it.
	reqs := door.requests(t)
	turns := 0
	for _, r := range reqs {
		switch {
		case r.Status >= 400:
			t.Errorf("the Edge answered the agent's %s: %s", r, r.Answer)
		case r.Status == 0:
			t.Errorf("the agent gave up on %s before the Edge answered", r)
		}
		if r.Method == "POST" && r.Path == agent.path && r.Status == 200 {
			turns++
			if turns == 1 {
				t.Logf("the first turn: %s", r.shape())
			}
		}
	}
	if turns < 2*len(agentPrompts) {
		t.Errorf("%d turns answered at %s, want at least %d: %v", turns, agent.path, 2*len(agentPrompts), reqs)
	}
	if hits := trap.hits(); len(hits) > 0 {
		t.Errorf("the agent reached past the Edge: %v", hits)
	}

	// What the model server got: every turn, the later ones carrying the
	// tool results; the last run's carries both runs' results.
	chats := stack.chats()
	if len(chats) < 2*len(agentPrompts) {
		t.Errorf("the model server got %d chat requests, want at least %d", len(chats), 2*len(agentPrompts))
	}
	most := 0
	for i, c := range chats {
		n := toolResultsWith(t, c, agentProof)
		if i == 0 && n > 0 {
			t.Errorf("the first chat request carries a tool result already: %s", clip(string(c), 2000))
		}
		most = max(most, n)
	}
	if most < len(agentPrompts) {
		t.Errorf("no chat request carried the results of all %d tool calls (at most %d): the session's history was lost", len(agentPrompts), most)
	}

	// The Edge counts every turn as completed, and nothing else; and every
	// turn as one of one session (the agents name theirs; a resumed run
	// goes on with it), which stuck to the one Node after its first turn.
	var metrics string
	var counted map[string]map[string]float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		metrics = scrapeText(t, stack.base+"/metrics")
		counted = requestsTotal(metrics)
		if counted[agent.route]["ok"] == float64(turns) || time.Now().After(deadline) {
			break
		}
	}
	for route, outcomes := range counted {
		for outcome, n := range outcomes {
			if (route == agent.route && outcome == "ok" && n != float64(turns)) || (outcome != "ok" && n > 0) {
				t.Errorf("iop_edge_requests_total{route=%q,outcome=%q} = %v; the agent's turns answered: %d", route, outcome, n, turns)
			}
		}
	}
	newSessions := metricValue(metrics, `iop_edge_session_turns_total{outcome="new"}`)
	stuck := metricValue(metrics, `iop_edge_session_turns_total{outcome="stuck"}`)
	if newSessions != 1 || stuck != float64(turns-1) {
		t.Errorf("session turns: want 1 new and %d stuck (one session, one Node):\n%s", turns-1, grepLines(metrics, "iop_edge_session_turns_total{"))
	}
}

// toolResultsWith counts the tool messages of a chat request (Ollama's or
// OpenAI's chat: role "tool") whose content holds text.
func toolResultsWith(t *testing.T, body []byte, text string) int {
	t.Helper()
	var chat struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &chat); err != nil {
		t.Fatalf("a chat request the model server got is not JSON: %v", err)
	}
	n := 0
	for _, m := range chat.Messages {
		if m.Role == "tool" && strings.Contains(string(m.Content), text) {
			n++
		}
	}
	return n
}
