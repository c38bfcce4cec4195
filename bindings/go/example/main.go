// Streams a story: go run ./example [model.gguf] [prompt]
package main

import (
	"fmt"
	"os"
	"path/filepath"

	llm "libllm/bindings/go"
)

func main() {
	path := filepath.Join(os.Getenv("LLM_MODELS_DIR"), "stories260K.gguf")
	prompt := "Once upon a time"
	if len(os.Args) > 1 {
		path = os.Args[1]
	}
	if len(os.Args) > 2 {
		prompt = os.Args[2]
	}

	model, err := llm.Load(path, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer model.Close()
	session, err := model.NewSession(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer session.Close()

	sampling := llm.DefaultSampling()
	sampling.Temperature, sampling.TopP, sampling.Seed = 0.8, 0.95, 42
	fmt.Print(prompt)
	err = session.Generate(prompt, 200, &sampling, func(p llm.Piece) bool {
		fmt.Print(p.Text)
		return true
	})
	fmt.Println()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
