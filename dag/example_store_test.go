package dag_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/comfypool/comfypool/dag"
)

// A FileStore keeps checkpoints on disk: a store opened again on the same
// directory, after a restart say, loads what the first one saved.
func ExampleNewFileStore() {
	dir, err := os.MkdirTemp("", "dag-store-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	store, err := dag.NewFileStore(dir)
	if err != nil {
		log.Fatal(err)
	}
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	err = store.CreateExecution(ctx, &dag.ExecutionRecord{
		ID:      "Run/1",
		Status:  dag.StatusRunning,
		Graph:   json.RawMessage(`{"nodes":[],"edges":[]}`),
		Created: now,
		Updated: now,
	})
	if err != nil {
		log.Fatal(err)
	}
	err = store.SaveNode(ctx, "Run/1", &dag.NodeRecord{Node: "upscale", State: dag.NodeCompleted, Backend: "gpu-1", Runs: 1})
	if err != nil {
		log.Fatal(err)
	}

	// The files, with IDs percent-encoded into portable names; node
	// records go in numbered batches.
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if rel, _ := filepath.Rel(dir, path); !d.IsDir() {
			fmt.Println(filepath.ToSlash(rel))
		}
		return nil
	})

	reopened, err := dag.NewFileStore(dir)
	if err != nil {
		log.Fatal(err)
	}
	cp, err := reopened.Load(ctx, "Run/1")
	if err != nil {
		log.Fatal(err)
	}
	n := cp.Nodes["upscale"]
	fmt.Println(cp.Execution.ID, cp.Execution.Status, n.Node, n.State, n.Backend)
	// Output:
	// executions/_%52un%2f1/execution.json
	// executions/_%52un%2f1/nodes/batch-0000000000000001-0000000000000001.json
	// Run/1 running upscale completed gpu-1
}
