package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/comfypool/comfypool/bench"
)

// peerPackage is the npm package of the peer: @saintno/comfyui-sdk, whose
// ComfyPool spreads jobs over ComfyUI servers.
const peerPackage = "@saintno/comfyui-sdk"

// peerScript drives the peer's pool (see its header comment).
//
//go:embed peer.mjs
var peerScript []byte

// nodePeer is the peer, installed into a temporary folder: a bench.Peer
// that runs peer.mjs with Node.js for each request.
type nodePeer struct {
	dir     string // holds node_modules and peer.mjs
	node    string // the node executable
	version string // the installed package's version
}

// installPeer installs peerPackage with npm into a new temporary folder
// (never into the project) and writes the driver script next to it. The
// caller removes the folder with close. It fails with the reason when node
// or npm is missing or the install fails (no network, say).
func installPeer(ctx context.Context) (_ *nodePeer, err error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("node not found in PATH")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return nil, errors.New("npm not found in PATH")
	}
	dir, err := os.MkdirTemp("", "comfypool-bench-peer-")
	if err != nil {
		return nil, err
	}
	p := &nodePeer{dir: dir, node: node}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "install", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error", peerPackage)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("npm install %s: %v: %s", peerPackage, err, lastLines(out.String(), 3))
	}
	manifest, err := os.ReadFile(filepath.Join(dir, "node_modules", filepath.FromSlash(peerPackage), "package.json"))
	if err != nil {
		return nil, fmt.Errorf("npm install %s: %w", peerPackage, err)
	}
	var pkg struct{ Version string }
	if err := json.Unmarshal(manifest, &pkg); err != nil {
		return nil, fmt.Errorf("%s's package.json: %w", peerPackage, err)
	}
	p.version = pkg.Version
	if err := os.WriteFile(filepath.Join(dir, "peer.mjs"), peerScript, 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

// close removes the peer's folder.
func (p *nodePeer) close() { _ = os.RemoveAll(p.dir) }

// Name implements bench.Peer.
func (p *nodePeer) Name() string {
	return fmt.Sprintf("%s %s ComfyPool (PICK_ZERO, a CallWrapper per job)", peerPackage, p.version)
}

// peerInput is what peer.mjs reads on stdin.
type peerInput struct {
	URLs      []string `json:"urls"`
	Workflow  any      `json:"workflow"`
	VaryNode  string   `json:"vary_node"`
	VaryInput string   `json:"vary_input"`
	Output    string   `json:"output"`
	Jobs      int      `json:"jobs"`
	TimeoutMS int64    `json:"timeout_ms"`
}

// peerOutput is what peer.mjs writes on stdout.
type peerOutput struct {
	ElapsedMS float64  `json:"elapsed_ms"`
	Completed int      `json:"completed"`
	Failed    int      `json:"failed"`
	Errors    []string `json:"errors"`
	CPUMS     float64  `json:"cpu_ms"`
}

// peerJobTimeout bounds the peer's wait for its jobs: a run of the bench's
// sizes takes seconds; this only ends a run whose jobs never end.
const peerJobTimeout = 5 * time.Minute

// Run implements bench.Peer: it runs peer.mjs on req.
func (p *nodePeer) Run(ctx context.Context, req *bench.PeerRequest) (*bench.PeerReport, error) {
	in, err := json.Marshal(peerInput{
		URLs: req.URLs, Workflow: req.Workflow, VaryNode: req.VaryNode, VaryInput: req.VaryInput,
		Output: req.Output, Jobs: req.Jobs, TimeoutMS: peerJobTimeout.Milliseconds(),
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, peerJobTimeout+2*time.Minute) // start-up and connections too
	defer cancel()
	cmd := exec.CommandContext(ctx, p.node, filepath.Join(p.dir, "peer.mjs"))
	cmd.Dir = p.dir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("node peer.mjs: %v: %s", err, lastLines(stderr.String(), 5))
	}
	var out peerOutput
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &out); err != nil {
		return nil, fmt.Errorf("node peer.mjs: unreadable report %q: %v", lastLines(stdout.String(), 2), err)
	}
	return &bench.PeerReport{
		Elapsed:   time.Duration(out.ElapsedMS * float64(time.Millisecond)),
		Completed: out.Completed, Failed: out.Failed, Errors: out.Errors,
		CPU: time.Duration(out.CPUMS * float64(time.Millisecond)),
	}, nil
}

// lastLines returns the last n non-empty lines of s, joined by " | ".
func lastLines(s string, n int) string {
	var lines []string
	for l := range strings.SplitSeq(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}
