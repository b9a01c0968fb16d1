package comfytest

import "math"

// failShare is the state of FailPrompts, guarded by Server.mu.
type failShare struct {
	perMillion int64    // the share of prompts that fail, in millionths
	ran        int64    // prompts counted since FailPrompts
	failure    *Failure // nil: out of memory
}

// outOfMemory is the failure FailPrompts reports by default, as a GPU server
// that ran out of memory does.
var outOfMemory = Failure{
	ExceptionType:    "torch.OutOfMemoryError",
	ExceptionMessage: "Allocation on device ",
	Traceback: []string{
		"  File \"<comfyui>/execution.py\", line 496, in execute\n    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all)\n",
	},
}

// FailPrompts makes a share of the prompts the server runs fail at run time,
// spread evenly over them: with 0.25 the 4th, 8th, 12th ... prompt fails,
// with 0.1 every tenth. A failing prompt fails at the first of its nodes that
// is not cached, once that node has run (its Duration, progress and
// previews), with an execution_error reporting f, or, when f is nil, an
// out-of-memory error (exception_type "torch.OutOfMemoryError", as a GPU
// server reports one: a fault of the server, which a pool retries on
// another). A prompt whose nodes are all cached runs none and is not
// counted. share <= 0 turns it off; share >= 1 fails every prompt. Each call
// starts the count afresh; Restart keeps it. f is copied.
func (s *Server) FailPrompts(share float64, f *Failure) {
	fs := failShare{perMillion: int64(math.Round(min(max(share, 0), 1) * 1e6))}
	if f != nil {
		c := *f
		c.Traceback = append([]string(nil), f.Traceback...)
		fs.failure = &c
	}
	s.mu.Lock()
	s.failing = fs
	s.mu.Unlock()
}

// nextFailureLocked counts one more prompt that runs a node and returns the
// failure it must end with, or nil. Caller holds s.mu.
func (s *Server) nextFailureLocked() *Failure {
	fs := &s.failing
	if fs.perMillion == 0 {
		return nil
	}
	fs.ran++
	if fs.ran*fs.perMillion/1e6 == (fs.ran-1)*fs.perMillion/1e6 {
		return nil
	}
	if fs.failure != nil {
		return fs.failure
	}
	return &outOfMemory
}
