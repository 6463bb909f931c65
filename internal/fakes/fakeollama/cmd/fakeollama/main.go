// Command fakeollama runs the fake Ollama server as its own process, for
// integration tests and benchmarks:
//
//	fakeollama -addr 127.0.0.1:0 -model llama3.2 -models models.json
//
// It prints "listening on URL" once it accepts connections, serves until
// SIGINT or SIGTERM, and is steered through the control API under /_fake/.
package main

import (
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
	flag.Parse()

	var models []fakeollama.Model
	for n := range strings.SplitSeq(*names, ",") {
		if n = strings.TrimSpace(n); n != "" {
			models = append(models, fakeollama.Model{Name: n})
		}
	}
	if *file != "" {
		b, err := os.ReadFile(*file)
		if err != nil {
			return err
		}
		var more []fakeollama.Model
		if err := json.Unmarshal(b, &more); err != nil {
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
	fmt.Println("listening on", s.URL())
	<-ctx.Done()
	s.Close()
	return nil
}
