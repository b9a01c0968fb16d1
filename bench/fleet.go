package bench

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/comfypool/comfypool/comfy/comfytest"
)

// Fleet is a set of fake ComfyUI servers (comfytest) on loopback sockets,
// the backends of a scenario, which every side of it (the pool, a bare
// client loop, a peer in another process) drives in turn. Its servers'
// records say what each side did: the prompts they accepted and the time
// from each prompt's end to the next POST /prompt on the same server.
// A Fleet is safe for concurrent use.
type Fleet struct {
	// Servers are the fake servers, in order; server i is backend
	// BackendName(i).
	Servers []*comfytest.Server
}

// NewFleet starts n fake servers on loopback, each with opts (nil:
// defaults; its Listener must be nil). Close stops them.
func NewFleet(n int, opts *comfytest.Options) *Fleet {
	f := &Fleet{Servers: make([]*comfytest.Server, n)}
	for i := range f.Servers {
		f.Servers[i] = comfytest.NewServer(opts)
	}
	return f
}

// URLs returns the servers' base URLs, in order.
func (f *Fleet) URLs() []string {
	urls := make([]string, len(f.Servers))
	for i, s := range f.Servers {
		urls[i] = s.URL
	}
	return urls
}

// Close stops every server.
func (f *Fleet) Close() {
	for _, s := range f.Servers {
		s.Close()
	}
}

// window returns the number of prompts the servers accepted at or after
// since, and, per server, the time from the end of each of them to the
// next one's arrival (see Side.Gaps).
func (f *Fleet) window(since time.Time) (accepted int, gaps []time.Duration) {
	for _, s := range f.Servers {
		var ps []comfytest.ReceivedPrompt
		for _, p := range s.Prompts() {
			if p.Status == http.StatusOK && !p.Received.Before(since) {
				ps = append(ps, p)
			}
		}
		slices.SortFunc(ps, func(a, b comfytest.ReceivedPrompt) int { return a.Received.Compare(b.Received) })
		accepted += len(ps)
		for k := 1; k < len(ps); k++ {
			if end := ps[k-1].Ended; !end.IsZero() && !ps[k].Received.Before(end) {
				gaps = append(gaps, ps[k].Received.Sub(end))
			}
		}
	}
	return accepted, gaps
}

// Side is what one side of a scenario (the pool, a bare comfy.Client
// loop, a peer library) did in one run.
type Side struct {
	// Name says which side and how it was driven.
	Name string
	// Jobs is the number of jobs it was given; Completed and Failed how
	// they ended (a side that gave up on some reports fewer).
	Jobs, Completed, Failed int
	// Retries counts the attempts that failed and were tried again (the
	// pool's job:retrying events; 0 for sides that do not retry).
	Retries int
	// Elapsed is the time from its first job submitted (or the queue
	// resumed) to its last job ended, as the side measured it.
	Elapsed time.Duration
	// Prompts is the number of prompts the servers accepted during the
	// run: Jobs, plus one per retry.
	Prompts int
	// Gaps is, per server, the time from a prompt's end on the server
	// (its end marker queued to the socket) to the server receiving the
	// next POST /prompt: the side's dispatch latency, both transits
	// included, measured the same way whichever side ran.
	Gaps Latency
	// CPU is the CPU time the run cost (user and system, GC included):
	// this process's for the pool and the bare loop, the fake servers'
	// included; for a peer, its own process's plus this one's (the
	// servers'). Zero where it cannot be read.
	CPU time.Duration
	// Errors holds the first few errors of failed jobs or attempts.
	Errors []string
}

// CPUPerJob is CPU over the jobs that completed.
func (s *Side) CPUPerJob() time.Duration {
	return s.CPU / time.Duration(max(s.Completed, 1))
}

// JobsPerSecond is the side's throughput: completed jobs over Elapsed.
func (s *Side) JobsPerSecond() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Completed) / s.Elapsed.Seconds()
}

// CompletedShare is the share of its jobs that completed, between 0 and 1.
func (s *Side) CompletedShare() float64 {
	return float64(s.Completed) / float64(cmp.Or(s.Jobs, 1))
}

// observe fills s's server-side figures from f's records since start.
func (s *Side) observe(f *Fleet, start time.Time) {
	var gaps []time.Duration
	s.Prompts, gaps = f.window(start)
	s.Gaps = Summarize(gaps)
}

// addError keeps the first few errors.
func (s *Side) addError(err string) {
	if len(s.Errors) < 5 {
		s.Errors = append(s.Errors, err)
	}
}
