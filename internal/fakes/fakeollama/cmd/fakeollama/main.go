// Command fakeollama runs the fake Ollama server as its own process, for
// integration tests and benchmarks:
//
//	fakeollama -addr 127.0.0.1:0 -model llama3.2 -models models.json
//
// The models file holds a list of fakeollama.Model as JSON, every knob by
// its JSON name (durations in nanoseconds), e.g. a coding agent's model
// whose prefill costs 20µs for every prompt token not in the prompt cache:
//
//	[{"name": "qwen3-coder", "agent": {"command": "echo iop-agent-ok"},
//	  "thinking": "Let me run it.", "think_levels": true,
//	  "prefill_per_token": 20000}]
//
// -max-loaded and -load-time make it hold models as Ollama does (at most N
// loaded, each load taking that long; GET /_fake/loads counts them):
//
//	fakeollama -model m1,m2 -max-loaded 1 -load-time 2s
//
// It prints "listening on URL" once it accepts connections, serves until
// SIGINT or SIGTERM, and is steered through the control API under /_fake/.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/iop-dev/iop/internal/fakes/fakeollama"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fakeollama:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:11434", "address to listen on (port 0 picks one)")
	names := flag.String("model", "", "comma-separated names of default models to serve")
	file := flag.String("models", "", "JSON file holding a list of models (fakeollama.Model)")
	agent := flag.Bool("agent", false, "the -model models answer as a coding agent's model (default fakemodel.Agent)")
	cachePrompts := flag.Int("prompt-cache-prompts", 0, "prompts the prompt cache remembers (0: the default)")
	cacheTokens := flag.Int("prompt-cache-tokens", 0, "tokens the prompt cache holds in all (0: the default)")
	maxLoaded := flag.Int("max-loaded", 0, "models held loaded at once, as OLLAMA_MAX_LOADED_MODELS (0: no bound); see fakeollama.Loading")
	loadTime := flag.Duration("load-time", 0, "how long loading a model that is not loaded takes")
	flag.Parse()
	if *maxLoaded < 0 || *loadTime < 0 {
		return fmt.Errorf("-max-loaded and -load-time must not be negative")
	}

	var models []fakeollama.Model
	for n := range strings.SplitSeq(*names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			m := fakeollama.Model{Name: n}
			if *agent {
				m.Agent = &fakeollama.Agent{}
			}
			models = append(models, m)
		}
	}
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		var more []fakeollama.Model
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields() // a misspelt knob would silently do nothing
		if err := dec.Decode(&more); err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		models = append(models, more...)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	s, err := fakeollama.Listen(*addr, models...)
	if err != nil {
		return err
	}
	if *cachePrompts != 0 || *cacheTokens != 0 {
		s.SetPromptCache(*cachePrompts, *cacheTokens)
	}
	s.SetLoading(fakeollama.Loading{MaxLoaded: *maxLoaded, LoadTime: *loadTime})
	fmt.Println("listening on", s.URL())
	<-ctx.Done()
	s.Close()
	return nil
}
