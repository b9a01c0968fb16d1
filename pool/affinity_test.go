package pool_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/comfypool/comfypool/comfy"
	"github.com/comfypool/comfypool/comfy/comfytest"
	"github.com/comfypool/comfypool/pool"
)

// Warm-affinity simulation: 4 workflow types (4 checkpoints) over 4
// backends that keep one model loaded (comfytest ModelSlots 1); a model
// load costs 20s, a run 2s. A mixed batch of 64 jobs (fixed seed).
const (
	simLoad  = 20 * time.Second
	simRun   = 2 * time.Second
	simJobs  = 64
	simTypes = 4
)

// simulate runs the batch under policy inside the current synctest bubble
// and returns its makespan on the bubble's fake clock.
func simulate(t *testing.T, policy pool.Policy) time.Duration {
	ckpts := make([]string, simTypes)
	for i := range ckpts {
		ckpts[i] = fmt.Sprintf("model_%d.safetensors", i)
	}
	nodes := comfytest.Builtins()
	ck := nodes["CheckpointLoaderSimple"]
	ck.Inputs = []comfytest.InputSpec{{Name: "ckpt_name", Type: "COMBO", Required: true, Options: ckpts}}
	ck.LoadDelay = simLoad
	sampler := nodes["FakeSampler"]
	sampler.Duration = simRun
	opts := &comfytest.Options{ModelSlots: 1, Nodes: map[string]comfytest.NodeBehavior{
		"CheckpointLoaderSimple": ck, "FakeSampler": sampler,
	}}
	b := setup(t, 4, opts, func(c *pool.Config) { c.Policy = policy })
	ctx := t.Context()
	synctest.Wait() // every backend connected
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	ids := make([]string, simJobs)
	for i := range ids {
		wf := strings.Replace(string(comfytest.WorkflowSampler), "fake_sd15.safetensors", ckpts[rng.IntN(simTypes)], 1)
		wf = strings.Replace(wf, `"seed":42`, `"seed":`+strconv.Itoa(i), 1)
		id, err := b.pool.Enqueue(ctx, mustWF(t, []byte(wf)), nil)
		require.NoError(t, err)
		ids[i] = id
	}
	for _, id := range ids {
		_, err := b.pool.Wait(ctx, id)
		require.NoError(t, err)
	}
	return time.Since(start)
}

// TestWarmAffinityBeatsRoundRobin checks, on fake time, that the default
// policy finishes the mixed batch much faster than round-robin. With
// COMFYPOOL_SIM_REPORT set it prints the makespans for
// BenchmarkWarmAffinity.
func TestWarmAffinityBeatsRoundRobin(t *testing.T) {
	t.Parallel()
	var warm, rr time.Duration
	synctest.Test(t, func(t *testing.T) { warm = simulate(t, nil) })
	synctest.Test(t, func(t *testing.T) { rr = simulate(t, &pool.RoundRobin{}) })
	t.Logf("makespan: warm affinity %v, round-robin %v", warm, rr)
	if os.Getenv("COMFYPOOL_SIM_REPORT") != "" {
		fmt.Printf("SIM default %f\nSIM roundrobin %f\n", warm.Seconds(), rr.Seconds())
	}
	// Lower bound for any policy: every job runs, every type loads once.
	assert.GreaterOrEqual(t, warm, simJobs*simRun/4)
	assert.Less(t, warm, rr*2/3, "the default policy must be measurably faster")
}

// BenchmarkWarmAffinity reports the simulated makespan (fake time, see
// TestWarmAffinityBeatsRoundRobin) of the 64-job mixed batch under the
// default policy and under RoundRobin. synctest bubbles need a *testing.T,
// so it runs that test in a child process of the test binary.
func BenchmarkWarmAffinity(b *testing.B) {
	var out []byte
	for b.Loop() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWarmAffinityBeatsRoundRobin$", "-test.count=1")
		cmd.Env = append(os.Environ(), "COMFYPOOL_SIM_REPORT=1")
		var err error
		if out, err = cmd.CombinedOutput(); err != nil {
			b.Fatalf("simulation: %v\n%s", err, out)
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var name string
		var secs float64
		if n, _ := fmt.Sscanf(sc.Text(), "SIM %s %f", &name, &secs); n == 2 {
			b.ReportMetric(secs, name+"-sim-s/batch")
		}
	}
}

// postTimes records when each POST /prompt leaves the client.
type postTimes struct {
	next http.RoundTripper
	mu   sync.Mutex
	at   []time.Time
}

func (p *postTimes) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/prompt") {
		p.mu.Lock()
		p.at = append(p.at, time.Now())
		p.mu.Unlock()
	}
	return p.next.RoundTrip(r)
}

// BenchmarkDispatchLatencyByTransport measures the time from a prompt's
// end on a backend (the server queuing its end marker) to the next prompt
// being sent to that backend: one backend, MaxInFlight 1, b.N zero-length
// jobs queued up front.
func BenchmarkDispatchLatencyByTransport(b *testing.B) {
	for _, mode := range []string{"inmemory", "loopback"} {
		b.Run(mode, func(b *testing.B) {
			var s *comfytest.Server
			if mode == "loopback" {
				s = comfytest.NewServer(nil)
			} else {
				s = comfytest.NewInMemoryServer(nil)
			}
			b.Cleanup(s.Close)
			quiet := slog.New(slog.DiscardHandler)
			hc := *s.Client()
			pt := &postTimes{next: hc.Transport}
			if pt.next == nil {
				pt.next = http.DefaultTransport
			}
			hc.Transport = pt
			p, err := pool.New(&pool.Config{Logger: quiet, Backends: []pool.BackendConfig{{
				Name: "gpu-0", URL: s.URL, Client: &comfy.ClientOptions{HTTPClient: &hc, Logger: quiet},
			}}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			defer func() { _ = p.Stop(ctx) }()
			done, unsub := p.Subscribe(pool.EventJobCompleted)
			defer unsub()
			n := b.N + 1
			wfs := make([]comfy.Workflow, n)
			for i := range wfs {
				wfs[i] = zeroWF(b, i)
			}
			b.ResetTimer()
			ids := make([]string, n)
			for i := range ids {
				if ids[i], err = p.Enqueue(ctx, wfs[i], nil); err != nil {
					b.Fatal(err)
				}
			}
			// Every job is queued before the Pool starts: a prompt never
			// waits for its own Enqueue.
			if err := p.Start(ctx); err != nil {
				b.Fatal(err)
			}
			for range n {
				<-done
			}
			b.StopTimer()
			pt.mu.Lock()
			defer pt.mu.Unlock()
			prompts := s.Prompts()
			if len(pt.at) != n || len(prompts) != n {
				b.Fatalf("%d prompts sent, %d received, for %d jobs", len(pt.at), len(prompts), n)
			}
			var total time.Duration
			for i := 0; i+1 < n; i++ {
				total += pt.at[i+1].Sub(prompts[i].Ended)
			}
			b.ReportMetric(float64(total.Microseconds())/float64(n-1), "µs/dispatch")
		})
	}
}
