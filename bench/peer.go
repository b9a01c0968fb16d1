package bench

import (
	"context"
	"time"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/internal/usage"
)

// Peer is another library's pool, driven against the fake servers of a
// scenario for a side-by-side comparison (comfypool bench drives
// @saintno/comfyui-sdk's ComfyPool in a Node.js process). The scenarios
// that can run a peer take one in their config and run it on the same
// servers as the pool, after it, with the same jobs.
type Peer interface {
	// Name says which library and version, and how it is driven.
	Name() string
	// Run runs req.Jobs jobs over req.URLs and reports how they ended.
	// An error means the peer could not run them at all; jobs that
	// failed are reported, not returned as an error.
	Run(ctx context.Context, req *PeerRequest) (*PeerReport, error)
}

// PeerRequest is the work a Peer is given: Jobs prompts of Workflow, job i
// with its Vary input set to i (so that no two are the same prompt and
// none runs from the server's cache), each submitted through the peer's
// pool to one of URLs and waited for until it ended.
type PeerRequest struct {
	URLs     []string
	Workflow comfy.Workflow
	// VaryNode and VaryInput name the input set to the job's index.
	VaryNode, VaryInput string
	// Output is the id of the workflow's output node (SaveImage).
	Output string
	Jobs   int
}

// PeerReport is what a Peer measured.
type PeerReport struct {
	// Elapsed is from its first job submitted to its last ended (the
	// peer's start-up, connections included, is not counted).
	Elapsed time.Duration
	// Completed and Failed count how the jobs ended.
	Completed, Failed int
	// CPU is the CPU time the peer's process used meanwhile (zero if
	// unknown).
	CPU time.Duration
	// Errors holds the first few errors of failed jobs.
	Errors []string
}

// runPeer runs req on p over f and returns the Side it made, named by the
// peer, with the servers' figures.
func runPeer(ctx context.Context, p Peer, f *Fleet, req *PeerRequest) (*Side, error) {
	req.URLs = f.URLs()
	start, u := time.Now(), usage.Read()
	r, err := p.Run(ctx, req)
	if err != nil {
		return nil, err
	}
	s := &Side{Name: p.Name(), Jobs: req.Jobs, Completed: r.Completed, Failed: r.Failed, Elapsed: r.Elapsed, Errors: r.Errors}
	// The servers' share: this process's CPU while the peer ran (its
	// start-up included, when the servers idle).
	s.CPU = r.CPU + usage.Read().Sub(u).CPU
	s.observe(f, start)
	return s, nil
}
