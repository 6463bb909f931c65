package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

// Issue 26, P1, R9: a restarted Edge remembers what it served. A Node
// serves a model; the Edge is killed (kill -9) and restarted, and a client
// asks for the model through each API from the moment the new Edge
// answers HTTP, before the Node is back. It is never told 404 (an SDK's
// not-found error, the ollama CLI's offer to pull the model): until the
// Node is back it is told 503 with Retry-After, then it is answered 200.
// With data_dir the Edge remembers the model in data_dir/served.json;
// without, it answers every model nobody offers yet 503 for its start-up
// grace. A name nobody ever served is 404 again once the memory says so.
func TestRestartedEdgeSaysRetryNotNotFound(t *testing.T) {
	for _, withDataDir := range []bool{true, false} {
		name := "without data_dir"
		if withDataDir {
			name = "with data_dir"
		}
		t.Run(name, func(t *testing.T) {
			f := newFaultFleet(t)
			if withDataDir {
				data := filepath.Join(f.dir, "data")
				conf, err := os.ReadFile(f.edgeConf)
				if err != nil {
					t.Fatal(err)
				}
				writeFile(t, f.edgeConf, string(conf)+fmt.Sprintf("data_dir: %q\n", data))
				signalProc(t, f.edge, syscall.SIGKILL)
				<-f.edge.done
				f.startEdge("edged (with data_dir)")
			}
			f.addNode(nodeSpec{
				id:        "n1",
				models:    []fakeollama.Model{fastAnswer("n1")},
				providers: []providerSpec{{name: "ollama", capacity: 4, targets: []string{fastModel + ":latest"}}},
				hostOnly:  true,
			})
			for _, a := range restartAPIs {
				if code, _, body := a.ask(t, f.base, fastModel); code != http.StatusOK {
					t.Fatalf("%s before the restart: %d %s", a.name, code, body)
				}
			}
			if withDataDir {
				waitFor(t, "the Edge to remember the model in data_dir", func() bool {
					b, _ := os.ReadFile(filepath.Join(f.dir, "data", "served.json"))
					return strings.Contains(string(b), fastModel+":latest")
				})
			}
			v, _ := f.view("n1")

			signalProc(t, f.edge, syscall.SIGKILL)
			<-f.edge.done
			restarted := time.Now()
			f.startEdge("edged (restarted)")

			if withDataDir {
				var q struct {
					NotYetBack struct {
						Models []struct {
							Model string   `json:"model"`
							Nodes []string `json:"nodes"`
						} `json:"models"`
					} `json:"not_yet_back"`
				}
				b := adminQueues(t, f.base)
				err := json.Unmarshal([]byte(b), &q)
				shown := err == nil && len(q.NotYetBack.Models) == 1 && q.NotYetBack.Models[0].Model == fastModel+":latest" &&
					len(q.NotYetBack.Models[0].Nodes) == 1 && q.NotYetBack.Models[0].Nodes[0] == "n1"
				switch now, _ := f.view("n1"); {
				case shown:
				case now.Generation > v.Generation:
					t.Logf("the Node was back before /admin/v1/queues was read: %s", b)
				default:
					t.Errorf("/admin/v1/queues does not show the model not yet back: %s", b)
				}
			}

			// Hammer the model through every API until each has been
			// answered 200 twice in a row.
			var retries, oks int
			seen200 := map[string]int{}
			deadline := time.Now().Add(90 * time.Second)
			for i := 0; ; i++ {
				if time.Now().After(deadline) {
					t.Fatalf("not answered 200 within 90 s of the restart (200s %v, 503s %d)", seen200, retries)
				}
				a := restartAPIs[i%len(restartAPIs)]
				code, retryAfter, body := a.ask(t, f.base, fastModel)
				switch code {
				case http.StatusOK:
					oks++
					seen200[a.name]++
				case http.StatusServiceUnavailable:
					seen200[a.name] = 0
					retries++
					if retryAfter == "" {
						t.Errorf("%s %.1fs after the restart: 503 without Retry-After: %s", a.name, time.Since(restarted).Seconds(), body)
					}
					if !strings.Contains(body, "reconnecting") {
						t.Errorf("%s %.1fs after the restart: 503 that does not say the Nodes are reconnecting: %s", a.name, time.Since(restarted).Seconds(), body)
					}
				default:
					t.Fatalf("%s %.1fs after the restart: %d, want 503 with Retry-After or 200: %s", a.name, time.Since(restarted).Seconds(), code, body)
				}
				done := true
				for _, a := range restartAPIs {
					done = done && seen200[a.name] >= 2
				}
				if done {
					break
				}
				if code != http.StatusOK {
					time.Sleep(20 * time.Millisecond) // a client's retry, faster than Retry-After to probe the edge
				}
			}
			back := f.waitBack("n1", v.Generation, restarted, "edged restart", 30*time.Second)
			f.timing("kill -9 edged (%s): %d requests answered 503 retry, then 200 (Node back at generation %d)", name, retries, back.Generation)

			// A name nobody ever served: 404 once the Edge knows (with
			// data_dir at once; without, after its start-up grace, which
			// this test does not wait for).
			if withDataDir {
				for _, a := range restartAPIs {
					if code, _, body := a.ask(t, f.base, "never-served"); code != http.StatusNotFound {
						t.Errorf("%s: a model nobody ever served: %d, want 404: %s", a.name, code, body)
					}
				}
			}
		})
	}
}

// restartAPI is one client API asked for a model, non-streaming.
type restartAPI struct {
	name, path, body string
	header           map[string]string
}

var restartAPIs = []restartAPI{
	{name: "openai", path: "/v1/chat/completions", body: `{"model":%q,"messages":[{"role":"user","content":"hi"}]}`},
	{name: "anthropic", path: "/v1/messages", body: `{"model":%q,"max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`,
		header: map[string]string{"anthropic-version": "2023-06-01"}},
	{name: "ollama", path: "/api/chat", body: `{"model":%q,"stream":false,"messages":[{"role":"user","content":"hi"}]}`},
}

// ask sends one request for model and returns its status, Retry-After and
// body (0 and the error when it could not be sent).
func (a restartAPI) ask(t *testing.T, base, model string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+a.path, strings.NewReader(fmt.Sprintf(a.body, model)))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range a.header {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: requestWithin}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), strings.TrimSpace(string(b))
}

// adminQueues is the body of /admin/v1/queues.
func adminQueues(t *testing.T, base string) string {
	t.Helper()
	resp, err := adminClient.Get(base + "/admin/v1/queues")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}
